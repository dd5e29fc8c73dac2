"""The terminal summary of a session as one frozen object (syrupy's ``SnapshotReport``): built once,
the hook only prints it. It imports nothing heavy, so a session that measured nothing never loads
the gate's statistics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_specenergy.gate.verdict import Section


@dataclass(frozen=True)
class SummaryReport:
    """Sections of lines, each with a title and whether it reports a failure."""

    sections: tuple[Section, ...]

    @classmethod
    def of_nothing(cls, xdist_skipped: int) -> SummaryReport:
        """The summary of a session that measured no pair: at most the xdist refusal."""
        if not xdist_skipped:
            return cls(())
        return cls(
            (
                Section(
                    "specenergy xdist",
                    (
                        f"{xdist_skipped} spec_pair tests failed unmeasured: energy is not "
                        "measured under pytest-xdist with --specenergy-xdist=off, because "
                        "workers would share GPUs. Use --specenergy-xdist=per-gpu (one GPU per "
                        "worker) or run without -n.",
                    ),
                    True,
                ),
            )
        )

    def write(self, terminal: Any) -> None:
        """Print every section on pytest's terminal reporter."""
        for section in self.sections:
            terminal.write_sep(
                "=", section.title, red=section.failed, yellow=section.title.endswith("warning")
            )
            for line in section.lines:
                terminal.write_line(line)
