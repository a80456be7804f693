"""Tooling that is not the library: the MLflow UI in headless Chromium."""
