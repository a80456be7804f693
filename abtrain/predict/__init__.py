"""What a run will send, take and keep, computed without training: traffic, time, footprint."""

# The time model's error against the committed benchmark (tests/abtrain/test_plan_cli.py holds
# every method's time to the target within it): methods predicted closer than this are a tie.
# Here, not in `timing`, which imports torch: the report reads it to word a tie.
MODEL_ERROR = 0.10
