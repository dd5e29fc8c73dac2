"""Collection stays cheap: loading the plugin and collecting marker cases imports only what
building the cases needs (issue 24, item 8: collection within 1.15x of plain parametrize).

Each heavy module named here is imported where it is first used (the gate, the run document, the
reference server's model code); a module-level import of one of them on the collection path
would add its compile and import to every ``pytest`` start. ``benchmarks/plugin_overhead.py``
measures the ratio itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types

import pytest

#: Never imported by loading the plugin or collecting a marker suite.
NOT_AT_COLLECTION = (
    "pytest_specenergy.document",
    "pytest_specenergy.atomic",
    "pytest_specenergy.gate.machine",
    "pytest_specenergy.gate.compare",
    "pytest_specenergy.gate.gatekeeper",
    "pytest_specenergy.gate.limits",  # a tolerance marker needs it, the option defaults do not
    "pytest_specenergy.gate.storage",
    "pytest_specenergy.engines.meta_info",
    "pytest_specenergy.engines.pool",
    "pytest_specenergy.measure.pairs",
    "pytest_specenergy.measure.results",
    "pytest_specenergy.refserver.random_models",
    "pytest_specenergy.refserver.records",  # the markers need only the name lists (refserver.names)
    "pytest_specenergy.refserver.tokenizer",
    "pytest_specenergy.report.terminal",
    "numpy",
    "torch",
)

SUITE = """
import pytest
from pytest_specenergy import Drafter

pytestmark = [pytest.mark.model("tiny:dense"), pytest.mark.corpus("code", "news")]

@pytest.mark.drafter("ngram", Drafter("ngram", num_draft_tokens=2))
@pytest.mark.batch(1, 4)
def test_case(spec_pair):
    pass
"""

CONFTEST = """
import json, sys

def pytest_collection_finish(session):
    with open("modules.json", "w") as out:
        json.dump(sorted(sys.modules), out)
"""


def _heavy(modules: set[str]) -> list[str]:
    return [m for m in NOT_AT_COLLECTION if m in modules]


def test_loading_the_plugin_imports_no_heavy_module():
    code = (
        "import json, sys; import pytest_specenergy.plugin, pytest_specenergy.session; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert _heavy(set(json.loads(out.stdout))) == []


def test_collecting_marker_cases_imports_no_heavy_module(tmp_path):
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "8 tests collected" in proc.stdout, proc.stdout + proc.stderr
    assert _heavy(set(json.loads((tmp_path / "modules.json").read_text()))) == []


def test_the_nvml_probe_agrees_with_nvml():
    """``--specenergy-meter=auto`` decides "modeled" without nvidia-ml-py where no NVIDIA driver is
    loaded or NVML's library cannot load; wherever that is so, NVML itself cannot start either."""
    from pytest_specenergy.meters.devices import nvml_gpu_count
    from pytest_specenergy.options import _nvml_unavailable

    if _nvml_unavailable():
        with pytest.raises(Exception):  # noqa: B017, PT011 - MeterError, or NVML's own error types
            nvml_gpu_count()


def test_an_imported_pynvml_is_always_asked(monkeypatch):
    """A ``pynvml`` already imported (a fake, or NVML in use) decides, never the probe."""
    from pytest_specenergy.options import _nvml_unavailable

    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    assert _nvml_unavailable() is False
