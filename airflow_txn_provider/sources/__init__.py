"""Sources: the built-in sources (Parquet, landing folders, Kafka, generated text), how each
finds new data (the catalog in the log's Postgres) and how a Spark job reads a batch."""
