"""A StatsD server for tests: a UDP socket on 127.0.0.1 that keeps every metric line it gets.

Airflow sends StatsD metrics as ``name:value|type`` lines (several per datagram, separated by
newlines, with ``|@rate`` or ``|#tags`` after them when set).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    kind: str
    """``g`` gauge, ``c`` counter, ``ms`` timer."""


@dataclass
class StatsdListener:
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port, known once started."""
    received: list[Metric] = field(default_factory=list)
    _sock: socket.socket | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> StatsdListener:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((self.host, self.port))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, name="statsd-listener", daemon=True).start()
        return self

    def _serve(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(65535)
            except OSError:  # closed by stop()
                return
            for line in data.decode("utf-8", "replace").splitlines():
                metric = parse(line)
                if metric is not None:
                    with self._lock:
                        self.received.append(metric)

    def metrics(self, prefix: str = "") -> list[Metric]:
        """What arrived so far whose name starts with ``prefix``, in order."""
        with self._lock:
            return [m for m in self.received if m.name.startswith(prefix)]

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def parse(line: str) -> Metric | None:
    """``name:value|type[|@rate][|#tags]`` as a :class:`Metric`; ``None`` if it is not one."""
    name, _, rest = line.strip().partition(":")
    parts = rest.split("|")
    if not name or len(parts) < 2:
        return None
    try:
        return Metric(name, float(parts[0]), parts[1])
    except ValueError:
        return None


__all__ = ["Metric", "StatsdListener", "parse"]
