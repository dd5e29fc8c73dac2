"""What differs between two server command lines: the dry run shows it, and the SGLang backend
refuses a twin whose command line differs outside the speculative flags."""

from __future__ import annotations

import shlex

# --fault: the reference server's faults that act in speculation alone are not the twin's
# (EngineConfig.twin).
_SPECULATIVE_FLAGS = (
    "--speculative-",
    "--drafter",
    "--num-draft-tokens",
    "--ngram-",
    "--draft-model",
    "--fault",
)
_ADDRESS_FLAGS = frozenset({"--host", "--port"})


def describe_pair_difference(spec_argv: list[str], base_argv: list[str]) -> list[str]:
    """What differs between the speculative and the baseline command lines, one line each:
    ``speculative: ...`` for drafter flags (expected), ``MISMATCH: ...`` for anything else (a broken
    pair); host and port are ignored."""
    spec_prog, spec = _parse_argv(spec_argv)
    base_prog, base = _parse_argv(base_argv)
    lines = []
    if spec_prog != base_prog:
        lines.append(
            f"MISMATCH: program {shlex.join(spec_prog)} (speculative) vs {shlex.join(base_prog)} "
            "(baseline)"
        )
    for flag in [*spec, *(f for f in base if f not in spec)]:
        if flag in _ADDRESS_FLAGS or spec.get(flag) == base.get(flag):
            continue
        kind = "speculative" if flag.startswith(_SPECULATIVE_FLAGS) else "MISMATCH"
        if flag not in base:
            lines.append(f"{kind}: {flag} {spec[flag]}".rstrip() + " (speculative arm only)")
        elif flag not in spec:
            lines.append(f"{kind}: {flag} {base[flag]}".rstrip() + " (baseline only)")
        else:
            lines.append(f"{kind}: {flag} {spec[flag]} (speculative) vs {base[flag]} (baseline)")
    return lines


def _parse_argv(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    prog: list[str] = []
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for item in argv:
        if item.startswith("--"):
            current = item.split("=", 1)[0]
            flags.setdefault(current, [])
            if "=" in item:
                flags[current].append(item.split("=", 1)[1])
        elif current is None:
            prog.append(item)
        else:
            flags[current].append(item)
    return prog, {k: " ".join(v) for k, v in flags.items()}
