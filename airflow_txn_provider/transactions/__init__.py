"""A txid's life across the log, the states and the lake tables, each step one Postgres
transaction: declaring a pipeline, beginning and claiming txids, leases, the ordered commit,
retention and rewind, behind one facade (:class:`.transaction_log.TransactionLog`)."""
