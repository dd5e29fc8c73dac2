"""The one client path: SGLang's HTTP protocol subset, spoken by every engine: ``POST /generate``,
``GET /server_info``, ``POST /flush_cache``, ``GET /health``, plus the reference server's ``GET
/work_trace`` cursor. Stdlib only, so the plugin needs no HTTP dependency; errors carry the server's
message."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any
from typing import Callable
from typing import Protocol
from typing import Sequence

#: Seconds one request may take unless the caller sets another (``--specenergy-request-timeout``).
#: Long enough for a 6000-token generation on a CPU reference server; far below the old 900 s.
DEFAULT_REQUEST_TIMEOUT_S = 300.0


class EngineHTTPError(RuntimeError):
    """An engine answered with an error, or did not answer."""


class EngineError(EngineHTTPError):
    """An engine died or hung mid-request; the message has its exit code or the timeout, and the
    tail of its log."""


class AbortError(EngineHTTPError):
    """A window's close could not cut every request still in flight."""


#: ``diagnose(what, exc, timed_out)``: a fuller message for a request that got no answer
#: (the launcher's: exit code, timeout, log tail), or None to keep the plain one.
Diagnose = Callable[[str, BaseException, bool], "str | None"]


#: Seconds between two rounds of per-rid aborts at a window's close. Shorter than one decode step of
#: any engine here (about 40 ms on a CPU SGLang server), so a request the first round missed runs at
#: most a step or two more; each round is one small HTTP call per request.
ABORT_RETRY_S = 0.02


class Aborts(Protocol):
    """What :func:`abort_until_answered` needs of a client (:class:`EngineClient` has it)."""

    #: The request timeout: the default deadline for the aborts to be answered.
    timeout_s: float

    def abort(self, rid: str | None = None) -> None:
        """SGLang's ``/abort_request``: one request, or every one (``rid=None``)."""


def abort_until_answered(
    client: Aborts,
    pending: Callable[[], set[str]],
    *,
    retry_s: float = ABORT_RETRY_S,
    deadline_s: float | None = None,
) -> int:
    """End a steady-state window: every request sent and not answered yet (``pending()``; the
    caller removes a rid when its answer arrives) is cut, and this returns once each has answered.

    One ``abort_all`` first: it cuts at once whatever the engine already schedules, running or
    queued. It is not enough alone: SGLang's tokenizer drops an abort for a rid it has not
    registered yet, so a request sent within about a millisecond of the close would run on to
    ``max_new_tokens``. So every rid still pending is then aborted by rid, every ``retry_s``, until
    each has answered (aborted, or finished on its own). By rid, and not ``abort_all`` repeated: a
    retry can come after the window's last answer, when the caller may already have sent the next
    window's requests (the prefill-only twin, the re-runs of cut prompts); a rid names only a
    request of this window, and SGLang ignores a rid that already answered.

    Returns the rounds by rid; raises :class:`AbortError` past ``deadline_s`` (default: the
    client's request timeout: the engine does not honour ``/abort_request``, and the window would
    include a drain) or when the engine refuses ``/abort_request``."""
    limit = deadline_s if deadline_s is not None else float(client.timeout_s)
    try:
        client.abort()
    except Exception as exc:
        raise AbortError(
            f"the engine refused /abort_request ({exc}); the steady-state window needs it to end "
            f"without a drain at falling concurrency"
        ) from None
    started, rounds = time.monotonic(), 0
    while True:
        time.sleep(retry_s)
        left = pending()
        if not left:
            return rounds
        if time.monotonic() - started > limit:
            raise AbortError(
                f"{len(left)} request(s) ({', '.join(sorted(left))}) still unanswered {limit:g} s "
                f"after the window closed, through {rounds} round(s) of aborts by rid: the engine "
                "does not honour /abort_request, so the window would include a drain"
            )
        rounds += 1
        for rid in sorted(left):
            try:
                client.abort(rid)
            except Exception as exc:
                raise AbortError(f"/abort_request for rid {rid} failed: {exc}") from None


class EngineClient:
    """JSON over HTTP to one engine at ``base_url`` (``http://127.0.0.1:PORT``)."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        diagnose: Diagnose | None = None,
        flush_path: str = "/flush_cache",
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(
                f"request timeout must be a positive number of seconds, got {timeout_s!r}"
            )
        if not flush_path.startswith("/flush_cache"):
            raise ValueError(f"flush_path must be a /flush_cache request path, got {flush_path!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.diagnose = diagnose
        #: The backend's ``/flush_cache`` path: SGLang 0.5.23 takes ``?timeout=S`` and then
        #: waits for the scheduler to go idle instead of refusing (400) while it is busy.
        self.flush_path = flush_path

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        diagnose: bool = True,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        timeout = timeout_s or self.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, KeyError, TypeError):
                detail = json.loads(detail)["error"]["message"]
            raise EngineHTTPError(f"{method} {path} -> HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # No answer (died, hung, or closed mid-response): the launcher knows which (exit code,
            # log); ask it first.
            timed_out = any(
                isinstance(e, (socket.timeout, TimeoutError))
                for e in (exc, getattr(exc, "reason", exc))
            )
            what = f"{method} {path}"
            plain = (
                f"{what} got no answer within {timeout:g} s"
                if timed_out
                else f"{what} failed: {exc}"
            )
            fuller = self.diagnose(what, exc, timed_out) if diagnose and self.diagnose else None
            if fuller:
                raise EngineError(f"{fuller}\n({plain})") from None
            raise EngineHTTPError(plain) from None
        text = payload.decode(errors="replace")
        try:
            return json.loads(text)
        except ValueError:
            return text

    def health(self, timeout_s: float = 5.0) -> bool:
        """True when ``/health`` answers 200."""
        try:
            # Start-up polls this while the engine loads: no diagnosis wait per poll.
            self._request("GET", "/health", timeout_s=timeout_s, diagnose=False)
        except EngineHTTPError:
            return False
        return True

    def server_info(self) -> dict[str, Any]:
        """``GET /server_info``; falls back to ``/get_server_info``, the only path of SGLang
        releases before 0.5.9's ``/server_info`` existed (0.5.23 keeps it as a deprecated alias)."""
        try:
            return self._request("GET", "/server_info")
        except EngineError:
            raise  # the engine is gone: no point asking the old path
        except EngineHTTPError:
            return self._request("GET", "/get_server_info")

    def flush_cache(self) -> None:
        """Reset caches, the n-gram table and speculative metrics between arms and repeats
        (:attr:`flush_path`)."""
        self._request("POST", self.flush_path)

    def abort(self, rid: str | None = None) -> None:
        """SGLang's ``/abort_request``: cut request ``rid`` (None: every request); an aborted
        ``/generate`` still answers, with ``finish_reason`` ``{"type": "abort"}`` and the tokens
        made so far in its ``meta_info``."""
        self._request(
            "POST", "/abort_request", {"rid": rid} if rid is not None else {"abort_all": True}
        )

    def abort_until_answered(
        self, pending: Callable[[], set[str]], *, retry_s: float = ABORT_RETRY_S
    ) -> int:
        """Cut every request of ``pending()`` (sent, not answered) and return once each has
        answered: :func:`abort_until_answered` on this client."""
        return abort_until_answered(self, pending, retry_s=retry_s)

    def set_internal_state(self, **values: Any) -> dict[str, Any]:
        """SGLang's ``/set_internal_state``: change runtime values (the reference server takes
        ``max_running_requests`` only; ``/server_info`` lists them as ``settable_internal_state``)."""
        return self._request("POST", "/set_internal_state", values)

    def generate(
        self,
        input_ids: Sequence[Sequence[int]] | None = None,
        *,
        text: Sequence[str] | None = None,
        sampling_params: dict[str, Any] | Sequence[dict[str, Any]],
        rids: Sequence[str] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int = 0,
        return_prompt_token_ids: bool = False,
        return_spec_drafts: bool = False,
    ) -> list[dict[str, Any]]:
        """One batched ``/generate`` call; answers in input order. ``top_logprobs_num=N`` (with
        ``return_logprob``) also asks for the N best tokens per position
        (``input/output_top_logprobs``); ``return_spec_drafts`` (reference server only) for every
        verify step's drafts in ``meta_info.spec_drafts``, for draft removal."""
        if (input_ids is None) == (text is None):
            raise ValueError("generate() takes exactly one of input_ids= or text=")
        if top_logprobs_num and (
            not return_logprob
            or isinstance(top_logprobs_num, bool)
            or not isinstance(top_logprobs_num, int)
            or top_logprobs_num < 0
        ):
            raise ValueError(
                f"top_logprobs_num must be an integer >= 0 and needs return_logprob=True, "
                f"got top_logprobs_num={top_logprobs_num!r}, return_logprob={return_logprob!r}"
            )
        body: dict[str, Any] = {"sampling_params": sampling_params}
        if input_ids is not None:
            body["input_ids"] = [list(ids) for ids in input_ids]
        else:
            body["text"] = list(text or ())
        if rids is not None:
            body["rid"] = list(rids)
        if return_logprob:
            body["return_logprob"] = True
            if logprob_start_len is not None:
                body["logprob_start_len"] = logprob_start_len
            if top_logprobs_num:
                body["top_logprobs_num"] = top_logprobs_num
        if return_prompt_token_ids:
            body["return_prompt_token_ids"] = True
        if return_spec_drafts:
            body["return_spec_drafts"] = True
        answer = self._request("POST", "/generate", body)
        if isinstance(answer, dict):
            answer = [answer]
        if not isinstance(answer, list):
            raise EngineHTTPError(
                f"POST /generate answered {type(answer).__name__}, expected a list"
            )
        return answer

    def work_trace(self, start: int) -> tuple[int, list[dict[str, Any]]]:
        """Reference-server steps recorded since cursor ``start``, and the next cursor."""
        answer = self._request("GET", f"/work_trace?start={int(start)}")
        return int(answer["next"]), list(answer["steps"])
