"""abtrain's own training run around the method: the loop, checkpoints, results, evaluation."""
