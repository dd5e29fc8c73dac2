"""What the engine zygote is trusted with, and how a launcher knows the zygote is its own user's.

A launcher hands a zygote an engine's command line, working folder, log path and environment. The
zygote it connects to by name (:data:`~pytest_specenergy.engines.zygote.SHARED`) is checked before
anything is sent: the socket's folder must be a real folder of this user that nobody else may
enter (mode 0700, as ``tempfile.mkdtemp`` makes it), the socket this user's, and the process
listening on it (``SO_PEERCRED``) this user's too. The environment sent is only what a reference
server uses (:func:`engine_environment`): CI secrets in pytest's environment never reach a zygote.
See docs/engines.md#the-engine-zygote."""

from __future__ import annotations

import os
import re
import socket
import stat
import struct
from typing import Mapping

#: Variables a forked reference server (and the zygote's own imports) may use, by exact name. The
#: reference server never downloads weights (``refserver/models.py``), so no hub token, proxy or
#: credential is among them. It reads the model cache's location (``refserver/catalog.py``): a
#: built-in checkpoint named in its argv (``smollm2-135m``) is found there, and without these the
#: engine looked under ``~/.cache`` and converted the checkpoint again (or downloaded it) whenever
#: the user had moved the cache.
ENGINE_VARIABLES = frozenset(
    {
        "SPECENERGY_MODEL_CACHE",
        "XDG_CACHE_HOME",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "CUDA_VISIBLE_DEVICES",
    }
)
#: ... and by prefix: locale, Python, the thread pools' sizes, torch's, the tokenizers' (the
#: reference backend sets ``TOKENIZERS_PARALLELISM``), transformers' and the hub's offline
#: switches.
ENGINE_PREFIXES = (
    "LC_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "TORCH_",
    "PYTORCH_",
    "TOKENIZERS_",
    "TRANSFORMERS_",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
)
#: A name with a part that says secret is left out even where a prefix above admits it
#: (``TORCH_API_KEY`` would be a secret whatever its prefix; ``TOKENIZERS_PARALLELISM`` is not).
_SECRET = re.compile(
    r"(^|_)(TOKENS?|SECRETS?|PASSWORD|PASSWD|CREDENTIALS?|KEY|APIKEY|PRIVATE|AUTH)(_|$)",
    re.IGNORECASE,
)


class ZygoteTrustError(OSError):
    """A zygote socket that is not provably this user's own: nothing is sent to it."""


def engine_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` a forked reference server uses (:data:`ENGINE_VARIABLES`,
    :data:`ENGINE_PREFIXES`), without anything named like a secret."""
    return {
        name: value
        for name, value in env.items()
        if (name in ENGINE_VARIABLES or name.startswith(ENGINE_PREFIXES))
        and not _SECRET.search(name)
    }


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (Linux ``SO_PEERCRED``:
    the process that connected, the one that listened, or the one that made a socket pair)."""
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack(
        "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size)
    )
    return pid, uid, gid


def check_socket_path(path: str) -> None:
    """Raise :class:`ZygoteTrustError` unless ``path`` is a socket of this user in a folder of this
    user that only this user may enter (``FileNotFoundError`` when there is none)."""
    uid = os.getuid()
    folder = os.path.dirname(path) or "."
    # Missing (its zygote exited): a plain OSError, the usual end of a parent's zygote.
    folder_stat = os.lstat(folder)
    socket_stat = os.lstat(path)
    if not stat.S_ISDIR(folder_stat.st_mode):
        problem = "its folder is not a directory (a symbolic link?)"
    elif folder_stat.st_uid != uid:
        problem = f"its folder belongs to uid {folder_stat.st_uid}, not this user ({uid})"
    elif folder_stat.st_mode & 0o077:
        problem = (
            f"its folder has mode {stat.S_IMODE(folder_stat.st_mode):o}, which lets other users "
            "in; expected 700"
        )
    elif not stat.S_ISSOCK(socket_stat.st_mode):
        problem = "it is not a socket"
    elif socket_stat.st_uid != uid:
        problem = f"it belongs to uid {socket_stat.st_uid}, not this user ({uid})"
    else:
        return
    raise ZygoteTrustError(f"zygote socket {path!r} is not this user's own: {problem}")


def check_peer(sock: socket.socket, path: str) -> int:
    """The pid listening on connected ``sock``; :class:`ZygoteTrustError` unless it runs as this
    user."""
    try:
        pid, uid, _ = peer_credentials(sock)
    except OSError as exc:
        raise ZygoteTrustError(f"zygote socket {path!r}: no peer credentials ({exc})") from None
    if uid != os.getuid():
        raise ZygoteTrustError(
            f"zygote socket {path!r} is served by pid {pid} of uid {uid}, not this user "
            f"({os.getuid()})"
        )
    return pid
