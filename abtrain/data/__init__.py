"""The data: sources, prepared folders and their checks, the step-indexed loader."""
