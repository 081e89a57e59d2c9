"""Observation points and token sets: the names every stage uses for where a covariance was measured.

A ViT of depth ``D`` is observed at ``D + 3`` points in depth order: ``patch_embed`` (the patch
projection), ``pos_embed`` (after the positional embedding), ``block_01`` .. ``block_DD`` (each block's
output) and ``norm`` (the final norm). Each point has three token sets: ``all`` tokens, the ``cls``
token, and the ``patch`` tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, get_args

TokenSet = Literal["all", "cls", "patch"]  # the type of a token-set field in a hypothesis file
TOKEN_SETS: tuple[str, ...] = get_args(TokenSet)
_BLOCK = re.compile(r"^block_(\d+)$")


def layer_names(depth: int) -> list[str]:
    """The ``depth + 3`` observation points of a ViT with ``depth`` blocks, in depth order."""
    return ["patch_embed", "pos_embed", *[f"block_{i:02d}" for i in range(1, depth + 1)], "norm"]


def layer_order(names: Iterable[str]) -> dict[str, int] | None:
    """Depth index of each observation-point name (0 = ``patch_embed``), derived from the names alone.

    ``norm`` comes after the deepest block named. Returns None when any name is not an observation point
    of :func:`layer_names` (its depth order cannot be derived).
    """
    names = set(names)
    blocks = {}
    for name in names:
        m = _BLOCK.match(name)
        if m:
            blocks[name] = int(m.group(1)) + 1
        elif name not in ("patch_embed", "pos_embed", "norm"):
            return None
    fixed = {"patch_embed": 0, "pos_embed": 1, "norm": max(blocks.values(), default=1) + 1}
    return {name: blocks[name] if name in blocks else fixed[name] for name in names}
