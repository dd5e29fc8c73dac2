"""Built-in real checkpoints seen from the plugin: a name such as ``smollm2-135m`` stands for a
directory in the model cache.

The plugin never imports the reference server's fetching code (it imports torch and transformers):
when the directory is missing it runs ``python -m pytest_specenergy.refserver.fetch NAME`` in a child
process, before any engine starts, so the fetch is never cut short by an engine's start-up timeout.
The fetch itself is atomic and locked (two xdist workers asking at once convert once)."""

from __future__ import annotations

import subprocess
import sys

from pytest_specenergy.refserver.catalog import CHECKPOINTS
from pytest_specenergy.refserver.catalog import checkpoint_dir
from pytest_specenergy.refserver.catalog import fetch_command
from pytest_specenergy.refserver.catalog import is_builtin_checkpoint
from pytest_specenergy.refserver.catalog import is_ready

#: The built-in checkpoints' names (``model("smollm2-135m")``).
BUILTIN_CHECKPOINTS = tuple(CHECKPOINTS)


class CheckpointFetchError(RuntimeError):
    """A built-in checkpoint could not be fetched; the message has the fetch's own error."""


def local_path(model: str) -> str:
    """The directory a built-in checkpoint name stands for (whether fetched or not), else
    ``model`` unchanged."""
    return str(checkpoint_dir(model)) if is_builtin_checkpoint(model) else model


def ensure_fetched(model: str, python: str | None = None) -> str:
    """:func:`local_path`, fetching a built-in checkpoint first when the cache lacks it (a no-op,
    one ``stat``, when it has it). ``python``: the interpreter to fetch with (this one by
    default; it needs the ``reference`` extra)."""
    if not is_builtin_checkpoint(model) or is_ready(model):
        return local_path(model)
    argv = [python or sys.executable, "-m", "pytest_specenergy.refserver.fetch", model]
    print(f"specenergy: fetching {model} into {checkpoint_dir(model).parent}", file=sys.stderr)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not is_ready(model):
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise CheckpointFetchError(
            f"the built-in model {model} is not in the cache ({checkpoint_dir(model)}) and "
            f"fetching it failed (exit {done.returncode}):\n{tail}\n"
            f"Run `{fetch_command(model)}` to see the whole output."
        )
    return local_path(model)
