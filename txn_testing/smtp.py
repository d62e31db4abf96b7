"""An SMTP server for tests: aiosmtpd on 127.0.0.1 that keeps every mail it gets.

Plain SMTP (no TLS, no login): an Airflow ``smtp`` connection to it sets ``disable_ssl`` and
``disable_tls`` (:meth:`SmtpServer.connection`).
"""

from __future__ import annotations

import email
import json
import socket
import threading
from dataclasses import dataclass, field
from email.message import Message
from typing import Any


@dataclass(frozen=True)
class Mail:
    sender: str
    recipients: tuple[str, ...]
    subject: str
    body: str


def _body(message: Message) -> str:
    parts = message.walk() if message.is_multipart() else [message]
    texts = []
    for part in parts:
        if part.get_content_maintype() == "text":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                texts.append(payload.decode(part.get_content_charset() or "utf-8", "replace"))
    return "\n".join(texts)


@dataclass
class SmtpServer:
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port, known once started."""
    received: list[Mail] = field(default_factory=list)
    _controller: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> SmtpServer:
        from aiosmtpd.controller import Controller

        if not self.port:
            with socket.socket() as probe:
                probe.bind((self.host, 0))
                self.port = probe.getsockname()[1]
        self._controller = Controller(self, hostname=self.host, port=self.port)
        self._controller.start()
        return self

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.content)
        mail = Mail(
            sender=envelope.mail_from,
            recipients=tuple(envelope.rcpt_tos),
            subject=str(message.get("Subject", "")),
            body=_body(message),
        )
        with self._lock:
            self.received.append(mail)
        return "250 Message accepted for delivery"

    def mails(self) -> list[Mail]:
        with self._lock:
            return list(self.received)

    def connection(self) -> str:
        """An Airflow connection (JSON, for ``AIRFLOW_CONN_<ID>``) to this server."""
        return json.dumps(
            {
                "conn_type": "smtp",
                "host": self.host,
                "port": self.port,
                "extra": {"disable_ssl": True, "disable_tls": True, "retry_limit": 2},
            }
        )

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
