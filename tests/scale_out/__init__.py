"""Executors and clusters: leases, Ray, Slurm, GPU workers and the GPU check."""
