"""Hyperparameter search over abtrain runs: Propulate under mpirun, and Optuna."""
