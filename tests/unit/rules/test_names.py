"""The one name validator (airflow_txn_provider.rules.names), with hostile names at every place a
name
reaches SQL, a file path or a lake predicate."""

from __future__ import annotations

import posixpath

import pytest

from airflow_txn_provider.pipeline import TxnPipeline
from airflow_txn_provider.rules.exceptions import InvalidNameError
from airflow_txn_provider.rules.names import COLUMN, PIPELINE, SQL_NAME, check_name, quote_ident
from airflow_txn_provider.sinks import DeltaSink, IcebergSink
from airflow_txn_provider.sources.generated import GeneratedTextSource
from airflow_txn_provider.state import MapState

HOSTILE = [
    "",
    ".",
    "..",
    "../x",
    "a/b",
    "/abs",
    "a\\b",
    "a\x00b",
    "a\nb",
    "ok\n",  # a trailing newline: `$` would let it through, a full match does not
    'x" OR true OR "y',
    "x'; DROP TABLE t; --",
    "a b",
    "-rf",
    "w\u043erds",  # Cyrillic o (U+043E): a look-alike of "words"
    "\uff57ords",  # full-width w
    "a\uff0fb",  # full-width slash
    "x" * 300,
]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
@pytest.mark.parametrize("rule", [PIPELINE, SQL_NAME, COLUMN], ids=lambda r: r.kind)
def test_hostile_names_are_refused_by_every_rule(rule, name):
    with pytest.raises(InvalidNameError, match="is refused: it must be"):
        check_name(name, rule)


@pytest.mark.parametrize(
    ("rule", "name"),
    [
        (PIPELINE, "words"),
        (PIPELINE, "demo.word-count_2"),
        (PIPELINE, "7up"),
        (SQL_NAME, "word_counts"),
        (SQL_NAME, "_x1"),
        (COLUMN, "Word"),
        (COLUMN, "order"),
    ],
)
def test_plain_names_pass(rule, name):
    assert check_name(name, rule) == name


def test_a_non_string_is_refused_and_the_error_is_a_value_error():
    with pytest.raises(ValueError, match="is refused"):
        check_name(7, COLUMN)


def test_the_error_shows_a_long_name_shortened():
    with pytest.raises(InvalidNameError) as err:
        check_name("y" * 10_000, PIPELINE, what="pipeline")
    assert len(str(err.value)) < 400


def test_quoting_doubles_a_quote_so_a_name_cannot_end_the_identifier():
    assert quote_ident('a"b') == '"a""b"'
    assert quote_ident("order") == '"order"'


class TestWhereNamesGo:
    @pytest.mark.parametrize("name", [".", "..", "../up", "a/b", "a\x00", "w\u043erds"], ids=repr)
    def test_a_pipeline_name_cannot_leave_the_staging_directory(self, name):
        sink = DeltaSink("s", table_uri="/lake/t")
        with pytest.raises(InvalidNameError):
            sink.txid_dir(name, 7)
        with pytest.raises(InvalidNameError):
            TxnPipeline(name=name, source=GeneratedTextSource(), jobs=["j.py"], states=[])

    def test_every_accepted_pipeline_name_stays_under_the_staging_root(self):
        sink = DeltaSink("s", table_uri="/lake/t")
        for name in ["words", "a.b", "a..b", "_", "9"]:
            path = sink.txid_dir(name, 7)
            assert posixpath.normpath(path).startswith(sink.staging_root + "/" + name + "/")

    @pytest.mark.parametrize(
        "key", ['k" = s."k" OR true OR t."k', "k'", "a b", "", "ключ", "k\x00"], ids=repr
    )
    def test_a_merge_key_cannot_rewrite_the_delta_predicate(self, key):
        with pytest.raises(InvalidNameError, match="merge key"):
            DeltaSink("s", table_uri="/lake/t", mode="merge", keys=[key])

    def test_merge_keys_must_be_a_list_not_one_string(self):
        with pytest.raises(InvalidNameError, match="list of column names"):
            DeltaSink("s", table_uri="/lake/t", mode="merge", keys="word")

    @pytest.mark.parametrize("name", ['s"', "s/x", "..", "\u0455"], ids=repr)
    def test_sink_names_and_txid_columns(self, name):
        with pytest.raises(InvalidNameError):
            DeltaSink(name, table_uri="/lake/t")
        with pytest.raises(InvalidNameError):
            DeltaSink("s", table_uri="/lake/t", txid_column=name)

    @pytest.mark.parametrize(
        "table",
        ["/etc.x", "ns./x", "../ns.t", "ns.t/../../u", "ns.", ".t", "a.b.c", "ns.t\x00"],
        ids=repr,
    )
    def test_an_iceberg_table_cannot_leave_the_warehouse(self, table):
        with pytest.raises(InvalidNameError):
            IcebergSink("s", table=table, warehouse="/wh")

    @pytest.mark.parametrize("name", ['w"', "W", "a-b", "..", "w\u043erds", "x" * 41], ids=repr)
    def test_state_names_and_key_columns(self, name):
        with pytest.raises(InvalidNameError):
            MapState("p", name, "transactional", keys={"word": "text"})
        with pytest.raises(InvalidNameError):
            MapState("p", "words", "transactional", keys={name: "text"})
