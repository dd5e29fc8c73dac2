"""One test's measured pair as the run document stores it: the case, its figures, checks, arms,
and what the gate decided."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Mapping

from pytest_specenergy.document.arm import Arm
from pytest_specenergy.document.arm import DrafterFacts
from pytest_specenergy.document.facts import CaseFacts
from pytest_specenergy.document.facts import Check
from pytest_specenergy.document.facts import CoherenceFacts
from pytest_specenergy.document.facts import Comparison
from pytest_specenergy.document.facts import EquivalenceFacts
from pytest_specenergy.document.facts import RunOrder
from pytest_specenergy.document.fields import DocumentError
from pytest_specenergy.document.fields import Fields
from pytest_specenergy.document.fields import Record

#: Arms a case record may carry besides the baseline.
DRAFTER_ARMS = ("speculative", "reference", "removal")


@dataclass(frozen=True)
class CaseRecord(Record):
    """One test's measured pair, as stored: the case, its figures, checks, arms and verdict."""

    omitted_when_empty = (
        "reference",
        "reference_drafter",
        "reference_equivalence",
        "removal",
        "nodeid",
        "machine_key",
        "verdict",
        "comparison",
        "baseline_file",
        "fdr_pending",
    )

    case_id: str
    case: CaseFacts
    source: str
    baseline: Arm
    speculative: Arm
    energy_saving: float | None = None
    speedup: float | None = None
    accept_length: float | None = None
    acceptance_rate: float | None = None
    energy_per_token: float | None = None
    tbt_ms: float | None = None
    verified_per_step: int | None = None
    verify_intensity: float | None = None
    balance_point: float | None = None
    compute_bound: bool | None = None
    draft_share: float | None = None
    draft_share_method: str | None = None
    draft_share_priced: float | None = None
    equivalence: EquivalenceFacts = field(default_factory=EquivalenceFacts)
    coherence: CoherenceFacts | None = None
    checks: tuple[Check, ...] = ()
    order: RunOrder = field(default_factory=RunOrder)
    #: In-job A/B: the reference drafter's arm, its drafter, and its own match with the baseline.
    reference: Arm | None = None
    reference_drafter: DrafterFacts | None = None
    reference_equivalence: EquivalenceFacts | None = None
    removal: Arm | None = None
    #: Set by the session: the test, its machine key, and what the gate decided.
    nodeid: str | None = None
    machine_key: str | None = None
    verdict: str | None = None
    comparison: Comparison | None = None
    baseline_file: str | None = None
    fdr_pending: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    # -- what the case says ----------------------------------------------------------------
    @property
    def key(self) -> str:
        """What matches this record with its baseline in another run: nodeid, else case id."""
        return self.nodeid or self.case_id

    @property
    def model(self) -> str:
        """The target model."""
        return str(self.case.model or "?")

    @property
    def batch(self) -> int | None:
        """The declared batch (requests kept in flight)."""
        return self.case.batch

    @property
    def pool(self) -> int | None:
        """The prompts per pool the case declared (None: the corpus's first 96)."""
        return self.case.generation.prompts

    @property
    def corpus_name(self) -> str:
        """The corpus's name."""
        return str(self.case.corpus.name or "?")

    @property
    def drafter_name(self) -> str:
        """The drafter's method (``ngram``, ``eagle3``, ...)."""
        return str(self.case.drafter.name or "?")

    @property
    def drafter_id(self) -> str:
        """The drafter's id in case ids and reports."""
        return str(self.case.drafter.id or self.case.drafter.name or "?")

    @property
    def exact_fraction(self) -> float | None:
        """The share of prompts whose output matched the baseline exactly."""
        return self.equivalence.exact_fraction

    @property
    def matched_fraction(self) -> float | None:
        """The share of prompts that matched the baseline exactly or diverged only at a numerical
        tie (what the ``equivalence`` limit compares)."""
        return self.equivalence.matched

    @property
    def ties(self) -> int:
        """Prompts whose first divergence was a numerical tie (0 where not classified)."""
        return self.equivalence.ties

    @property
    def reference_matched_fraction(self) -> float | None:
        """In-job A/B: the reference arm's :attr:`matched_fraction`."""
        equivalence = self.reference_equivalence
        return None if equivalence is None else equivalence.matched

    @property
    def reference_ties(self) -> int:
        """In-job A/B: the reference arm's numerical ties with the baseline."""
        return 0 if self.reference_equivalence is None else self.reference_equivalence.ties

    @property
    def scenario(self) -> dict[str, Any]:
        """What must match, besides the machine, for two records to be compared: meter, engine,
        version, workload."""
        engine, case, corpus = self.speculative.engine, self.case, self.case.corpus
        generation = case.generation.as_dict() if case.generation else None
        return {
            "meter": self.source,
            "engine": engine.name or case.engine,
            "engine_version": engine.version,
            "model": case.model,
            "batch": case.batch,
            "corpus": f"{corpus.name}@{corpus.digest}" if corpus.digest else None,
            "generation": generation,
        }

    @property
    def baseline_from(self) -> str | None:
        """The case whose baseline this record shares (``order.baseline_from``), or None."""
        return self.order.baseline_from or None

    @property
    def interleaved(self) -> bool:
        """Whether the arms' repeats alternated (false: blocked arms)."""
        return self.order.interleaved

    @property
    def sequential_pvalues(self) -> dict[str, float]:
        """The gate's comparison rows with a sequential p-value, by metric (the FDR family)."""
        rows = self.comparison.rows if self.comparison is not None else ()
        return {str(r.metric): float(r.p_sequential) for r in rows if r.p_sequential is not None}

    @property
    def logprob_gap(self) -> float | None:
        """Mean log-probability gap of the speculative text after a divergence."""
        return None if self.coherence is None else self.coherence.mean_gap

    @property
    def reference_label(self) -> str:
        """The reference drafter of an in-job A/B record, in words."""
        drafter = self.reference_drafter or DrafterFacts()
        return str(drafter.id or drafter.name or drafter.extra.get("method") or "reference")

    @property
    def failed(self) -> bool:
        """A fail-closed check tripped: the record's numbers must not be trusted."""
        return any(c.severity == "fail" for c in self.checks)

    def arm(self, name: str) -> Arm | None:
        """An arm by name (``baseline``, ``speculative``, ``reference``, ``removal``)."""
        arms = {"baseline": self.baseline, "speculative": self.speculative}
        return {**arms, "reference": self.reference, "removal": self.removal}.get(name)

    def judged(
        self,
        verdict: str | None,
        comparison: Comparison | None,
        baseline_file: str | None,
        fdr_pending: tuple[str, ...] | None = None,
    ) -> CaseRecord:
        """This record with the gate's verdict."""
        return dataclasses.replace(
            self,
            verdict=verdict,
            comparison=comparison,
            baseline_file=baseline_file,
            fdr_pending=fdr_pending,
        )

    @classmethod
    def from_dict(cls, data: Any, where: str | None = None) -> CaseRecord:
        """A record read back; ``where`` names it in a refusal."""
        f = Fields(data, where or "record")
        declared = f.data.get("case")
        fallback = declared.get("id") if isinstance(declared, Mapping) else None
        case_id = f.typed("case_id", "str") or str(fallback or "?")
        f.where = where = f"{where or 'record'} ({case_id})"
        case = f.typed("case", "CaseFacts", CaseFacts())
        arms: dict[str, Arm | None] = {}
        for name in ("baseline", *DRAFTER_ARMS):
            value = f.get(name)
            arms[name] = None if value is None else Arm.from_dict(value, f"{where}.{name}")
        for name in ("baseline", "speculative"):
            if arms[name] is None:
                raise DocumentError(f"{where} lacks its {name!r} arm")
        # compute_bound is kept as written (a reader never refused it).
        return f.fill(
            cls,
            case_id=case_id,
            case=case,
            **arms,
            source=f.typed("source", "str") or arms["speculative"].source,
            compute_bound=f.get("compute_bound"),
        )
