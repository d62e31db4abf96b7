"""Credentials stay out of arguments (credentials.py: looked up by Airflow, handed to a driver in
its environment; an Iceberg catalog's: tests/unit/sinks/test_iceberg.py), and the passwords looked
up are known to the redaction of every text stored or shown (its own rules: test_redaction.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_txn_provider.rules.exceptions import TxnConfigError
from airflow_txn_provider.utils import credentials, redaction

SECRET = "pl4nted-S3cret"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(redaction, "_secrets", set())


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
