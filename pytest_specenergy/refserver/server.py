"""Stdlib HTTP server speaking SGLang's protocol subset in front of a :class:`ReferenceEngine`.

Endpoints: ``POST/PUT /generate``, ``GET /server_info`` (and the older ``/get_server_info``),
``GET/POST /flush_cache``, ``GET /health``, ``GET /health_generate``, ``GET /ready``,
``GET /model_info`` and our extension ``GET /work_trace?start=K``. Requests are handled on threads;
engine work is serialized by the engine's lock, so a second ``/generate`` waits for the first, and
``/flush_cache`` answers 400 while a batch is running (as SGLang does when it is not idle).
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from .engine import ReferenceEngine
from .protocol import ProtocolError, parse_generate, result_json

log = logging.getLogger("pytest_specenergy.refserver")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 64 << 20


class _Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request to the engine."""

    server: ReferenceHTTPServer
    protocol_version = "HTTP/1.1"

    # --------------------------------------------------------------------------- plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        if content_type == "application/json":
            data = json.dumps(payload).encode("utf-8")
        else:
            data = str(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        log.info("HTTP %d: %s", status, message)
        self._send(status, {"error": {"message": message}})

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise ProtocolError(f"request body of {length} bytes is larger than {MAX_BODY_BYTES}")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProtocolError(f"the body is not valid JSON: {exc}") from None

    # ----------------------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        """Read-only endpoints."""
        url = urlparse(self.path)
        engine = self.server.engine
        if url.path in ("/health", "/ready"):
            self._send(200, "OK", "text/plain")
        elif url.path == "/health_generate":
            self._guard(lambda: self._health_generate())
        elif url.path in ("/server_info", "/get_server_info"):
            self._send(200, engine.server_info())
        elif url.path in ("/model_info", "/get_model_info"):
            self._send(
                200, {"model_path": engine.config.model, "tokenizer_path": engine.config.model, "is_generation": True}
            )
        elif url.path == "/work_trace":
            self._guard(lambda: self._work_trace(url.query))
        elif url.path == "/flush_cache":
            self._flush()
        else:
            self._error(404, f"unknown endpoint GET {url.path}")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        """Endpoints that take a body."""
        path = urlparse(self.path).path
        if path == "/generate":
            self._guard(self._generate)
        elif path == "/flush_cache":
            self._body()
            self._flush()
        else:
            self._error(404, f"unknown endpoint POST {path}")

    do_PUT = do_POST

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except ProtocolError as exc:
            self._error(400, str(exc))
        except ValueError as exc:  # engine-side validation (vocabulary, context length, ...)
            self._error(400, str(exc))
        except Exception as exc:  # noqa: BLE001 - a server must answer, and log the traceback
            log.exception("internal error")
            self._error(500, f"{type(exc).__name__}: {exc}")

    def _generate(self) -> None:
        engine = self.server.engine
        parsed = parse_generate(self._body(), engine.tokenizer)
        t0 = time.perf_counter()
        results = engine.generate(parsed.requests)
        answers = [
            result_json(r, engine.tokenizer, parsed.return_prompt_token_ids, parsed.return_text_in_logprobs)
            for r in results
        ]
        log.info(
            "generate: %d request(s), %d output tokens in %.3f s",
            len(results),
            sum(r.completion_tokens for r in results),
            time.perf_counter() - t0,
        )
        self._send(200, answers if parsed.batched else answers[0])

    def _health_generate(self) -> None:
        parsed = parse_generate(
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}, self.server.engine.tokenizer
        )
        self.server.engine.generate(parsed.requests)
        self._send(200, "OK", "text/plain")

    def _work_trace(self, query: str) -> None:
        params = parse_qs(query)
        raw = params.get("start", ["0"])[0]
        try:
            start = int(raw)
        except ValueError:
            raise ProtocolError(f"start must be an integer step index, got {raw!r}") from None
        if start < 0:
            raise ProtocolError(f"start must be >= 0, got {start}")
        nxt, steps = self.server.engine.trace.read(start)
        self._send(200, {"next": nxt, "steps": [s.to_json() for s in steps]})

    def _flush(self) -> None:
        engine = self.server.engine
        # SGLang flushes only when idle; a running batch holds the engine lock.
        if not engine.lock.acquire(timeout=0.5):
            self._error(400, "Cache not flushed because there are running requests; retry when idle.")
            return
        engine.lock.release()
        engine.flush_cache()
        self._send(200, "Cache flushed.", "text/plain")


class ReferenceHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that holds the engine."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, engine: ReferenceEngine, host: str = "127.0.0.1", port: int = 30000) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"the reference server binds loopback only; --host must be one of {LOOPBACK_HOSTS}, got {host!r}"
            )
        if host == "::1":
            import socket

            self.address_family = socket.AF_INET6
        self.engine = engine
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` as bound (the real port when 0 was asked for)."""
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"
