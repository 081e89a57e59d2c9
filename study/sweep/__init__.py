"""Sweeps: optuna trials over a design dataset's knobs, each trial's seeds run through the stages.

Public modules: ``loop`` (``python -m study sweep``: the trial loop, :func:`run_sweep`), ``storage``
(optuna's study and its storage), ``storage_check`` (a storage URL checked before anything runs), ``trials`` (one trial's runs and knob point), ``report`` (a sweep's
report). Private: ``_heartbeat`` (trials whose driver is gone), ``_tables`` (the sweep's tables).
"""

from __future__ import annotations
