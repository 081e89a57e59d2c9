"""Calibration scenarios: a kind's :class:`Scenario` (its least favourable null and alternatives, through
its array-level test) and the :class:`Trial` one simulated study returns (what ``bench/calibration.py``
counts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np


class Trial(TypedDict, total=False):
    """One simulated study of a calibration :class:`Scenario` (what ``bench/calibration.py`` counts).

    ``p``: one-sided p in the claimed direction (NaN: no test); ``covered``: the 95% CI of the effect
    covers the truth (None: no known truth); ``warned``: the fit recorded a warning; ``contradicted``: the
    verdict rule would REJECT; ``fallback``: a mixed-model trend fell back to the per-seed slopes.
    """

    p: float
    covered: bool | None
    warned: bool
    contradicted: bool
    fallback: bool


@dataclass(frozen=True)
class Scenario:
    """One calibration scenario of a kind: its least favourable null at ``effect = 0`` and alternatives.

    ``simulate(n_seeds, effect, rng)`` runs one simulated study through the kind's array-level test and
    returns a :class:`Trial` (``p``, ``covered``, ``warned``). ``effect`` is in per-seed noise SDs.

    A scenario may instead give the two halves, so a sequential design can test the first ``n`` seeds of
    one simulated study at each look (:meth:`at_looks`): ``draw(n_seeds, effect, rng) -> (arrays, truth)``
    (a tuple of arrays, the seed on the first axis of each, and the true effect or None) and
    ``test(arrays, truth, rng) -> Trial`` (also ``contradicted``, and for a mixed-model trend
    ``fallback``). ``simulate`` is then ``test(*draw(...))``.

    ``reference``: the row shows another test on this null for comparison (bench/calibration.py prints it
    and does not require its bound).

    ``boundary(n_seeds, rng) -> (arrays, truth)``: the least favourable case of the REJECTED rule, a
    claim that is just true (every contrast it needs at 0, the others where they can do most harm);
    its rate of ``contradicted`` is the rule's error rate, at most 2.5% (:data:`REJECT_LEVEL`). None:
    ``draw(n_seeds, 0.0, rng)``, which is that case for a claim of one contrast.
    """

    description: str
    simulate: Callable[[int, float, np.random.Generator], Trial] | None = None
    draw: Callable[[int, float, np.random.Generator], tuple[tuple[np.ndarray, ...], Any]] | None = None
    test: Callable[[tuple[np.ndarray, ...], Any, np.random.Generator], Trial] | None = None
    boundary: Callable[[int, np.random.Generator], tuple[tuple[np.ndarray, ...], Any]] | None = None
    # a reference row: a test shown beside a kind's own on the same null, whose level it is not meant to
    # hold (the unadjusted slope on an adjusted claim's confounded null); its bound is not checked
    reference: bool = False

    def __post_init__(self) -> None:
        if self.simulate is None:
            draw, test = self.draw, self.test
            if draw is None or test is None:
                raise ValueError(f"scenario {self.description!r}: give simulate, or draw and test")
            object.__setattr__(self, "simulate", lambda n, effect, rng: test(*draw(n, effect, rng), rng))

    def run(self, n_seeds: int, effect: float, rng: np.random.Generator) -> Trial:
        """One simulated study of ``n_seeds`` seeds at ``effect`` (per-seed noise SDs)."""
        assert self.simulate is not None  # set by __post_init__
        return self.simulate(n_seeds, effect, rng)

    def rejected_at_boundary(self, n_seeds: int, rng: np.random.Generator) -> bool:
        """One simulated study at the REJECTED rule's least favourable case: would the rule REJECT?"""
        if self.test is None or self.draw is None:
            raise ValueError(f"scenario {self.description!r} has no draw and test")
        arrays, truth = self.boundary(n_seeds, rng) if self.boundary else self.draw(n_seeds, 0.0, rng)
        return bool(self.test(arrays, truth, rng).get("contradicted", False))

    @property
    def sequential(self) -> bool:
        """The scenario can be tested at several looks of one study."""
        return self.draw is not None and self.test is not None

    def at_looks(self, looks: list[int], effect: float, rng: np.random.Generator) -> list[Trial]:
        """One study of ``max(looks)`` seeds, tested on its first ``n`` seeds for each ``n`` in ``looks``."""
        if self.draw is None or self.test is None:
            raise ValueError(f"scenario {self.description!r} is not sequential (it has no draw and test)")
        arrays, truth = self.draw(max(looks), effect, rng)
        return [self.test(tuple(a[:n] for a in arrays), truth, rng) for n in looks]
