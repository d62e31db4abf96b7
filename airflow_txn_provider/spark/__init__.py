"""Spark side: the processing job runtime, its sessions and work slots, the fill's computation."""
