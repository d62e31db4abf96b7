"""Downstream of a transaction pipeline: runs when txids of ``example_txn_delta_words`` commit.

Scheduled on the Asset that every commit of the Delta example updates
(``txn:example_txn_delta_words:word_counts``), so it only ever sees committed data. Each Asset
event carries the committed ``txid`` and table ``version`` in its extra; the task reads the table
*as of* the newest txid it was triggered for (later commits may already be in the table: reading
as of the txid keeps the run reproducible) and reports that txid's rows and the running totals.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, Asset, task

from txn_examples import examples_data_dir

UPSTREAM = "example_txn_delta_words"
ASSET = f"txn:{UPSTREAM}:word_counts"

with DAG(
    dag_id="example_txn_lake_downstream",
    schedule=[Asset.ref(name=ASSET)],
    tags=["example", "lake"],
    doc_md=__doc__,
) as dag:

    @task
    def summarize(triggering_asset_events: Any = None) -> dict[str, Any]:
        import pyarrow.compute as pc

        from airflow_txn_provider import DeltaSink

        txid, uri = None, str(examples_data_dir() / "lake" / "delta_words")
        for events in (triggering_asset_events or {}).values():
            for event in events:
                if (event.extra or {}).get("txid") and (txid is None or event.extra["txid"] > txid):
                    txid = int(event.extra["txid"])
                    uri = event.asset.uri.removeprefix("file://")
        sink = DeltaSink("word_counts", table_uri=uri, txid_column="txid")
        if txid is None:  # run by hand: the newest committed txid
            txid = sink.open().committed_txid(UPSTREAM)
        if not txid:
            return {"txid": 0, "rows": 0}
        table = sink.read_as_of(UPSTREAM, txid)
        mine = table.filter(pc.equal(table["txid"], txid))
        summary = {
            "txid": txid,
            "rows": table.num_rows,
            "words": pc.sum(table["delta"]).as_py(),
            "txid_words": pc.sum(mine["delta"]).as_py() or 0,
        }
        print(f"as of txid {txid}: {summary}")
        return summary

    summarize()
