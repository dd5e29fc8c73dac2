"""How long a reference engine takes to start: forked from the zygote, and as a fresh interpreter.

Each start is what the pool does for one engine config: ``ServerProcess(...).start()`` (launch,
``/health``, the identity check), timed to the return, then stopped before the next. The first
forked start also starts the zygote (its imports and the model's first build); the later ones are
what every further engine of a session pays. The two ways alternate, so load drift on a shared
machine falls on both.

Usage: .venv/bin/python benchmarks/engine_start.py [--starts 8] [--plain 3] [--model tiny:dense]

Prints the zygote's own start, then per way the median and best of the starts (seconds). A CPU
figure of this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class Timing:
    """The start times of one way of starting an engine (seconds)."""

    way: str
    starts: tuple[float, ...]

    def row(self) -> str:
        """One table line: the way, how many starts, median and best."""
        return (
            f"{self.way:28} {len(self.starts):6d} {statistics.median(self.starts):9.3f} "
            f"{min(self.starts):9.3f}"
        )


def _one_start(model: str, logs: Path, plain: bool) -> float:
    """Start and stop one engine; the seconds its start took."""
    from pytest_specenergy.engines import zygote
    from pytest_specenergy.engines.config import EngineConfig
    from pytest_specenergy.engines.launch import ServerProcess
    from pytest_specenergy.engines.refserver import ReferenceBackend

    if plain:
        os.environ[zygote.SWITCH] = "0"
    else:
        os.environ.pop(zygote.SWITCH, None)
    config = EngineConfig(engine="reference", model=model, device="cpu")
    began = time.monotonic()
    server = ServerProcess(config, ReferenceBackend(), logs).start()
    took = time.monotonic() - began
    server.stop(grace_s=5.0)
    return took


def measure(model: str, starts: int, plain: int) -> tuple[float, list[Timing]]:
    """The first forked start (the zygote's too), then ``starts`` forked and ``plain`` fresh
    interpreter starts, interleaved."""
    logs = Path(tempfile.mkdtemp(prefix="engine_start-"))
    os.environ.pop("SPECENERGY_ZYGOTE_SOCKET", None)  # a zygote of this process's own
    first = _one_start(model, logs, plain=False)
    forked: list[float] = []
    fresh: list[float] = []
    for i in range(max(starts, plain)):
        if i < starts:
            forked.append(_one_start(model, logs, plain=False))
        if i < plain:
            fresh.append(_one_start(model, logs, plain=True))
    timings = [Timing("forked from the zygote", tuple(forked))]
    if fresh:
        timings.append(Timing("fresh interpreter", tuple(fresh)))
    return first, timings


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8, help="forked starts after the first")
    parser.add_argument("--plain", type=int, default=3, help="fresh-interpreter starts")
    parser.add_argument("--model", default="tiny:dense")
    args = parser.parse_args(argv)
    first, timings = measure(args.model, args.starts, args.plain)
    print(f"first forked start (zygote start and model build included): {first:.3f} s")
    print(f"{'way':28} {'starts':>6} {'median s':>9} {'best s':>9}")
    for timing in timings:
        print(timing.row())
    return 0


if __name__ == "__main__":
    sys.exit(main())
