"""The reference server's connection slots: at most ``--max-connections`` connections served at
once, an idle one closed to make room when every slot is taken, and a reserve kept for health
checks.

Without the eviction, 256 loopback connections that send nothing held every slot for
``--request-timeout`` each and locked every other client out (503) for as long as a flood lasted.
An idle connection is one waiting for its next request with no byte of it arrived: closing it is
what its own idle timeout would do a little later, and a client written for SGLang reconnects.
When every slot is busy with a request, :data:`HEALTH_SLOTS` more connections are served for one
health check each (:data:`HEALTH_PATHS`). See docs/reference-server.md#the-http-protocol."""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from typing import Protocol

log = logging.getLogger("pytest_specenergy.refserver")

#: Connections past ``--max-connections`` served when every slot is busy, for a health check only.
HEALTH_SLOTS = 2
#: The requests a connection on a reserve slot may make: GET of one of these paths.
HEALTH_PATHS = ("/health", "/ready", "/server_info", "/get_server_info")
#: What :meth:`Slots.admit` gives a connection.
SERVED, HEALTH_ONLY = "served", "health-only"


class Reader(Protocol):
    """What the slots read of a connection's reader: bytes of the current request so far, and when
    it started waiting for it (``time.monotonic``)."""

    received: int
    waiting_since: float


class _Connection:
    """One admitted connection: its socket, its reader once its thread has one, its kind."""

    def __init__(self, sock: socket.socket, kind: str) -> None:
        self.sock = sock
        self.kind = kind
        self.reader: Reader | None = None

    def idle_since(self) -> float | None:
        """When it started waiting for a request of which nothing has arrived, or None when it is
        busy (a request being read or served, or bytes of the next one waiting to be read)."""
        reader = self.reader
        if reader is None or reader.received:
            return None
        poller = select.poll()
        try:
            poller.register(self.sock, select.POLLIN)
        except (OSError, ValueError):  # closed meanwhile: its thread is ending anyway
            return None
        return None if poller.poll(0) else reader.waiting_since


class Slots:
    """Admission of connections: ``limit`` served, :data:`HEALTH_SLOTS` more for health checks."""

    def __init__(self, limit: int, health_slots: int = HEALTH_SLOTS) -> None:
        self.limit = limit
        self.health_slots = health_slots
        self._lock = threading.Lock()
        #: By ``id`` of the socket, which the entry keeps alive (so the id is not reused).
        self._open: dict[int, _Connection] = {}

    def _count(self, kind: str) -> int:
        return sum(1 for c in self._open.values() if c.kind == kind)

    def admit(self, sock: socket.socket) -> str | None:
        """:data:`SERVED` or :data:`HEALTH_ONLY` for a new connection, closing an idle one of that
        kind if that makes room; None: refuse it (every slot busy with a request)."""
        with self._lock:
            for kind, room in ((SERVED, self.limit), (HEALTH_ONLY, self.health_slots)):
                if self._count(kind) >= room:
                    victim = self._idlest(kind)
                    if victim is None:
                        continue
                    del self._open[id(victim.sock)]
                    # Its thread wakes on the shutdown (end of input), closes it and ends.
                    with contextlib.suppress(OSError):
                        victim.sock.shutdown(socket.SHUT_RDWR)
                    log.info("closed an idle connection: every %s slot was taken", kind)
                self._open[id(sock)] = _Connection(sock, kind)
                return kind
        return None

    def _idlest(self, kind: str) -> _Connection | None:
        """The connection of ``kind`` idle the longest, if any is idle."""
        idle = [(c.idle_since(), c) for c in self._open.values() if c.kind == kind]
        waiting = [(since, c) for since, c in idle if since is not None]
        return min(waiting, key=lambda pair: pair[0])[1] if waiting else None

    def attach(self, sock: socket.socket, reader: Reader) -> str | None:
        """The connection's thread gives its reader (what idleness is read from); its kind, or None
        when it was closed as idle before its thread started."""
        with self._lock:
            connection = self._open.get(id(sock))
            if connection is None:
                return None
            connection.reader = reader
            return connection.kind

    def release(self, sock: socket.socket) -> None:
        """The connection is closed: its slot is free (nothing if it was closed as idle)."""
        with self._lock:
            # By identity: the socket is closed by now, its descriptor maybe another's already.
            self._open.pop(id(sock), None)
