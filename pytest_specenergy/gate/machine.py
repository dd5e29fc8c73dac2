"""Machine description, the machine key run history is stored under (stable fields only) and the
comparability facts the gate checks (:func:`run_info`, :func:`comparable`); why, and the ``info``
read: docs/gate.md#comparability."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import subprocess
from collections import Counter
from typing import Any
from typing import Mapping
from typing import Sequence

from pytest_specenergy.document import CaseRecord
from pytest_specenergy.document import CommitFacts
from pytest_specenergy.document import EngineFacts
from pytest_specenergy.document import MachineInfo
from pytest_specenergy.document import MeterFacts
from pytest_specenergy.document import RunDocument
from pytest_specenergy.engines.meta_info import cuda_graph_setting

#: Fields a key may be built from, in key order.
KEY_FIELDS: tuple[str, ...] = ("gpu", "power_limit", "driver", "engine", "meter")

_MAX_KEY = 120


def slugify(text: str) -> str:
    """Lower-case, runs of anything but ``[a-z0-9.+]`` become ``-``; stable and path-safe."""
    slug = re.sub(r"[^a-z0-9.+]+", "-", str(text).lower()).strip("-.")
    return slug or "unknown"


def _power_w(gpu: Mapping[str, Any]) -> int | None:
    for key, scale in (
        ("power_limit_w", 1.0),
        ("power_limit", 1.0),
        ("enforced_power_limit_mw", 1e-3),
        ("power_limit_mw", 1e-3),
    ):
        value = gpu.get(key)
        if isinstance(value, (int, float)) and value > 0:
            # Whole watts: NVML reports milliwatts, and a rounding difference must not split a
            # history.
            return int(round(value * scale))
    return None


def _engine_part(info: Mapping[str, Any]) -> str | None:
    engine = info.get("engine")
    if isinstance(engine, Mapping):
        parts = (engine.get("name") or engine.get("engine"), engine.get("version"))
    else:
        parts = (engine, info.get("engine_version")) if engine else ()
    return "-".join(str(p) for p in parts if p) or None


def _key_parts(info: Mapping[str, Any]) -> dict[str, str | None]:
    """The key's part for each of :data:`KEY_FIELDS` (None: left out)."""
    meter = info.get("meter") or {}
    meter = meter if isinstance(meter, Mapping) else {"kind": str(meter)}
    kind = str(meter.get("kind") or "")
    if kind.startswith("modeled"):
        preset = meter.get("preset")
        if isinstance(preset, Mapping) and preset.get("name"):
            preset_name = str(preset["name"])
        else:
            preset_name = kind.split(":", 1)[1] if ":" in kind else "unknown"
        # The modeled preset is the GPU part (a second copy as the meter part would only lengthen
        # keys).
        return {"gpu": f"modeled-{preset_name}-cpu", "engine": _engine_part(info)}
    listed = info.get("gpus")
    gpus = [
        g for g in (meter.get("gpus") if listed is None else listed) or [] if isinstance(g, Mapping)
    ]
    counts = Counter(str(g.get("name") or "unknown-gpu") for g in gpus)
    watts = sorted({w for w in (_power_w(g) for g in gpus) if w is not None})
    drivers = sorted({str(g["driver"]) for g in gpus if g.get("driver")})
    if not drivers and info.get("driver"):
        drivers = [str(info["driver"])]
    return {
        "gpu": "+".join(f"{n}x{name}" for name, n in sorted(counts.items())) or "nogpu",
        "power_limit": "+".join(f"{w}w" for w in watts) or None,
        "driver": "drv" + "+".join(drivers) if drivers else None,
        "engine": _engine_part(info),
        "meter": kind or None,
    }


def machine_key(info: MachineInfo | Mapping[str, Any], fields: Sequence[str] | None = None) -> str:
    """A stable, path-safe key from the stable fields of ``info`` (``fields``: a subset of
    :data:`KEY_FIELDS`); absent facts are left out, e.g.
    ``1xnvidia-h200-700w-drv550.54.15-sglang-0.5.9-nvml`` or ``modeled-h200-cpu-reference-0.1.0``."""
    chosen = KEY_FIELDS if fields is None else tuple(fields)
    unknown = [f for f in chosen if f not in KEY_FIELDS]
    if unknown:
        raise ValueError(
            f"unknown machine-key field(s) {', '.join(map(repr, unknown))}; "
            f"expected some of {', '.join(KEY_FIELDS)}"
        )
    # Keys are read from the description as stored, whatever version wrote it: its JSON form.
    parts = _key_parts(info.as_dict() if isinstance(info, MachineInfo) else info)
    key = slugify("-".join(p for p in (parts.get(f) for f in KEY_FIELDS if f in chosen) if p))
    if len(key) > _MAX_KEY:
        # Too long for a directory name (many GPU kinds): a readable prefix, unique with a digest.
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        key = f"{key[: _MAX_KEY - 11].rstrip('-.')}-{digest}"
    return key


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def machine_info(
    meter: MeterFacts | Mapping[str, Any] | None = None,
    *,
    engine: Mapping[str, Any] | None = None,
    gpus: Sequence[Mapping[str, Any]] | None = None,
    driver: str | None = None,
) -> MachineInfo:
    """Describe this machine without NVML: platform, Python and CPU, plus what callers know
    (``meter``: a meter's description; ``gpus``: from whoever opened NVML, else the meter's)."""
    if isinstance(meter, Mapping):
        meter = MeterFacts.from_dict(meter, "meter")
    gpu_list = [dict(g) for g in gpus] if gpus is not None else None
    if gpu_list is None and meter is not None and meter.gpus is not None:
        gpu_list = [dict(g) for g in meter.gpus]
    facts = {
        "node": platform.node(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "gpus": gpu_list or [],
        "driver": driver,
        "engine": dict(engine) if engine else None,
    }
    return MachineInfo.from_dict(facts, "machine").with_meter(meter)


def pair_machine(
    engine: EngineFacts, meter: MeterFacts | Mapping[str, Any] | None, source: str
) -> tuple[str, MachineInfo]:
    """The machine key and description of the run a pair was measured in (meter, engine, GPUs)."""
    name, version = str(engine.engine), str(engine.version)
    version = version.removeprefix(f"{name}-")  # the reference server says "reference-0.1.0"
    info = machine_info(
        meter or MeterFacts(kind=source, label=source), engine={"name": name, "version": version}
    )
    return machine_key(info), info


def source_commit(root: str | os.PathLike[str]) -> CommitFacts | None:
    """The git commit checked out at ``root`` and whether the tree has changes (None outside git)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return CommitFacts(sha=sha, dirty=None if status is None else bool(status))


# -- comparability --------------------------------------------------------------------------
#: Facts that must match for two results to be compared, in report order.
COMPARED_FIELDS: tuple[tuple[str, str], ...] = (
    ("machine_key", "machine key"),
    ("meter", "meter"),
    ("engine", "engine"),
    ("engine_version", "engine version"),
    ("cuda_graph", "CUDA-graph setting"),
    ("calibration", "modeled meter's calibration"),
    ("model", "model"),
    ("batch", "batch"),
    ("corpus", "corpus"),
    ("generation", "generation settings"),
)


def run_info(record: CaseRecord) -> dict[str, Any]:
    """The comparability facts a result record carries itself: its scenario and CUDA graphs."""
    engine, samples = record.speculative.engine, record.speculative.samples
    graphs = cuda_graph_setting(engine.server_info, engine.options)
    # A modeled figure is only comparable under the same fitted constants (None: a board meter,
    # or a record priced before the presets were calibrated).
    calibration = samples[0].window.detail("calibration") if samples else None
    return {**record.scenario, "cuda_graph": graphs, "calibration": calibration}


def document_run_info(document: RunDocument) -> dict[str, Any]:
    """Run-level comparability facts of a run document: its machine key, else one computed
    from a full :func:`machine_info` (one naming its meter), never from a bare platform record."""
    key = document.machine_key
    if not key and document.machine_info.meter is not None:
        key = machine_key(document.machine_info)
    return {"machine_key": key}


def _meter_reason(baseline: Any, current: Any) -> str:
    def split(label: Any) -> tuple[str, str]:
        kind, _, rest = str(label).partition(" (")
        return kind, rest.rstrip(")")

    (b_kind, b_what), (c_kind, c_what) = split(baseline), split(current)
    both = f"the baseline is {baseline}, the current run is {current}"
    if b_kind != c_kind:
        return f"meter differs: {both}; modeled and measured energy are never compared"
    if b_kind == "modeled" and b_what.split(",")[0] == c_what.split(",")[0]:
        return (
            f"modeled pricing differs: {both}; figures priced as different models are not "
            "comparable"
        )
    if b_kind == "modeled":
        return f"modeled GPU differs: {both}; figures modeled for different GPUs are not comparable"
    return f"meter differs: {both}"


def comparable(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Reasons why two runs' facts (:func:`run_info` with :func:`document_run_info`) cannot be
    compared, empty when they can. A fact on one side only is a reason: a match that cannot be shown
    is not assumed."""
    reasons = []
    labels = dict(COMPARED_FIELDS)
    for key in [*labels, *sorted((set(baseline) | set(current)) - set(labels))]:
        b, c = baseline.get(key), current.get(key)
        label = labels.get(key, key)
        if b == c:
            continue
        if b is None:
            reasons.append(
                f"the baseline does not record its {label} (current: {c}); a match cannot be shown"
            )
        elif c is None:
            reasons.append(
                f"the current run does not record its {label} (baseline: {b}); a match cannot be "
                "shown"
            )
        elif key == "meter":
            reasons.append(_meter_reason(b, c))
        elif key == "cuda_graph" and isinstance(b, Mapping) and isinstance(c, Mapping):
            diffs = [
                f"{k}={b.get(k)!r} (baseline) vs {c.get(k)!r} (current)"
                for k in sorted(set(b) | set(c))
                if b.get(k) != c.get(k)
            ]
            reasons.append(
                f"CUDA-graph setting differs: {'; '.join(diffs)}; CUDA graphs change the result"
            )
        else:
            reasons.append(f"{label} differs: baseline {b!r}, current {c!r}")
    return reasons
