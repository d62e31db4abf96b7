"""Ordered Spark batch transactions on Apache Airflow (Storm's transactional topologies)."""

from __future__ import annotations

__version__ = "0.1.0"
