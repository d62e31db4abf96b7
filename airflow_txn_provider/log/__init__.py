"""The transaction log's tables in Postgres: the SQLAlchemy models and their Alembic migrations
(:mod:`.schema`), a pipeline's rows read and written inside a caller's database transaction
(:mod:`.rows`, :mod:`.reads`), the fenced status changes of one txid (:mod:`.txid_transitions`),
the declared outputs (:mod:`.outputs`), and what the log says about a pipeline's health and
alerts. The rules decide; this package stores."""
