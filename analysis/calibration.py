"""Calibration studies: one simulated study per call, under a claim kind's least favourable null
(``effect = 0``) or an alternative (``effect > 0``, in per-seed noise SDs), through the kind's own array-level
test. Each kind declares its scenarios (``analysis.kinds``); ``bench/calibration.py`` runs them.
"""

from __future__ import annotations

import numpy as np

from analysis.kinds import KINDS
from analysis.kinds.base import Scenario, Trial

# scenario label -> (claim kind, description of the least favourable null)
CALIBRATION_KINDS = {
    label: (kind.name, scenario.description)
    for kind in KINDS.values()
    for label, scenario in kind.calibration.items()
}


def scenario(label: str) -> Scenario:
    """The :class:`~analysis.kinds.base.Scenario` behind a calibration label."""
    if label not in CALIBRATION_KINDS:
        raise ValueError(f"unknown calibration label {label!r}")
    return KINDS[CALIBRATION_KINDS[label][0]].calibration[label]


def simulate_claim_study(label: str, n_seeds: int, effect: float, rng: np.random.Generator) -> Trial:
    """One simulated study for ``label`` (a key of CALIBRATION_KINDS) through the kind's array core.

    Returns ``p`` (one-sided in the claimed direction; NaN if no test was possible), ``covered`` (whether
    the 95% CI of the kind's effect covers the truth; None where the effect has no known true value) and
    ``warned`` (the fit recorded a warning). See ``analysis.kinds.base.Scenario``.
    """
    if label not in CALIBRATION_KINDS:
        raise ValueError(f"unknown calibration label {label!r}")
    return scenario(label).run(n_seeds, effect, rng)
