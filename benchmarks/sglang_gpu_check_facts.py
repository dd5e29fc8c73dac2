"""The facts a GPU runner's first day depends on (issue 37), read from what
``benchmarks/sglang_gpu_check.py`` ran: the doctor's findings, the plan, and each order's run
document. Each fact says whether it held (True), did not (False) or could not be read (None, with
why): one JSON, no GPU needed to build it, so it is tested on CPU."""

from __future__ import annotations

from typing import Any
from typing import Iterable
from typing import Mapping

#: NVML's shortest window (``NvmlMeter.min_window_s``): a shorter steady window is looped.
MIN_WINDOW_S = 5.0


def fact(name: str, held: bool | None, detail: Any) -> dict[str, Any]:
    """One fact: its name, whether it held (None: not measurable here), and what was seen."""
    return {"fact": name, "held": held, "detail": detail}


def doctor_facts(findings: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The doctor's findings, and whether none failed (an engine could start here)."""
    findings = [dict(f) for f in findings]
    failed = [f"{f['name']}: {f['detail']}" for f in findings if f.get("status") == "FAIL"]
    return [
        fact(
            "doctor passes (driver, torch CUDA, sglang, kernels, NVML)",
            not failed,
            failed or "no FAIL",
        ),
        fact("doctor findings", None if not findings else True, findings),
    ]


def plan_facts(
    lines: list[str], budget_minutes: float, total: float | None
) -> list[dict[str, Any]]:
    """The check suite's planned GPU minutes against the runbook's budget."""
    if total is None:
        return [fact("planned GPU minutes within the runbook's budget", None, lines)]
    return [
        fact(
            f"planned GPU minutes within the runbook's budget ({budget_minutes:g})",
            total <= budget_minutes,
            {"planned_minutes": total, "plan": lines},
        )
    ]


def _engine(record: Mapping[str, Any]) -> Mapping[str, Any]:
    engine = record.get("engine")
    return engine if isinstance(engine, Mapping) else {}


def _info(record: Mapping[str, Any]) -> Mapping[str, Any]:
    info = _engine(record).get("server_info")
    return info if isinstance(info, Mapping) else {}


def run_facts(order: str, document: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Per case of one order's run (``resident`` or ``blocked``): equal pools per engine, the twin
    check, retractions, window times, contamination, and the engines' start times."""
    if document is None:
        return [fact(f"{order}: the run wrote its document", False, "no run document")]
    out = [
        fact(
            f"{order}: the run wrote its document",
            True,
            {"results": len(document.get("results", []))},
        )
    ]
    for result in document.get("results", []):
        case = f"{order} {result.get('case_id', '?')}"
        arms = {arm: result.get(arm) or {} for arm in ("baseline", "speculative", "reference")}
        arms = {k: v for k, v in arms.items() if v}
        pools = {arm: _info(r).get("max_total_num_tokens") for arm, r in arms.items()}
        known = all(isinstance(v, int) for v in pools.values())
        out.append(
            fact(
                f"{case}: the arms' KV pools are equal",
                len(set(pools.values())) == 1 if known else None,
                pools,
            )
        )
        tripped = [c for c in result.get("checks", []) if isinstance(c, Mapping)]
        twin = [c for c in tripped if c.get("name") == "twin-differs"]
        out.append(fact(f"{case}: the twin check held", not twin, twin or "no twin-differs"))
        out.append(_retractions(case, arms))
        out.append(_windows(case, arms))
        out.append(_contamination(case, arms, order))
        starts = {arm: _info(r).get("startup_time") for arm, r in arms.items()}
        out.append(
            fact(
                f"{case}: engine start-up phases",
                None if not any(starts.values()) else True,
                starts,
            )
        )
        failed = [
            f"{c.get('name')} ({c.get('severity')})" for c in tripped if c.get("severity") == "fail"
        ]
        out.append(fact(f"{case}: no validity check failed", not failed, failed or "all held"))
    return out


def _retractions(case: str, arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    counts = {arm: record.get("retractions") for arm, record in arms.items()}
    if all(v is None for v in counts.values()):
        return fact(
            f"{case}: no request was retracted", None, "retractions are not in this run document"
        )
    total = sum(int((v or {}).get("total", 0)) for v in counts.values() if isinstance(v, Mapping))
    return fact(f"{case}: no request was retracted", total == 0, counts)


def _windows(case: str, arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    seconds = {
        arm: [s.get("decode_seconds") for s in record.get("samples", []) if isinstance(s, Mapping)]
        for arm, record in arms.items()
    }
    flat = [v for values in seconds.values() for v in values]
    if not flat or any(v is None for v in flat):
        return fact(f"{case}: every window timed a positive decode", None, seconds)
    return fact(f"{case}: every window timed a positive decode", all(v > 0 for v in flat), seconds)


def _contamination(case: str, arms: Mapping[str, Mapping[str, Any]], order: str) -> dict[str, Any]:
    statuses = {}
    for arm, record in arms.items():
        for sample in record.get("samples", []):
            window = sample.get("window") if isinstance(sample, Mapping) else None
            report = (window or {}).get("contamination") if isinstance(window, Mapping) else None
            if isinstance(report, Mapping):
                statuses.setdefault(arm, []).append(report.get("status"))
    if not statuses:
        return fact(
            f"{case}: windows free of other GPU processes", None, "no contamination report recorded"
        )
    bad = {arm: s for arm, s in statuses.items() if any(x == "contaminated" for x in s)}
    return fact(f"{case}: windows free of other GPU processes ({order})", not bad, statuses)


def summary(facts: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of held, failed and unknown facts, and the failed ones' names."""
    return {
        "held": sum(f["held"] is True for f in facts),
        "failed": [f["fact"] for f in facts if f["held"] is False],
        "unknown": [f["fact"] for f in facts if f["held"] is None],
    }
