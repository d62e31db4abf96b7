"""The "Transactions" page of the Airflow UI: pipelines, txids, attempts, states, live.

Airflow imports the provider's plugin in every process that loads plugins (scheduler, DAG
processor, each task), only the api-server serves the page. So the plugin holds a
:class:`LazyApp`: an ASGI app that imports FastAPI, Jinja and Airflow's security code, and builds
the real app (:mod:`airflow_txn_provider.ui.app`), on its first request. Importing this package
costs nothing and connects to nothing.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

MOUNT_PATH = "/transactions"
"""Where Airflow mounts the app (the plugin's ``url_prefix``)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class LazyApp:
    """An ASGI app standing for ``module:attribute``, imported at the first request.

    :param target: ``"package.module:attribute"`` of the real ASGI app.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self._app: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None
        self._lock = threading.Lock()

    @property
    def app(self) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
        """The real app (imported now if it was not yet)."""
        if self._app is None:
            with self._lock:
                if self._app is None:
                    module, _, attribute = self.target.partition(":")
                    self._app = getattr(importlib.import_module(module), attribute)
        assert self._app is not None
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def __repr__(self) -> str:
        return f"LazyApp({self.target!r})"


plugin_app = LazyApp("airflow_txn_provider.ui.app:app")
"""What the plugin mounts at :data:`MOUNT_PATH` (not named ``app``: that is the submodule)."""
