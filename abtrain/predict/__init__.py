"""What a run will send, take and keep, computed without training: traffic, time, footprint."""
