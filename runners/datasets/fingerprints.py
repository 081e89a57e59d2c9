"""Content fingerprints of on-disk datasets: what their run keys hold in place of a path.

Run keys use the folder's content fingerprint (:func:`dataset_fingerprint`: file paths and sizes, links
followed). ``run`` records it in ``<out>/data/fingerprints.json`` (:func:`resolve_fingerprint`), and a
host without the data (``table`` on an analysis machine) reuses the recorded one, so a hypothesis file
plans the same keys with or without the data present. No torch: the planner builds run keys with these.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from runners.datasets.folders import resolve_path, walk
from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.io import atomic_write_json

FINGERPRINTS = "fingerprints.json"  # in the data cache: the fingerprint each on-disk dataset was run with


def _files(root: Path) -> list[tuple[str, int]]:
    """Sorted ``(relative path, size in bytes)`` of every non-hidden file under ``root``, links followed."""
    out = []
    for folder, files in walk(root):
        for fn in files:
            p = os.path.join(folder, fn)
            try:
                size = os.path.getsize(p)
            except OSError:  # a broken link: listed, so that fixing it changes the fingerprint
                size = -1
            out.append((os.path.relpath(p, root), size))
    return out


def dataset_fingerprint(spec: dict) -> str | None:
    """sha256 (16 hex digits) of the folder's sorted (relative path, size) list; None if it is absent.

    Files are listed as :func:`~runners.datasets.folders.walk` does (links followed, hidden entries
    skipped), so a folder of links into an ImageNet tree is fingerprinted by the images the links reach.
    """
    root = resolve_path(spec["path"], strict=False)
    if root is None or not root.is_dir():
        return None
    return digest(_files(root), 16)


def fingerprint_record_key(spec: dict) -> str:
    """The entry of a dataset in ``fingerprints.json``: ``<kind>:<name>``."""
    return f"{spec['kind']}:{spec['name']}"


def recorded_fingerprints(data_dir: str | Path) -> dict[str, dict]:
    """The ``fingerprints.json`` of a data cache: ``{"<kind>:<name>": {"fingerprint", "path", ...}}``."""
    path = Path(data_dir) / FINGERPRINTS
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(
            f"unreadable fingerprint record ({exc}); delete it to re-record", str(path)
        ) from None


def resolve_fingerprint(spec: dict, data_dir: str | Path | None = None, record: bool = False) -> str | None:
    """The content fingerprint that keys the runs of an on-disk dataset (``spec["path"]`` resolved).

    * ``record=True`` (``run``, the data present): the folder's own fingerprint, written to
      ``data_dir/fingerprints.json`` under ``<kind>:<name>`` (the previous value is kept in ``history``).
      The folder's content wins: if it changed since it was recorded, its runs get new keys.
    * otherwise (``table``, ``validate``): the recorded fingerprint if ``data_dir`` holds one, so the keys
      are those the runs were trained under whether or not the data are on this host; else the folder's
      own fingerprint; else None (keys unknown).
    """
    if not record:
        entry = (
            recorded_fingerprints(data_dir).get(fingerprint_record_key(spec))
            if data_dir is not None
            else None
        )
        return entry["fingerprint"] if entry else dataset_fingerprint(spec)
    fingerprint = dataset_fingerprint(spec)
    if fingerprint is None or data_dir is None:
        return fingerprint
    book = recorded_fingerprints(data_dir)
    old = book.get(fingerprint_record_key(spec))
    if old is None or old["fingerprint"] != fingerprint:
        history = ([old["fingerprint"], *old.get("history", [])] if old else [])[:20]
        book[fingerprint_record_key(spec)] = {
            "fingerprint": fingerprint,
            "path": str(spec["path"]),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "history": history,
        }
        atomic_write_json(Path(data_dir) / FINGERPRINTS, book, indent=1, sort_keys=True)
    return fingerprint
