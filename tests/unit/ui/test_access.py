"""Who asks, and what they may read (ui/access.py): the Transactions page asks Airflow's auth
manager, with no database."""

from __future__ import annotations

from airflow_txn_provider.ui import access as ui_access
from airflow_txn_provider.ui import model


class FakeAuthManager:
    def __init__(self, *, all_dags: bool = False, dag_ids: frozenset[str] = frozenset()):
        self.all_dags = all_dags
        self.dag_ids = dag_ids
        self.calls: list[tuple[str, object]] = []

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        self.calls.append(("is_authorized_dag", details))
        return self.all_dags

    def get_authorized_dag_ids(self, *, user, method="GET", session=None):
        self.calls.append(("get_authorized_dag_ids", method))
        return set(self.dag_ids)


def test_access_asks_the_auth_manager():
    everything = ui_access.access_for(FakeAuthManager(all_dags=True), user="admin")
    assert everything == model.DagAccess(all_dags=True)
    manager = FakeAuthManager(dag_ids=frozenset({"words"}))
    assert ui_access.access_for(manager, user="viewer") == model.DagAccess(
        dag_ids=frozenset({"words"})
    )
    assert manager.calls == [("is_authorized_dag", None), ("get_authorized_dag_ids", "GET")]
