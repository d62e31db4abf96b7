"""Schema management of the transaction log: apply the Alembic migrations, or check they were.

The library applies its own migrations (``upgrade``); a deployment that wants schema changes to be
a deliberate step opens the log with ``migrate=False`` and gets :class:`SchemaTooOldError` when the
database is behind.

A database a newer version of the library migrated (a rolling upgrade: one machine runs the new
version, another still the old one) is at a revision this library does not know: both
:func:`check` and :func:`upgrade` raise :class:`SchemaTooNewError`, whose advice is to upgrade the
library where it runs, never to downgrade the database.
"""

from __future__ import annotations

import logging
import weakref
from functools import cache
from typing import TYPE_CHECKING

from sqlalchemy import text

from airflow_txn_provider.rules.exceptions import SchemaTooNewError, SchemaTooOldError

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

VERSION_TABLE = "txn_alembic_version"
HEAD_REVISION = "0018"
"""The newest migration (``tests`` check it is Alembic's head): lets :func:`ensure` check the
schema with one query, without importing Alembic, in every task process."""
_at_head: weakref.WeakSet[Engine] = weakref.WeakSet()
"""Engines of this process whose database was seen at ``HEAD_REVISION``."""
# Serialises concurrent upgrades: many tasks may open the log at the same moment.
_MIGRATION_LOCK_KEY = 0x7478_6E5F_6D69_67  # "txn_mig"


def _alembic_config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "airflow_txn_provider.log:migrations")
    return cfg


@cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


@cache
def known_revisions() -> frozenset[str]:
    """Every revision of this library's migrations: a database at another one is newer."""
    from alembic.script import ScriptDirectory

    return frozenset(
        s.revision for s in ScriptDirectory.from_config(_alembic_config()).walk_revisions()
    )


def too_new(found: str) -> SchemaTooNewError:
    """The error for a database at revision ``found``, unknown to this library."""
    return SchemaTooNewError(
        f"the transaction log's schema is at revision {found!r}, newer than this library (knows "
        f"up to {head_revision()!r}): upgrade airflow-txn-provider on this machine (every "
        "worker, scheduler and api-server) to the version that wrote it; do not downgrade the "
        "database"
    )


def current_revision(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def ensure(engine: Engine, *, migrate: bool = True) -> None:
    """Make sure the log's schema is at this library's head, once per engine and process.

    One query when it is (the common case: a task process opening the log); otherwise
    :func:`upgrade` (``migrate``) or :func:`check`, which raises :class:`SchemaTooOldError`;
    both raise :class:`SchemaTooNewError` for a revision this library does not know.
    """
    if engine in _at_head:
        return
    with engine.connect() as conn:
        found = None
        if conn.execute(text("SELECT to_regclass(:t)"), {"t": VERSION_TABLE}).scalar():
            found = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    if found != HEAD_REVISION:
        if migrate:
            upgrade(engine)
        else:
            check(engine)
    _at_head.add(engine)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the log schema to ``revision``; safe to call from many processes at once.

    :raises SchemaTooNewError: the database is at a revision this library does not know (a newer
        version migrated it): nothing is changed.
    """
    from alembic import command

    _at_head.discard(engine)  # a downgrade (tests) must be seen by the next ensure()

    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        before = current_revision(conn)
        if before is not None and before not in known_revisions():
            raise too_new(before)  # alembic would say "Can't locate revision"
        if before == head_revision() and revision == "head":
            return
        cfg = _alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        log.info("transaction log schema upgraded from %s to %s", before, current_revision(conn))


def check(engine: Engine) -> None:
    """Raise :class:`SchemaTooOldError` unless the schema is at this library's head revision, or
    :class:`SchemaTooNewError` if it is at a revision this library does not know."""
    with engine.connect() as conn:
        found = current_revision(conn)
    if found is not None and found not in known_revisions():
        raise too_new(found)
    if found != head_revision():
        raise SchemaTooOldError(
            f"transaction log schema is at revision {found!r}, this library needs "
            f"{head_revision()!r}; run airflow_txn_provider.log.schema.upgrade(engine) "
            "or open the log with migrate=True"
        )
