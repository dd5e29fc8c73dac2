"""A session's results as one document: its case records with the machines, meters and engines
they were measured on, and the suite's own verdicts."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from dataclasses import field
from importlib import metadata
from typing import Any
from typing import Iterable
from typing import Mapping

from pytest_specenergy.document.facts import Comparison
from pytest_specenergy.document.fields import DocumentError
from pytest_specenergy.document.fields import Fields
from pytest_specenergy.document.fields import Record
from pytest_specenergy.document.record import CaseRecord

#: ``kind`` of a run document and of a golden file; readers refuse any other kind.
RUN_KIND = "specenergy-run"
GOLDEN_KIND = "specenergy-golden"
SCHEMA_VERSION = 1
#: Schema versions this plugin reads, per kind.
SUPPORTED_SCHEMAS: dict[str, tuple[int, ...]] = {RUN_KIND: (1,), GOLDEN_KIND: (1,)}


def plugin_version() -> str:
    """The installed plugin's version (``unknown`` when run from a bare source tree)."""
    try:
        return metadata.version("pytest-specenergy")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class EngineName(Record):
    """The engine a machine key names: its name and version."""

    name: str | None = None
    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MeterFacts(Record):
    """A meter as it describes itself: its kind and label, the GPU preset a modeled meter prices
    with, the GPUs an NVML meter reads; the rest of its description (meter-defined) in ``extra``."""

    omitted_when_empty = ("preset", "gpus", "labels", "noise")

    kind: str | None = None
    label: str | None = None
    preset: dict[str, Any] | None = None
    gpus: tuple[dict[str, Any], ...] | None = None
    #: One modeled meter prices several engines, each under its own label.
    labels: tuple[str, ...] | None = None
    #: Where the meter's figures vary between identical repeats, and why (a modeled meter: only at
    #: batch > 1); absent in files written before it was said.
    noise: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MachineInfo(Record):
    """The machine a run was measured on: platform, Python, CPU, GPUs (as NVML read them) and
    driver, and the engine and meter that make up its machine key."""

    node: str | None = None
    system: str | None = None
    release: str | None = None
    machine: str | None = None
    python: str | None = None
    python_implementation: str | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    driver: str | None = None
    engine: EngineName | None = None
    meter: MeterFacts | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def with_meter(self, meter: MeterFacts | None) -> MachineInfo:
        """This machine with the meter that measured on it."""
        return dataclasses.replace(self, meter=meter)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object; a machine nobody described is ``{}``, as it was always written."""
        return {} if self == MachineInfo() and not self.extra else super().as_dict()


@dataclass(frozen=True)
class CommitFacts(Record):
    """The source a run measured: the rootdir's git commit, and whether its tree had changes."""

    sha: str | None = None
    dirty: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class FdrSummary(Record):
    """``--specenergy-fdr``: Benjamini-Hochberg over the suite's gated comparisons at level
    ``q``: how many were collected and tested, which regressed, which of them had passed pending
    the suite's verdict, and every adjusted p-value."""

    q: float | None = None
    method: str | None = None
    n_collected: int | None = None
    n_tests: int | None = None
    rejected: tuple[str, ...] = ()
    pending_rejected: tuple[str, ...] = ()
    adjusted: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ChosenConfig(Record):
    """The lowest-energy configuration that met a latency target."""

    label: str | None = None
    drafter: str | None = None
    batch: int | None = None
    energy_per_token: float | None = None
    tbt_ms: float | None = None
    source: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class TargetChoice(Record):
    """Per workload (model, corpus) and latency target, the configuration chosen (None: none met
    it)."""

    model: str | None = None
    corpus: str | None = None
    target_ms: float | None = None
    choice: ChosenConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class LatencySummary(Record):
    """``--specenergy-latency-target``: the targets, the choices, their comparisons with the
    machine key's reference run, and the failures."""

    targets_ms: tuple[float, ...] = ()
    limit: str | None = None
    choices: tuple[TargetChoice, ...] = ()
    comparisons: tuple[Comparison, ...] = ()
    failures: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class CoverageFacts(Record):
    """The gate's coverage on one baseline: how many of its cases this run measured, the ones it
    did not (deselected, skipped, deleted or renamed), those declared as allowed to go unmeasured
    (``--specenergy-unmeasured-ok``), the policy applied, and whether it failed the session."""

    baseline: str | None = None
    machine_key: str | None = None
    measured: int = 0
    unmeasured: tuple[str, ...] = ()
    accepted: tuple[str, ...] = ()
    policy: str | None = None
    failed: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class RunDocument(Record):
    """A session's results with the machines, meters and engines they were measured on."""

    omitted_when_empty = ("name", "fdr", "latency_targets", "shards", "commit", "coverage")

    results: tuple[CaseRecord, ...]
    machine_key: str | None = None
    machine_info: MachineInfo = field(default_factory=MachineInfo)
    machines: dict[str, MachineInfo] = field(default_factory=dict)
    meters: dict[str, MeterFacts] = field(default_factory=dict)
    engine_starts: int = 0
    datetime: str = ""
    plugin_version: str = "unknown"
    schema_version: int = SCHEMA_VERSION
    kind: str = RUN_KIND
    #: A session that did not run to its end: never a baseline.
    interrupted: bool = False
    #: Set by storage: the name the run was saved under.
    name: str | None = None
    #: The suite's verdicts (false-discovery rate, latency targets), when asked for.
    fdr: FdrSummary | None = None
    latency_targets: LatencySummary | None = None
    #: ``specenergy merge``: the shards this run was merged from.
    shards: tuple[str, ...] | None = None
    #: The source the run measured, so a nightly trend says which change moved it (None outside
    #: git).
    commit: CommitFacts | None = None
    #: The gate's coverage: per baseline compared with, its cases this run did not measure.
    coverage: tuple[CoverageFacts, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def build(
        cls,
        records: Iterable[CaseRecord],
        meters: Mapping[str, MeterFacts],
        engine_starts: int,
        machines: Mapping[str, MachineInfo] | None = None,
        host: MachineInfo | None = None,
        **fields: Any,
    ) -> RunDocument:
        """A new document of ``records``; ``machines`` maps each machine key to its description,
        ``host`` describes this machine for a document whose records span several keys (or
        none)."""
        records = tuple(records)
        machines = dict(machines or {})
        keys = sorted({r.machine_key for r in records if r.machine_key})
        one = keys[0] if len(keys) == 1 else None
        return cls(
            results=records,
            machine_key=one,
            # One key per document when saved; a session measuring on several keeps them all.
            machine_info=(machines.get(one) if one else None) or host or MachineInfo(),
            machines=machines,
            meters=dict(meters),
            engine_starts=engine_starts,
            datetime=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            plugin_version=plugin_version(),
            **fields,
        )

    def on(self, machine_key: str) -> RunDocument:
        """The part of this document measured on ``machine_key`` (what one history file holds)."""
        return dataclasses.replace(
            self,
            machine_key=machine_key,
            results=tuple(r for r in self.results if r.machine_key == machine_key),
            coverage=tuple(c for c in self.coverage if c.machine_key in (None, machine_key)),
        )

    @property
    def label(self) -> str:
        """How history tables name this run: its saved name, else its time."""
        return self.name or self.datetime

    def as_dict(self) -> dict[str, Any]:
        """The JSON object (``interrupted`` only when true)."""
        out = super().as_dict()
        if not self.interrupted:
            del out["interrupted"]
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> RunDocument:
        """A document read back (kind and schema checked by the caller); a refusal names the file,
        record and field."""
        source = where or "document"
        f = Fields(data, source)
        if "results" not in f.data:
            raise DocumentError(
                f"{source}: 'results' is missing; the run is incomplete or corrupted"
            )
        results = f.typed("results", "tuple[Any, ...]", ())
        records = tuple(
            CaseRecord.from_dict(r, f"{source}: results[{i}]") for i, r in enumerate(results)
        )
        return f.fill(
            cls,
            results=records,
            datetime=str(f.get("datetime", "")),
            plugin_version=str(f.get("plugin_version", "unknown")),
            interrupted=f.get("interrupted") is True,
        )
