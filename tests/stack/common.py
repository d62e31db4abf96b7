"""What the stack test's modules share: a timestamped line, and a wait with its last error."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, every: float = 5) -> Any:
    """``predicate()``'s first true answer, asked every ``every`` s (an exception counts as no);
    ``TimeoutError`` naming ``what`` and the last exception after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            found = predicate()
            if found:
                return found
        except Exception as err:
            last_error = err
        time.sleep(every)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s (last error: {last_error!r})")
