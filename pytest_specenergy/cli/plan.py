"""``specenergy plan [PYTEST ARGS]``: a suite's modeled GPU minutes per case and in total, before it
runs: ``pytest --collect-only --specenergy-plan`` on the given paths and options (the plugin's own
collection, markers and options; ``--specenergy-budget=MINUTES`` refuses a suite that cannot
fit)."""

from __future__ import annotations

import subprocess
import sys
from typing import Sequence


def main(argv: Sequence[str]) -> int:
    """Run the collection with the plan; pytest's exit status (4: refused by the budget)."""
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "--specenergy-plan", *argv]
    return subprocess.run(command, check=False).returncode
