"""Pre-registration: what a study declared before its data existed.

Before ``run`` trains anything it records, in ``studies/<name>/registration.json`` (atomic write), a hash
of each claim's canonical form (``vitstudy_core.hashing.digest`` of the claim's ``model_dump``) and of the design,
each with the time it was first seen::

    {"claims": {<hash>: {"name", "registered_at" (ISO 8601, UTC), "registered_ts" (unix s), "claim"}},
     "designs": {<hash>: {"registered_at", "registered_ts"}},
     "sequential": {<hash of the design>: {max_seeds, batch, spending}}}

A claim that stays the same keeps its first registration. A claim whose hash is new is registered now;
if some of the runs it is tested on had finished before that (``vitstudy_core.runfolder.RunFolder.finished_at``),
it was written after its data existed: its status is ``post hoc`` and the verdicts adjust it with the
exploratory claims (``analysis.verdicts.families``), never the confirmatory ones.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.io import atomic_write_json
from vitstudy_core.runfolder import RunFolder

REGISTRATION = "registration.json"
PRE, POST_HOC = "pre-registered", "post hoc"


def claim_hash(claim) -> str:
    """sha256 of the claim's canonical form (every field, defaults filled in)."""
    return digest(claim.model_dump(mode="json"))


def design_hash(design) -> str:
    return digest(design.model_dump(mode="json"))


def read_registration(study_dir: Path) -> dict:
    """``registration.json`` of a study folder ({} when there is none). A corrupt file is an error."""
    path = Path(study_dir) / REGISTRATION
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data.get("claims", {}), dict):
            raise ValueError("'claims' is not a mapping")
        return data
    except (OSError, ValueError, AttributeError) as exc:
        raise StudyError(
            f"cannot read the registration ({exc}); expected the JSON `run` wrote", str(path)
        ) from None


def register(study_dir: Path, hyp, sequential: dict | None = None, now: float | None = None) -> dict:
    """Add the claims and the design that are new to ``registration.json``; return the whole registration.

    Args:
        hyp: the validated hypothesis (its file's own seeds: the design as declared).
        sequential: the declared sequential plan (``max_seeds``, ``batch``, ``spending``), if any.
        now: the registration time (unix seconds; default: now).
    """
    now = time.time() if now is None else now
    stamp = {
        "registered_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "registered_ts": now,
    }
    data = read_registration(study_dir)
    claims, designs = data.setdefault("claims", {}), data.setdefault("designs", {})
    for claim in hyp.claims:
        claims.setdefault(
            claim_hash(claim), {"name": claim.name, **stamp, "claim": claim.model_dump(mode="json")}
        )
    dh = design_hash(hyp.design)
    designs.setdefault(dh, dict(stamp))
    if sequential:
        data.setdefault("sequential", {}).setdefault(dh, dict(sequential))
    atomic_write_json(Path(study_dir) / REGISTRATION, data, indent=1, sort_keys=True)
    return data


def claim_status(registration: dict, hyp, specs, runs_dir: Path) -> dict[str, dict]:
    """Per claim name: ``hash``, ``registered_at``, ``status`` (pre-registered or post hoc) and, when post
    hoc, ``data_from``: the earliest finish time (ISO) of the runs it is tested on.

    A claim's runs are the planned runs of the datasets it names (``specs``: ``study.runspecs.RunSpec``).
    """
    out = {}
    for claim in hyp.claims:
        h = claim_hash(claim)
        reg = registration.get("claims", {}).get(h)
        if reg is None:
            raise StudyError(
                f"claim {claim.name!r} is not registered (register before testing)", REGISTRATION
            )
        named = set(claim.datasets_named())
        finished = [
            t
            for s in specs
            if s.dataset["name"] in named
            and (t := RunFolder(Path(runs_dir) / s.key).finished_at()) is not None
        ]
        earliest = min(finished, default=None)
        post_hoc = earliest is not None and earliest < reg["registered_ts"]
        entry = {"hash": h, "registered_at": reg["registered_at"], "status": POST_HOC if post_hoc else PRE}
        if post_hoc:
            entry["data_from"] = datetime.fromtimestamp(earliest, UTC).isoformat(timespec="seconds")
        out[claim.name] = entry
    return out
