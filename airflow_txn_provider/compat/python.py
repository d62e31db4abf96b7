"""Python 3.11's ``enum.StrEnum``, ``datetime.UTC`` and ISO 8601 parsing, on Python 3.10 too."""

from __future__ import annotations

import enum
import sys
from datetime import datetime, timezone

__all__ = ["UTC", "StrEnum", "fromisoformat"]

# datetime.UTC (3.11) is this very object.
UTC = timezone.utc

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised by `make test-matrix`'s Python 3.10 cells

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """3.11's StrEnum: members are strings, and str() and format() give the value."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]


def fromisoformat(text: str) -> datetime:
    """``datetime.fromisoformat`` as of 3.11, which reads the ``Z`` of RFC 3339 (Airflow's REST
    API and most JSON write it); 3.10 refuses it."""
    if sys.version_info < (3, 11) and text.endswith("Z"):  # pragma: no cover - 3.10 cells
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text)
