"""Fixtures of the file sources' unit tests."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from airflow_txn_provider.sources import file_index


@pytest.fixture
def footers_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files whose footer was opened, in order (a test module may narrow it)."""
    opened: list[str] = []
    real = pq.ParquetFile

    def counting(file, *args, **kwargs):
        opened.append(os.path.basename(str(file)))
        return real(file, *args, **kwargs)

    file_index.file_offsets.cache_clear()
    monkeypatch.setattr(pq, "ParquetFile", counting)
    return opened
