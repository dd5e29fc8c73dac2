"""``python -m pytest_specenergy.refserver``: start the reference server.

Example::

    python -m pytest_specenergy.refserver --model tiny:dense --drafter ngram --num-draft-tokens 4 --port 0

Prints ``reference server ready on http://HOST:PORT`` (to stderr) once it accepts requests.
Bad arguments (unknown fault, missing model directory, ...) exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from .faults import FAULTS
from .records import DEVICES, DRAFTERS, DTYPES, EngineConfig


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(
        prog="python -m pytest_specenergy.refserver",
        description="Reference inference server (HF transformers) speaking SGLang's /generate protocol subset.",
    )
    p.add_argument(
        "--model", "--model-path", dest="model", default="tiny:dense", help="tiny:* name or local checkpoint dir"
    )
    p.add_argument("--drafter", choices=DRAFTERS, default="none")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="K: drafted tokens per step (target verifies K+1)")
    p.add_argument("--ngram-min-match-window", type=int, default=1)
    p.add_argument("--ngram-max-match-window", type=int, default=12)
    p.add_argument("--draft-model", default=None, help="draft model name or path (default: the tiny model's -draft)")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--device", default="auto", help=f"one of {DEVICES} or cuda:N")
    p.add_argument("--seed", "--random-seed", dest="seed", type=int, default=0)
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="inject a named bug (repeatable): " + ", ".join(sorted(FAULTS)),
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (0 = torch's default); 1 avoids OpenMP spin contention when "
        "several engines share a few cores",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, build the engine, serve until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = EngineConfig(
            model=args.model,
            drafter=args.drafter,
            num_draft_tokens=args.num_draft_tokens,
            ngram_min_match_window=args.ngram_min_match_window,
            ngram_max_match_window=args.ngram_max_match_window,
            draft_model=args.draft_model,
            dtype=args.dtype,
            device=args.device,
            seed=args.seed,
            max_running_requests=args.max_running_requests,
            faults=tuple(args.fault),
        )
    except ValueError as exc:
        parser.error(str(exc))
    # Heavy imports only after the arguments are known to be good: a bad flag fails in milliseconds.
    from .engine import ReferenceEngine
    from .server import ReferenceHTTPServer

    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)

    try:
        engine = ReferenceEngine(config)
        server = ReferenceHTTPServer(engine, args.host, args.port)
        engine.warmup()
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2

    def _stop(signum: int, frame: object) -> None:
        # shutdown() blocks until serve_forever returns, so it must run off the serving thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    logging.getLogger("pytest_specenergy.refserver").info(
        "engine: model=%s drafter=%s K=%d dtype=%s device=%s faults=%s",
        config.model,
        config.drafter,
        config.num_draft_tokens,
        engine.target.dtype,
        engine.target.device,
        list(config.faults),
    )
    print(f"reference server ready on {server.url}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
