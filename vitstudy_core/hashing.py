"""Canonical JSON and the digests built on it: run keys, spec hashes, data-cache names, fingerprints.

Two forms exist because stored keys were written with both and must not change: ``compact`` (separators
``,`` and ``:``; run keys, spec hashes, folder fingerprints) and the ``json.dumps`` default separators
(data-cache file names). Keys are always sorted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def canonical_json(obj: Any, compact: bool = True) -> str:
    """``obj`` as JSON with sorted keys (compact separators unless ``compact=False``)."""
    if compact:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return json.dumps(obj, sort_keys=True)


def digest(obj: Any, length: int | None = None, compact: bool = True) -> str:
    """sha256 hex of ``obj``'s canonical JSON, cut to ``length`` hex digits (None: all 64)."""
    return hashlib.sha256(canonical_json(obj, compact).encode()).hexdigest()[:length]


def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 hex of a file's bytes, read in ``chunk``-byte pieces (a checkpoint need not fit in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
