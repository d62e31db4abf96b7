"""An Iceberg sink's catalog credentials (sinks/iceberg.py) stay out of its declaration and of
the job's arguments: a catalog URL with a password is refused, a connection id travels instead."""

from __future__ import annotations

import json

import pytest

from airflow_txn_provider.rules.exceptions import InvalidNameError, TxnConfigError
from airflow_txn_provider.sinks import IcebergSink, sink_from_spec
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.utils import redaction

SECRET = "pl4nted-S3cret"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(redaction, "_secrets", set())


class TestIcebergCatalogCredentials:
    def test_a_catalog_url_with_a_password_is_refused(self):
        for uri in (
            f"postgresql://ice:{SECRET}@db/cat",
            f"postgresql://db/cat?password={SECRET}",
        ):
            with pytest.raises(TxnConfigError, match="catalog_conn_id") as err:
                IcebergSink("s", table="ns.t", warehouse="/wh", catalog_uri=uri)
            assert SECRET not in str(err.value)

    def test_a_url_without_one_and_a_connection_id_are_kept(self):
        IcebergSink("s", table="ns.t", warehouse="/wh", catalog_uri="postgresql://ice@db/cat")
        with pytest.raises(TxnConfigError, match="not both"):
            IcebergSink(
                "s", table="ns.t", warehouse="/wh", catalog_uri="sqlite://", catalog_conn_id="c"
            )
        with pytest.raises(InvalidNameError):
            IcebergSink("s", table="ns.t", warehouse="/wh", catalog_conn_id="x=y\x00")

    def test_the_job_arguments_carry_the_connection_id_only(self, monkeypatch):
        monkeypatch.setenv("AIRFLOW_CONN_ICE_CAT", f"postgresql://ice:{SECRET}@127.0.0.1/cat")
        sink = IcebergSink("s", table="ns.t", warehouse="/wh", catalog_conn_id="ice_cat")
        args = BatchJob("p", 1, 1, GeneratedTextSource(), sinks=(sink,)).to_args()
        assert SECRET not in " ".join(args)
        spec = json.loads(args[args.index("--sinks") + 1])[0]
        assert spec["args"]["catalog_conn_id"] == "ice_cat" and spec["args"]["catalog_uri"] is None
        assert sink_from_spec(spec) == sink and sink.conn_ids == ("ice_cat",)
