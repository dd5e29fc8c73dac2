"""Stdlib HTTP server speaking SGLang's protocol subset in front of a :class:`ReferenceEngine`.

Endpoints, error answers and the slow-client limits: its section of ``docs/reference-server.md#the-http-protocol``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING
from typing import Any
from urllib.parse import parse_qs
from urllib.parse import urlparse

from .protocol import ProtocolError
from .protocol import parse_generate
from .protocol import result_json
from .slots import HEALTH_ONLY
from .slots import HEALTH_PATHS
from .slots import Slots

# torch-free at import: the command line reads the defaults below before loading torch
if TYPE_CHECKING:
    from .engine import ReferenceEngine

log = logging.getLogger("pytest_specenergy.refserver")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_BODY_BYTES = 64 << 20
DEFAULT_HTTP_TIMEOUT_S = 30.0
# Reading a request takes milliseconds on loopback; 10 s is twice uvicorn's keep-alive timeout (in
# front of SGLang), so clients written for SGLang already reconnect after an idle close.
DEFAULT_REQUEST_TIMEOUT_S = 10.0
# Four times the largest batch the suites declare (64, one connection per request in flight).
DEFAULT_MAX_CONNECTIONS = 256


class HTTPError(Exception):
    """An answer other than 200, with its status; ``close``: the connection cannot serve another
    request (an unread body would be parsed as the next one)."""

    def __init__(self, status: int, message: str, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


class RequestTimeout(Exception):
    """A request was not read in time; the message names the limit (an ``OSError`` would read as
    the client going away, and the stdlib drops a ``TimeoutError`` without an answer)."""


class _DeadlineReader(io.RawIOBase):
    """A connection's read side: each receive waits at most until the current request's deadline."""

    def __init__(self, sock: socket.socket, idle_timeout: float, request_timeout: float) -> None:
        super().__init__()
        self.sock = sock
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.deadline = float("inf")
        self.received = 0  # bytes of the current request
        self.waiting_since = time.monotonic()  # when it started waiting for the current request

    def start_request(self) -> None:
        """The server starts waiting for the next request: its time starts now."""
        self.waiting_since = time.monotonic()
        self.deadline = self.waiting_since + self.request_timeout
        self.received = 0

    def readable(self) -> bool:
        """Always: this is the read side."""
        return True

    def readinto(self, buffer: Any) -> int:
        """One receive, bounded by the socket timeout and the request's deadline."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RequestTimeout(self._late())
        self.sock.settimeout(min(self.idle_timeout, left))
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            idle = f"no data for --http-timeout {self.idle_timeout:g} s"
            raise RequestTimeout(
                self._late() if time.monotonic() >= self.deadline else idle
            ) from None
        finally:
            self.sock.settimeout(self.idle_timeout)  # writes keep the plain socket timeout
        self.received += n
        return n

    def _late(self) -> str:
        # formatted only when raised: readinto runs for every receive
        return f"the request was not read within --request-timeout {self.request_timeout:g} s"


class _Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request to the engine."""

    server: ReferenceHTTPServer
    protocol_version = "HTTP/1.1"

    # --------------------------------------------------------------------------- plumbing
    def setup(self) -> None:
        """Apply the server's socket timeout, and read through a deadline-bounded reader."""
        self.timeout = self.server.http_timeout
        super().setup()
        self.rfile.close()  # the stdlib's own reader: its file object only, not the socket
        self.reader = _DeadlineReader(
            self.connection, self.server.http_timeout, self.server.request_timeout
        )
        self.rfile = io.BufferedReader(self.reader)
        # None: closed as idle before this thread started (its first read sees the end).
        self.health_only = self.server.slots.attach(self.connection, self.reader) == HEALTH_ONLY

    def handle_one_request(self) -> None:
        """One request, read within the deadline; 408 and close when it was not."""
        self.reader.start_request()
        self.requestline, self.request_version, self.command = "", self.protocol_version, ""
        try:
            super().handle_one_request()
        except RequestTimeout as exc:
            self.close_connection = True
            if self.reader.received:  # part of a request came: it gets an answer
                self.send_error(408, str(exc))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s - %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own errors (bad request line, unknown method, ...) as JSON too."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self._error(code, message or explain or "bad request")

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = (json.dumps(payload) if content_type == "application/json" else str(payload)).encode(
            "utf-8"
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        log.info("HTTP %d: %s", status, message)
        self._send(status, {"error": {"message": message}})

    def _body(self) -> Any:
        """The JSON body (``{}`` when there is none); :class:`HTTPError` for anything unreadable."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise HTTPError(
                411, "chunked request bodies are not supported; send a Content-Length", close=True
            )
        raw_len = self.headers.get("Content-Length") or "0"
        try:
            length = int(raw_len)
        except ValueError:
            raise HTTPError(
                400, f"Content-Length must be an integer, got {raw_len!r}", close=True
            ) from None
        if length < 0:
            raise HTTPError(400, f"Content-Length must be >= 0, got {length}", close=True)
        if length > MAX_BODY_BYTES:
            raise HTTPError(
                413, f"request body of {length} bytes is larger than {MAX_BODY_BYTES}", close=True
            )
        raw = bytearray()
        why = "the client closed the connection"
        try:  # read1 in a loop, so a timeout keeps what did arrive (for the message)
            while len(raw) < length:
                chunk = self.rfile.read1(min(1 << 16, length - len(raw)))
                if not chunk:
                    break
                raw += chunk
        except RequestTimeout as exc:
            why = str(exc)
        if len(raw) < length:
            raise HTTPError(
                408,
                f"the body ended after {len(raw)} of {length} bytes (Content-Length): {why}",
                close=True,
            )
        if not raw.strip():
            return {}
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HTTPError(400, f"the body is not valid JSON: {exc}") from None
        except RecursionError:  # valid JSON nested past the decoder's depth: the client's doing
            raise HTTPError(
                400,
                "the body is JSON nested too deeply to decode; a request is a flat "
                "object of fields (see /generate)",
            ) from None

    def _guard(self, fn: Any) -> None:
        if self.health_only:  # a reserve slot: one health check, then the connection is closed
            self.close_connection = True
            if self.command != "GET" or urlparse(self.path).path not in HEALTH_PATHS:
                self._error(
                    503,
                    f"every one of --max-connections {self.server.max_connections} connections "
                    f"is busy with a request; this one was kept for GET {', '.join(HEALTH_PATHS)}",
                )
                return
        try:
            fn()
        except HTTPError as exc:
            self.close_connection |= exc.close
            self._error(exc.status, str(exc))
        except (
            ProtocolError,
            ValueError,
        ) as exc:  # engine-side validation: vocabulary, context, ...
            self._error(400, str(exc))
        except OSError as exc:  # the client went away: nobody to answer
            log.info("connection error: %s", exc)
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a server must answer, and log the traceback
            log.exception("internal error")
            self._error(500, f"{type(exc).__name__}: {exc}")

    # ----------------------------------------------------------------------------- routes
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        """Read-only endpoints."""
        self._guard(self._route_get)

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        """Endpoints that take a body."""
        self._guard(self._route_post)

    do_PUT = do_POST

    def _not_allowed(self) -> None:
        self._guard(self._method_not_allowed)

    do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _method_not_allowed(self) -> None:
        self._body()  # consume it, so the connection stays usable
        raise HTTPError(405, f"method {self.command} is not supported by the reference server")

    def _route_get(self) -> None:
        url = urlparse(self.path)
        engine = self.server.engine
        if url.path in ("/health", "/ready"):
            self._send(200, "OK", "text/plain")
        elif url.path == "/health_generate":
            self._health_generate()
        elif url.path in ("/server_info", "/get_server_info"):
            self._send(200, engine.server_info())
        elif url.path in ("/model_info", "/get_model_info"):
            model = engine.config.model
            self._send(200, {"model_path": model, "tokenizer_path": model, "is_generation": True})
        elif url.path == "/work_trace":
            self._work_trace(url.query)
        elif url.path == "/flush_cache":
            self._flush()
        else:
            raise HTTPError(404, f"unknown endpoint GET {url.path}")

    def _route_post(self) -> None:
        path = urlparse(self.path).path
        if path == "/generate":
            self._generate()
        elif path == "/flush_cache":
            body = self._body()
            if not isinstance(body, dict) or body:
                raise HTTPError(
                    400,
                    f"/flush_cache takes no parameters; send an empty body or {{}}, got {body!r}",
                )
            self._flush()
        elif path == "/abort_request":
            self._abort(self._body())
        elif path == "/set_internal_state":
            self._set_internal_state(self._body())
        else:
            self._body()
            raise HTTPError(404, f"unknown endpoint POST {path}")

    def _abort(self, body: Any) -> None:
        # SGLang's AbortReq: {"rid": "...", "abort_all": false}; an unknown rid is not an error.
        if not isinstance(body, dict) or set(body) - {"rid", "abort_all"}:
            raise HTTPError(
                400, f'/abort_request takes {{"rid": str}} or {{"abort_all": true}}, got {body!r}'
            )
        rid, everything = body.get("rid"), body.get("abort_all", False)
        if not isinstance(everything, bool) or (rid is not None and not isinstance(rid, str)):
            raise HTTPError(
                400, f"/abort_request: rid must be a string and abort_all a boolean, got {body!r}"
            )
        if not (everything or rid):
            raise HTTPError(400, '/abort_request needs a "rid" or "abort_all": true')
        self.server.engine.abort(None if everything else rid)
        self._send(200, "", "text/plain")

    def _set_internal_state(self, body: Any) -> None:
        # SGLang's endpoint for runtime values; the reference server takes the admission cap only.
        if not isinstance(body, dict) or set(body) != {"max_running_requests"}:
            raise HTTPError(
                400, f'/set_internal_state takes {{"max_running_requests": int}}, got {body!r}'
            )
        try:
            self.server.engine.set_admission_cap(body["max_running_requests"])
        except ValueError as exc:
            raise HTTPError(400, f"/set_internal_state: {exc}") from None
        self._send(200, {"updated": True, "max_running_requests": body["max_running_requests"]})

    def _generate(self) -> None:
        engine = self.server.engine
        parsed = parse_generate(self._body(), engine.tokenizer)
        t0 = time.perf_counter()
        results = engine.generate(parsed.requests)
        answers = [
            result_json(
                r, engine.tokenizer, parsed.return_prompt_token_ids, parsed.return_text_in_logprobs
            )
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
            {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}},
            self.server.engine.tokenizer,
        )
        self.server.engine.generate(parsed.requests)
        self._send(200, "OK", "text/plain")

    def _work_trace(self, query: str) -> None:
        raw = parse_qs(query).get("start", ["0"])[0]
        try:
            start = int(raw)
        except ValueError:
            raise ProtocolError(f"start must be an integer step index, got {raw!r}") from None
        if start < 0:
            raise ProtocolError(f"start must be >= 0, got {start}")
        nxt, steps = self.server.engine.trace.read(start)
        self._send(200, {"next": nxt, "steps": [s.to_json() for s in steps]})

    def _flush(self) -> None:
        # SGLang flushes only when idle
        if not self.server.engine.flush_cache():
            raise HTTPError(
                400, "Cache not flushed because there are running requests; retry when idle."
            )
        self._send(200, "Cache flushed.", "text/plain")


class ReferenceHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server that holds the engine."""

    daemon_threads = True
    allow_reuse_address = True
    # The listen backlog: the stdlib's 5 reset connections when a client opens one per request
    # for a batch of 16-64 at once (uvicorn, in front of SGLang, keeps 2048).
    request_queue_size = 1024

    def __init__(
        self,
        engine: ReferenceEngine,
        host: str = "127.0.0.1",
        port: int = 30000,
        http_timeout: float = DEFAULT_HTTP_TIMEOUT_S,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(
                "the reference server binds loopback only; --host must be one of "
                f"{LOOPBACK_HOSTS}, got {host!r}"
            )
        for flag, value in (
            ("--http-timeout", http_timeout),
            ("--request-timeout", request_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{flag} must be > 0 seconds, got {value}")
        if max_connections < 1:
            raise ValueError(f"--max-connections must be >= 1, got {max_connections}")
        if host == "::1":
            self.address_family = socket.AF_INET6
        self.engine = engine
        self.http_timeout = float(http_timeout)
        self.request_timeout = float(request_timeout)
        self.max_connections = max_connections
        #: ``max_connections`` served, idle ones closed to make room, a reserve for health checks.
        self.slots = Slots(max_connections)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own, or refuse it when every slot, the health
        checks' reserve included, is busy with a request."""
        if self.slots.admit(request) is None:
            self._refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release(request)  # no thread started: nobody else gives the slot back
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """The connection's thread (the stdlib's, but for the slot): its slot is free again before
        its client sees the connection close, so a client that reconnects at once finds it free."""
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - the stdlib's own handling: log it, close the connection
            self.handle_error(request, client_address)
        finally:
            self.slots.release(request)
            self.shutdown_request(request)

    def _refuse(self, request: socket.socket) -> None:
        message = f"the server is serving --max-connections {self.max_connections} connections"
        body = json.dumps({"error": {"message": message}}).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        log.warning(
            "refused a connection: %d are being served (--max-connections)", self.max_connections
        )
        # non-blocking: the accepting thread must never wait on a client
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(head.encode() + body)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` as bound (the real port when 0 was asked for)."""
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"
