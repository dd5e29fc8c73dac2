"""The run document, typed all the way down: a run, its case records, each record's arms and
their samples, and every nested part a frozen dataclass read by one validating reader
(:mod:`.fields`). Standard library and :mod:`pytest_specenergy.metrics` only, so every layer can
use it.

Who writes it: the session builds one :class:`RunDocument` per run from each test's
:class:`CaseRecord` (``PairResult.record``), the gate adds its verdict to a record, storage saves
it. Who reads it: the gate (baselines), the reports, ``specenergy`` (compare, history, merge).
Facts defined by something outside the plugin stay mappings, each named as such: an engine's own
``/server_info``, a meter's details, engine options, drafter settings.
"""

from pytest_specenergy.document.arm import Arm
from pytest_specenergy.document.arm import ArmConcurrency
from pytest_specenergy.document.arm import DrafterFacts
from pytest_specenergy.document.arm import EngineConfigFacts
from pytest_specenergy.document.arm import EngineFacts
from pytest_specenergy.document.arm import RepeatSample
from pytest_specenergy.document.arm import RetractionFacts
from pytest_specenergy.document.arm import SampleWindow
from pytest_specenergy.document.arm import StepRecord
from pytest_specenergy.document.arm import WindowFacts
from pytest_specenergy.document.facts import CaseFacts
from pytest_specenergy.document.facts import Check
from pytest_specenergy.document.facts import CoherenceFacts
from pytest_specenergy.document.facts import Comparison
from pytest_specenergy.document.facts import ComparisonRow
from pytest_specenergy.document.facts import CorpusFacts
from pytest_specenergy.document.facts import EquivalenceFacts
from pytest_specenergy.document.facts import GenerationFacts
from pytest_specenergy.document.facts import RepeatEntry
from pytest_specenergy.document.facts import ResidencyFacts
from pytest_specenergy.document.facts import Restart
from pytest_specenergy.document.facts import RunOrder
from pytest_specenergy.document.fields import DocumentError
from pytest_specenergy.document.fields import Record
from pytest_specenergy.document.record import DRAFTER_ARMS
from pytest_specenergy.document.record import CaseRecord
from pytest_specenergy.document.run import GOLDEN_KIND
from pytest_specenergy.document.run import RUN_KIND
from pytest_specenergy.document.run import SCHEMA_VERSION
from pytest_specenergy.document.run import SUPPORTED_SCHEMAS
from pytest_specenergy.document.run import CommitFacts
from pytest_specenergy.document.run import CoverageFacts
from pytest_specenergy.document.run import EngineName
from pytest_specenergy.document.run import FdrSummary
from pytest_specenergy.document.run import LatencySummary
from pytest_specenergy.document.run import MachineInfo
from pytest_specenergy.document.run import MeterFacts
from pytest_specenergy.document.run import RunDocument
from pytest_specenergy.document.run import plugin_version

__all__ = [
    "Arm",
    "ArmConcurrency",
    "CaseFacts",
    "CaseRecord",
    "Check",
    "CoherenceFacts",
    "CommitFacts",
    "CoverageFacts",
    "Comparison",
    "ComparisonRow",
    "CorpusFacts",
    "DRAFTER_ARMS",
    "DocumentError",
    "DrafterFacts",
    "EngineConfigFacts",
    "EngineFacts",
    "EngineName",
    "EquivalenceFacts",
    "FdrSummary",
    "GOLDEN_KIND",
    "GenerationFacts",
    "LatencySummary",
    "MachineInfo",
    "MeterFacts",
    "RUN_KIND",
    "Record",
    "RepeatEntry",
    "RepeatSample",
    "RetractionFacts",
    "ResidencyFacts",
    "Restart",
    "RunDocument",
    "RunOrder",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMAS",
    "SampleWindow",
    "StepRecord",
    "WindowFacts",
    "plugin_version",
]
