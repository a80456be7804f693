"""Processes and every collective: the launch environment, A/B groups, the ledger, BatchNorm."""
