"""Faults and hardening: kills at every point, disk full and read-only folders, damaged runs, stopping, file modes, no unpickling."""
