"""The provider's metadata (get_provider_info.py), read by Airflow's ProvidersManager: the hooks
and their connection type registered as the hook itself answers."""

from __future__ import annotations

from airflow_txn_provider.get_provider_info import get_provider_info
from airflow_txn_provider.hooks.txn_log import TxnLogHook


def test_provider_info_registers_the_hooks():
    info = get_provider_info()
    modules = {m for h in info["hooks"] for m in h["python-modules"]}
    assert {
        "airflow_txn_provider.hooks.txn_log",
        "airflow_txn_provider.hooks.spark_submit",
    } <= modules
    types = {c["connection-type"]: c for c in info["connection-types"]}
    assert "spark" not in types  # the Spark provider's type: TxnSparkSubmitHook registers none
    txn_log = types["txn_log"]
    assert txn_log["hook-class-name"] == "airflow_txn_provider.hooks.txn_log.TxnLogHook"
    assert txn_log["hook-name"] == TxnLogHook.hook_name
    # the UI reads this without importing the hook: the same as the hook's own answer
    behaviour = TxnLogHook.get_ui_field_behaviour()
    assert txn_log["ui-field-behaviour"] == {
        "hidden-fields": behaviour["hidden_fields"],
        "relabeling": behaviour["relabeling"],
        "placeholders": behaviour["placeholders"],
    }
