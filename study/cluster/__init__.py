"""Studies on clusters: submit to Ray or Slurm, the status of every study, and the flags and GPU costs.

Public modules: ``jobs`` (``submit`` and ``status`` on a running Ray cluster, reachability checks),
``slurm_submit`` (a study's driver as a Slurm job), ``slurm_flags`` and ``gpu_flags`` (the executor
options ``run``/``sweep``/``submit`` parse), ``gpu_cost`` (GPU-hours a plan needs).
"""

from __future__ import annotations
