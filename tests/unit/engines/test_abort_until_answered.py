"""abort_until_answered: the window's close cuts every request in flight, whatever the timing.

Until now it was exercised only against live SGLang (tests/sglang/pair_suite.py). These
tests drive it with a fake client that reproduces the race of issue 20 item 3 deterministically.
"""

from __future__ import annotations

import threading
import time

import pytest

from pytest_specenergy.engines.client import AbortError
from pytest_specenergy.engines.client import abort_until_answered


class FakeSGLangClient:
    """A fake, not an engine: it implements only what :func:`abort_until_answered` calls on a
    real :class:`~pytest_specenergy.engines.client.EngineClient` - ``abort(rid=None)`` (SGLang's
    ``/abort_request``: ``abort_all`` without a rid, one request with it) and the ``timeout_s``
    attribute (the default deadline) - with SGLang 0.5.23's behaviour as measured live:

    - an abort (all or by rid) cuts only requests the tokenizer has registered; each cut request
      answers at once (its rid leaves ``pending``);
    - a request sent about 0 ms before the close is not registered yet when ``abort_all``
      arrives: that abort is dropped for it, and the request registers just after (here: as
      ``abort_all`` returns), so without a later abort it would run on to ``max_new_tokens``;
    - an abort for a rid that already answered, or that the engine does not know, is ignored.

    ``stuck`` rids never answer any abort (an engine that does not honour ``/abort_request``);
    ``refuse`` makes every call raise, as the HTTP client does on an error status.
    """

    def __init__(
        self, registered=(), late=(), stuck=(), timeout_s: float = 300.0, refuse: bool = False
    ):
        self.timeout_s = timeout_s
        self.refuse = refuse
        self.calls: list[str | None] = []
        self._lock = threading.Lock()
        self._registered = set(registered) | set(stuck)
        self._late = set(late)
        self._stuck = set(stuck)
        self._pending = set(registered) | set(late) | set(stuck)

    def abort(self, rid: str | None = None) -> None:
        with self._lock:
            self.calls.append(rid)
            if self.refuse:
                raise RuntimeError("POST /abort_request: HTTP 404 Not Found")
            if rid is None:
                self._pending -= self._registered - self._stuck
                self._registered |= self._late  # registered a moment after the dropped abort
                self._late.clear()
            elif rid in self._registered and rid not in self._stuck:
                self._pending.discard(rid)

    def finish(self, rid: str) -> None:
        """The request ends on its own (max_new_tokens or EOS) and answers."""
        with self._lock:
            self._pending.discard(rid)

    def pending(self) -> set[str]:
        """The caller's view: rids sent and not answered yet (a copy, as the measurer's is)."""
        with self._lock:
            return set(self._pending)


def test_a_request_sent_just_before_the_close_is_aborted_by_rid_until_it_answers():
    client = FakeSGLangClient(registered={"se-1", "se-2", "se-3"}, late={"se-4"})
    rounds = abort_until_answered(client, client.pending, retry_s=0.001, deadline_s=5)
    assert client.pending() == set()
    # One abort_all (cut se-1..3, dropped for se-4), then se-4 by rid: never abort_all again,
    # which could cut a request of the caller's next window.
    assert client.calls == [None, "se-4"]
    assert rounds == 1


def test_without_the_retries_the_late_request_would_run_on():
    """The race the retries exist for: after the one abort_all the late request still runs."""
    client = FakeSGLangClient(registered={"se-1"}, late={"se-2"})
    client.abort()
    assert client.pending() == {"se-2"}


def test_nothing_late_ends_after_the_abort_all_alone():
    client = FakeSGLangClient(registered={"se-1", "se-2"})
    assert abort_until_answered(client, client.pending, retry_s=0.001, deadline_s=5) == 0
    assert client.calls == [None]


def test_a_request_that_answers_on_its_own_is_not_aborted_by_rid():
    client = FakeSGLangClient(registered={"se-1"}, late={"se-2", "se-3"})
    original = client.abort

    def abort(rid=None):
        original(rid)
        if rid is None:
            client.finish("se-3")  # se-3 reached max_new_tokens between the abort_all and the retry

    client.abort = abort
    abort_until_answered(client, client.pending, retry_s=0.001, deadline_s=5)
    assert client.pending() == set() and client.calls == [None, "se-2"]


def test_answers_arriving_from_worker_threads_end_it_within_a_few_retries():
    """As in a real window: answers arrive on the workers' threads, while the loop retries."""
    client = FakeSGLangClient(registered={"se-1"}, stuck={"se-2"})
    timer = threading.Timer(0.05, client.finish, args=("se-2",))  # finishes on its own at 50 ms
    timer.start()
    try:
        started = time.monotonic()
        rounds = abort_until_answered(client, client.pending, retry_s=0.005, deadline_s=5)
        elapsed = time.monotonic() - started
    finally:
        timer.cancel()
    assert client.pending() == set()
    assert rounds >= 1 and set(client.calls[1:]) == {"se-2"}
    assert elapsed < 2.0


def test_a_request_that_never_answers_fails_loudly_within_the_deadline():
    client = FakeSGLangClient(registered={"se-1"}, stuck={"se-2"})
    started = time.monotonic()
    with pytest.raises(
        AbortError,
        match=r"1 request\(s\) \(se-2\) still unanswered 0.1 s after the window "
        r"closed, through \d+ round\(s\) of aborts by rid",
    ):
        abort_until_answered(client, client.pending, retry_s=0.005, deadline_s=0.1)
    assert time.monotonic() - started < 2.0
    assert client.calls[0] is None and len(client.calls) > 2 and set(client.calls[1:]) == {"se-2"}


def test_the_default_deadline_is_the_clients_request_timeout():
    client = FakeSGLangClient(stuck={"se-7"}, timeout_s=0.05)
    started = time.monotonic()
    with pytest.raises(AbortError, match="still unanswered 0.05 s"):
        abort_until_answered(client, client.pending, retry_s=0.005)
    assert time.monotonic() - started < 2.0


def test_an_engine_that_refuses_abort_request_fails_at_once():
    client = FakeSGLangClient(registered={"se-1"}, refuse=True)
    with pytest.raises(AbortError, match=r"refused /abort_request .*HTTP 404"):
        abort_until_answered(client, client.pending, retry_s=0.001, deadline_s=5)
    assert client.calls == [None]


def test_a_failing_abort_by_rid_fails_naming_the_rid():
    client = FakeSGLangClient(registered={"se-1"}, late={"se-2"})
    original = client.abort

    def abort(rid=None):
        original(rid)
        if rid is not None:
            raise RuntimeError("connection reset")

    client.abort = abort
    with pytest.raises(AbortError, match="rid se-2 failed: connection reset"):
        abort_until_answered(client, client.pending, retry_s=0.001, deadline_s=5)
