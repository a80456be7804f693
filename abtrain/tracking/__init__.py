"""MLflow: what a run records there and how its web UI shows it."""
