"""Observation points and token sets: the names every stage uses for where a covariance was measured.

A ViT of depth ``D`` is observed at ``D + 3`` points in depth order: ``patch_embed`` (the patch
projection), ``pos_embed`` (after the positional embedding), ``block_01`` .. ``block_DD`` (each block's
output) and ``norm`` (the final norm). Each point has three token sets: ``all`` tokens, the ``cls``
token, and the ``patch`` tokens.

A CNN of ``N`` residual blocks is observed at ``N + 2`` points: ``stem`` (the first feature map),
``block_01`` .. ``block_NN`` (each residual block's output, across its stages) and ``pool`` (the pooled
feature the classifier reads). A feature map's tokens are its spatial positions (``H x W`` rows of ``C``
columns per image); ``pool`` has one token per image. A CNN has no class token: its token sets are
``all`` and ``patch`` (the same tokens).
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


def cnn_layer_names(blocks: int) -> list[str]:
    """The ``blocks + 2`` observation points of a CNN with ``blocks`` residual blocks, in depth order."""
    return ["stem", *[f"block_{i:02d}" for i in range(1, blocks + 1)], "pool"]


def layer_order(names: Iterable[str]) -> dict[str, int] | None:
    """Depth index of each observation-point name (0 = ``patch_embed``, or ``stem`` for a CNN's names),
    derived from the names alone: the position the name has in :func:`layer_names` (or
    :func:`cnn_layer_names`).

    ``norm`` (``pool``) comes after the deepest block named. Returns None when any name is not an
    observation point of either, or the names mix a ViT's and a CNN's (their depth order cannot be derived).
    """
    names = set(names)
    cnn = bool(names & {"stem", "pool"})
    if cnn and names & {"patch_embed", "pos_embed", "norm"}:
        return None
    blocks = {}
    for name in names:
        m = _BLOCK.match(name)
        if m:
            blocks[name] = int(m.group(1)) + (0 if cnn else 1)
        elif name not in ("stem", "pool", "patch_embed", "pos_embed", "norm"):
            return None
    last = max(blocks.values(), default=0 if cnn else 1) + 1
    fixed = {"stem": 0, "pool": last} if cnn else {"patch_embed": 0, "pos_embed": 1, "norm": last}
    return {name: blocks[name] if name in blocks else fixed[name] for name in names}
