"""Process setup and every collective: the launch environment, A/B process groups, the ledger, BatchNorm across ranks."""
