"""abtrain: AB training (Coquelin et al.) and its baselines, with exact traffic accounting."""
