"""Spark side: sources Spark reads, the processing job runtime, and the two submission paths."""
