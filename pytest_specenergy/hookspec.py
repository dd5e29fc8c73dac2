"""Hooks other plugins and ``conftest.py`` files can implement, each with an example.

The plugin registers them with ``pytest_addhooks``; implement one in a ``conftest.py`` (or a
plugin) by its name, as any pytest hook.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_specenergy_make_meter(kind: str, engine: Any) -> Any:
    """A meter for ``kind`` (``nvml``, ``modeled:<gpu>``) on ``engine``, or None: the plugin
    builds its own.

    Return any object with the :class:`~pytest_specenergy.meters.base.Meter` members (``kind``,
    ``label``, ``min_window_s``, ``describe()``, ``start(engine)``, ``stop(token)`` returning an
    :class:`~pytest_specenergy.meters.base.EnergyWindow`, ``close()``). ``engine`` is the running
    server (:class:`~pytest_specenergy.engines.base.Server`: its config, environment, pid). The
    label you give follows every figure into tables and files: say where the joules came from.

    Example ``conftest.py``, a rack PDU instead of NVML::

        def pytest_specenergy_make_meter(kind, engine):
            if kind == "nvml":
                return RackPduMeter(outlet=7, label="measured (pdu outlet 7)")
    """


def pytest_specenergy_pair_measured(pair: Any) -> None:
    """Called once per measured :class:`~pytest_specenergy.PairResult`, before any assertion of the
    test runs (a pair shared by several tests is announced once).

    Example ``conftest.py``, every pair to a team dashboard::

        def pytest_specenergy_pair_measured(pair):
            dashboard.post(pair.case_id, saving=pair.energy_saving, source=pair.source)
    """


def pytest_specenergy_update_json(data: dict[str, Any]) -> None:
    """Modify the ``--specenergy-json`` document (its JSON form) in place before it is written.

    Fields you add are kept: the document reader keeps what it does not know and writes it back,
    so a stored run keeps them too. A change that makes the document unreadable fails the session,
    naming the hook; the run history then keeps the document as measured.

    Example ``conftest.py``, the CI job beside the figures::

        import os

        def pytest_specenergy_update_json(data):
            data["ci_job"] = os.environ.get("CI_JOB_ID")
    """
