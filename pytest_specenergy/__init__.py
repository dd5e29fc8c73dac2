"""pytest-specenergy: gate speculative-decoding changes on energy per accepted token.

Markers declare model, drafter, batch and corpus; the ``spec_pair`` fixture measures the
speculative engine against its non-speculative twin and returns a :class:`PairResult` whose
``assert_*`` helpers fail with the numbers in the message.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pytest_specenergy.cases import Case  # noqa: E402
from pytest_specenergy.cases import Generation  # noqa: E402
from pytest_specenergy.corpora import Corpus  # noqa: E402
from pytest_specenergy.drafters import Drafter  # noqa: E402
from pytest_specenergy.results import PairResult  # noqa: E402
from pytest_specenergy.results import RunResult  # noqa: E402

__all__ = ["Case", "Corpus", "Drafter", "Generation", "PairResult", "RunResult", "__version__"]
