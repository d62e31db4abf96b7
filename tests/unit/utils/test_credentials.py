"""Credentials stay out of arguments (credentials.py) and of every text stored or shown
(redaction.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_txn_provider.rules.exceptions import InvalidNameError, TxnConfigError
from airflow_txn_provider.sinks import IcebergSink, sink_from_spec
from airflow_txn_provider.spark.generated_source import GeneratedTextSource
from airflow_txn_provider.spark.job import BatchJob
from airflow_txn_provider.utils import credentials, redaction

SECRET = "pl4nted-S3cret"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(redaction, "_secrets", set())


class TestRedact:
    @pytest.mark.parametrize(
        "text",
        [
            f"postgresql://ice:{SECRET}@db:5432/cat",
            f"postgresql+psycopg://ice:{SECRET}@db/cat?sslmode=require",
            f"could not open catalog (jdbc:postgresql://u:{SECRET}@h/x): refused",
            f"host=db user=ice password={SECRET} dbname=cat",
            f"host=db password='{SECRET}' dbname=cat",
            f"...?user=ice&password={SECRET}&sslmode=require",
        ],
    )
    def test_passwords_in_urls_and_keyword_strings(self, text):
        out = redaction.redact(text)
        assert SECRET not in out and "***" in out

    def test_a_registered_secret_anywhere_in_a_text(self):
        text = f"the job printed {SECRET} in its error"
        assert redaction.redact(text) == text  # not known yet, not URL-shaped
        redaction.register_secret(SECRET)
        assert redaction.redact(text) == "the job printed *** in its error"

    def test_texts_without_secrets_are_kept(self):
        text = "pipeline=p txid=3 attempt=1: processing failed: ValueError: bad row 'a:b@c'"
        assert redaction.redact(text) == text
        assert redaction.redact_optional(None) is None

    def test_very_short_secrets_are_not_replaced_everywhere(self):
        redaction.register_secret("ab")
        assert redaction.redact("table abc") == "table abc"


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


def test_a_connection_is_looked_up_by_airflow_from_the_environment_and_registered(tmp_path):
    """In a process of its own: Airflow's lookup reads AIRFLOW_CONN_<ID>, and the password is
    known to the redaction from then on."""
    code = (
        "from airflow_txn_provider.utils import credentials as c, redaction as r\n"
        "url = c.connection_url('ice_cat')\n"
        "print('url:', url)\n"
        f"print('redacted:', r.redact('driver said: ' + {SECRET!r}))\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW_CONN_ICE_CAT": f"postgresql://ice:{SECRET}@127.0.0.1:5433/cat?sslmode=disable",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    # (Airflow 3.1 logs its lookup on stdout too)
    said = dict(line.split(" ", 1) for line in out if line.startswith(("url: ", "redacted: ")))
    assert said["url:"] == f"postgresql+psycopg://ice:{SECRET}@127.0.0.1:5433/cat?sslmode=disable"
    assert said["redacted:"] == "driver said: ***"


def test_a_missing_connection_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_CAT", raising=False)
    with pytest.raises(
        TxnConfigError, match=r"'no_such_cat' \(the catalog\).*AIRFLOW_CONN_NO_SUCH_CAT"
    ):
        credentials.connection_url("no_such_cat", what="the catalog")


def test_an_unreadable_connection_names_the_failure_but_never_its_text(monkeypatch):
    """A connection URI Airflow cannot parse: the error says which way the lookup failed (the
    exception's type), and not its text, which may quote the password."""
    monkeypatch.setenv("AIRFLOW_CONN_BAD_CAT", f"postgresql://ice:{SECRET}@127.0.0.1:notaport/cat")
    with pytest.raises(
        TxnConfigError, match=r"'bad_cat' \(the catalog\) is missing or unreadable \(\w+\)"
    ) as err:
        credentials.connection_url("bad_cat", what="the catalog")
    assert SECRET not in str(err.value)


def test_a_task_hands_its_driver_the_url_in_the_environment(monkeypatch, tmp_path):
    """A task looks the connection up with Airflow and hands the URL over; the driver, which
    cannot import Airflow (a task's children inherit a metadata-database URL it refuses), reads
    it from there and knows the password secret."""
    monkeypatch.setenv("AIRFLOW_CONN_ICE_CAT", f"postgresql://ice:{SECRET}@127.0.0.1/cat")
    env = credentials.connection_env(["ice_cat", "ice_cat"])
    assert env == {"TXN_CONN_URL__ICE_CAT": f"postgresql+psycopg://ice:{SECRET}@127.0.0.1:5432/cat"}
    code = (
        "from airflow_txn_provider.utils import credentials as c, redaction as r\n"
        "print(c.connection_url('ice_cat'))\n"
        f"print(r.redact('driver said: ' + {SECRET!r}))\n"
        "import sys; print('airflow' in sys.modules)\n"
    )
    child_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "airflow-db-not-allowed:///",  # as a task sets it
        **env,
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [env["TXN_CONN_URL__ICE_CAT"], "driver said: ***", "False"]


def test_a_driver_log_line_is_redacted_before_it_leaves_the_process(caplog):
    import logging

    redaction.register_secret(SECRET)
    logger = logging.getLogger("txn.test.redacting")
    handler = logging.StreamHandler()
    handler.addFilter(redaction.RedactingFilter())
    caplog.handler.addFilter(redaction.RedactingFilter())
    logger.addHandler(handler)
    try:
        logger.warning("catalog %s said %s", f"postgresql://u:{SECRET}@h/db", SECRET)
    finally:
        logger.removeHandler(handler)
    assert caplog.messages == ["catalog postgresql://u:***@h/db said ***"]
