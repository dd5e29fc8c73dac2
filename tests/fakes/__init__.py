"""Test doubles for what cannot run on CI machines (NVML); imported explicitly by tests."""
