"""The steady window's end rule: a window holds what the case declared, and no more.

A steady window keeps ``batch`` requests in flight, refilling each as it returns, and closes at the
first finish that leaves fewer than ``batch`` in flight once its requests are all sent (the rest are
aborted; ``measure/arm.py``). Sent from the whole prompt pool, a batch-1 window can never leave
"fewer than 1 but some" in flight, so it decodes the whole pool: 192 prompts x 512 tokens, 5-11
minutes per window on an H200 (issue 37). The rule here bounds the requests a window sends:

* **requests per window** ``R(batch) = min(pool, max(MIN_WINDOW_REQUESTS, WAVES x batch))``: three
  waves of the batch (the steady state's start, middle and refill tail), and at least 8 requests so
  a small batch still averages over several prompts; never more than the pool. Batch 64 over the
  suites' 192-prompt pool keeps its whole pool; batch 16 sends 48; batch 1 sends 8 (8 x 512 tokens,
  about 30 s on an H200) instead of 192.
* **which prompts**: repeat ``r`` takes the ``R`` pool prompts from index ``r x R`` on (wrapping),
  the same for every arm of that repeat: paired repeats measure the same prompts, and successive
  repeats walk the pool.
* **fillers**: once the ``R`` window prompts are sent, the slots they free are refilled with
  fillers - the next repeat's prompts, :func:`filler_prompts` - so the batch stays in flight until
  the last window prompt has finished. A filler's tokens are not the window's: its decode work
  only weighs the window's energy per decode row (``measure/window.py``), so every arm of a repeat
  counts the same prompts' tokens, each whole (issue 41: a window that cut the last ``batch - 1``
  prompts covered 68-92% of the pool's tokens in the speculative arm and 100% in the baseline,
  +5.2 to -4.2 points against the full workload).
* **the close**: the answer of the last window prompt ends the window, and the fillers still in
  flight are aborted; where the fillers run out first, the first answer that leaves fewer than
  ``batch`` in flight (queued ones counted) ends it. At batch 1 the last window prompt runs
  alone, so nothing but a queued filler is aborted.

Planning prices ``R`` requests per window (``plan/cost.py``): the fillers' work stands in for the
window prompts' tails the old close left out, about the same.
"""

from __future__ import annotations

#: Waves of the batch one window sends.
WAVES = 3
#: The fewest requests a window sends (where the pool holds them).
MIN_WINDOW_REQUESTS = 8


def window_requests(batch: int, pool: int) -> int:
    """``R(batch)``: the requests one steady window sends, out of a pool of ``pool`` prompts."""
    if batch < 1 or pool < 1:
        raise ValueError(f"batch and pool must be at least 1, got batch={batch}, pool={pool}")
    return min(pool, max(MIN_WINDOW_REQUESTS, WAVES * batch))


def window_prompts(batch: int, pool: int, repeat: int) -> tuple[int, ...]:
    """The pool indices repeat ``repeat`` (from 0) sends, in order; every arm of the repeat alike."""
    if repeat < 0:
        raise ValueError(f"repeat must be >= 0, got {repeat}")
    count = window_requests(batch, pool)
    start = repeat * count
    return tuple((start + i) % pool for i in range(count))


def filler_prompts(batch: int, pool: int, repeat: int) -> tuple[int, ...]:
    """The pool indices repeat ``repeat`` may send as fillers, in order: the next repeat's window
    prompts (the window's own again where the pool holds no more); none at batch 1, whose last
    window prompt runs alone as every other did."""
    return window_prompts(batch, pool, repeat + 1) if batch > 1 else ()


def window_ends(
    sent: int, in_flight: int, batch: int, requests: int, unanswered: int | None = None
) -> bool:
    """Whether an answer ends the window: no window prompt left ``unanswered`` (None: no fillers,
    the window prompts are all of its ``requests``); or, with all ``requests`` (window prompts and
    fillers) ``sent``, fewer than the batch left ``in_flight`` (queued ones counted). What is still
    in flight is then aborted."""
    return unanswered == 0 or (sent >= requests and in_flight < batch)
