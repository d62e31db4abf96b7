"""Python 3.11's ``enum.StrEnum`` and ``datetime.UTC``, on Python 3.10 too."""

from __future__ import annotations

import enum
import sys
from datetime import timezone

__all__ = ["UTC", "StrEnum"]

# datetime.UTC (3.11) is this very object.
UTC = timezone.utc

if sys.version_info >= (3, 11):
    StrEnum = enum.StrEnum
else:  # pragma: no cover - exercised by `make test-matrix`'s Python 3.10 cells

    class StrEnum(str, enum.Enum):  # type: ignore[no-redef]
        """3.11's StrEnum: members are strings, and str() and format() give the value."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]
