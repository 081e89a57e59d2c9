"""Sweeps: the sweep section, its claims, a tiny sweep end to end and its optuna study."""
