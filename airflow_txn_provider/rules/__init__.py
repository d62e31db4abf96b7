"""The rules: what a transaction may do, as pure functions and values (no I/O, no Airflow, no
Postgres, no Spark).

The coordinator's rules (:mod:`.coordinator`: begin, claim, commit in txid order, the failure
cascade), the fencing of attempts (:mod:`.fencing`), what waits for what (:mod:`.waiting`),
retention and rewind (:mod:`.history`), the source protocol (:mod:`.sources`), and the words they
are written in (:mod:`.vocabulary`, :mod:`.records`, :mod:`.exceptions`, :mod:`.config`). Every
layer above imports from here; this package imports nothing of the provider but itself
(``tests/unit/test_house.py``).
"""
