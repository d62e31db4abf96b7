"""What every layer above the rules uses, none of it a transaction's logic: metrics (StatsD),
retries with backoff (tenacity), secrets kept out of text (Airflow's masker), OpenLineage facets,
and connection credentials handed to Spark drivers."""
