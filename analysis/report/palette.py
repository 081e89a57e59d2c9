"""One colour per condition, decided once per study: every figure that draws a condition colours it alike.

Imports nothing: the figure modules and the report share it.
"""

from __future__ import annotations

from collections.abc import Iterable

# matplotlib's default cycle without C2, the accuracy axis's green: a condition never looks like accuracy
CONDITION_PALETTE = ("C0", "C1", "C3", "C4", "C5", "C6", "C7", "C8", "C9")


def condition_colours(conditions: Iterable[str]) -> dict[str, str]:
    """One colour per condition: the study's conditions in sorted order take the palette in turn (a
    palette's worth and more repeat it). Depends only on the set of names, so every figure of a study
    that is given the study's conditions colours each one alike."""
    names = sorted(set(map(str, conditions)))
    return {name: CONDITION_PALETTE[i % len(CONDITION_PALETTE)] for i, name in enumerate(names)}
