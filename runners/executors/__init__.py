"""Executors: where runs train, behind one small interface, registered by name (:data:`EXECUTORS`).

Public modules: ``base`` (the :class:`Executor` interface), ``local`` (the local and Ray executors and the
registry), ``gpu_workers`` (one pinned worker per GPU), ``slurm`` (Slurm job arrays), ``jobs`` (the job a
worker runs: one run source fills one run folder).
"""

from __future__ import annotations
