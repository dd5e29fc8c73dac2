"""pytest-specenergy (placeholder docstring; replaced by the package owner)."""
