"""Engine identity: the server answering on our port is ours (docs/engines.md#engine-identity)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any
from typing import Iterator
from typing import Mapping

from pytest_specenergy.engines.config import EngineConfig

_TCP_LISTEN = "0A"


class EngineStartError(RuntimeError):
    """An engine did not come up; the message quotes its log."""


class EngineIdentityError(EngineStartError):
    """The server answering on the engine's port is not the engine that was started."""


class PortTakenError(EngineIdentityError):
    """Another process's server took the engine's port between the pick and the bind."""


def port_in_use(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6); None without ``/proc``."""
    found: set[str] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if (
                len(fields) > 9
                and fields[3] == _TCP_LISTEN
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                found.add(fields[9])
    return found if readable else None


def socket_holders(inodes: set[str], pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of group ``pgid`` holding one of the socket ``inodes`` open."""
    wanted = {f"socket:[{inode}]" for inode in inodes}
    return [
        int(entry.name)
        for entry in proc.iterdir()
        if entry.name.isdigit()
        and _pgid(int(entry.name)) == pgid
        and any(link in wanted for link in _fd_links(entry / "fd"))
    ]


def _fd_links(fd_dir: Path) -> Iterator[str]:
    """Targets of a process's open fds; fds closed while we look are skipped one by one."""
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return
    for fd in fds:
        try:
            yield os.readlink(fd)
        except OSError:
            continue


def _same(found: Any, expected: str) -> bool:
    """Names compare as given, or as the same directory when both are paths on disk."""
    if str(found) == expected:
        return True
    try:
        return Path(str(found)).exists() and Path(str(found)).resolve() == Path(expected).resolve()
    except OSError:
        return False


def config_mismatches(config: EngineConfig, info: Mapping[str, Any]) -> list[str]:
    """What ``/server_info`` contradicts in ``config`` (facts it does not report pass)."""
    problems = []
    model = info.get("model_path")
    if model is not None and not _same(model, config.model):
        problems.append(f"model {config.model!r} expected, server reports {model!r}")
    if "speculative_algorithm" in info:
        algorithm = info.get("speculative_algorithm")
        # The A/A control (Drafter("none")) runs the twin's non-speculative config.
        drafts = config.drafter is not None and config.drafter.name != "none"
        if not drafts and algorithm:
            arm = "baseline arm" if config.drafter is None else "the A/A control drafter 'none'"
            problems.append(f"no drafter expected ({arm}), server runs {algorithm!r}")
        elif drafts and not algorithm:
            problems.append(f"drafter {config.drafter.name!r} expected, server runs none")
    draft = config.drafter.draft_model if config.drafter else None
    reported = info.get("speculative_draft_model_path")
    if draft and reported is not None and not _same(reported, draft):
        problems.append(f"draft model {draft!r} expected, server reports {reported!r}")
    return problems


def check_identity(
    config: EngineConfig,
    info: Mapping[str, Any],
    pgid: int,
    host: str,
    port: int,
    proc: Path = Path("/proc"),
) -> str:
    """Raise :class:`EngineIdentityError` unless our group's server answered; say how it
    was proven (``pid``, ``port`` or why the ownership part was skipped)."""
    label = config.label()
    pid = info.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        owner = _pgid(pid)
        if owner != pgid:
            where = "is not running" if owner is None else f"is in process group {owner}"
            raise PortTakenError(
                f"a foreign server answers on {host}:{port}: /server_info reports pid {pid} (model "
                f"{info.get('model_path')!r}), which {where}, not in the group {pgid} of engine "
                f"{label} that was started; another process took the port"
            )
        how = f"pid {pid} in group {pgid}"
    else:
        inodes = listening_inodes(port, proc)
        if inodes is None:
            how = "ownership skipped: /server_info has no pid and /proc/net/tcp is unreadable"
        elif not (holders := socket_holders(inodes, pgid, proc)):
            raise PortTakenError(
                f"a foreign server answers on {host}:{port}: no process of the group {pgid} of "
                f"engine {label} holds the listening socket (model {info.get('model_path')!r}); "
                "another process took the port"
            )
        else:
            how = f"port {port} held by pid {holders[0]} in group {pgid}"
    problems = config_mismatches(config, info)
    if problems:
        raise EngineIdentityError(
            f"the server on {host}:{port} is not engine {label}: {'; '.join(problems)}"
        )
    return how
