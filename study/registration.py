"""Pre-registration: what a study declared before its data existed, and what binds it.

Before ``run`` trains anything it records, in ``studies/<name>/registration.json`` (atomic write), a hash
of each claim's canonical form (``vitstudy_core.hashing.digest`` of the claim's ``model_dump``, with the
layers of a region or a condition as a set: listing them in another order is not an edit) and of the
design, each with the time it was first seen::

    {"claims": {<hash>: {"name", "registered_at" (ISO 8601, UTC), "registered_ts" (unix s), "claim"}},
     "designs": {<hash>: {"registered_at", "registered_ts", "design"}},
     "sequential": {<hash of the design>: {max_seeds, batch, spending}},
     "post_hoc": {<claim hash>: {"name", "since", "reason"}},      # sticky: see below
     "tested_on": {<claim hash>: {"runs": [<run key>], "seeds": [...], "reads": "claim"}},  # its runs
     "edits": [{"at", "what": "seeds" | "runs", "from", "to"}],
     "history": [{"started_at", "reason", "previous": <the registration it replaced>}]}

A claim that stays the same keeps its first registration. A claim whose hash is new is registered now;
if some of the runs it is tested on (:func:`claim_specs`: the runs of the datasets and the conditions it
reads, not every run of the file) had finished before that (``RunFolder.finished_at``), it was written
after its data existed: its status is ``post hoc`` and the verdicts adjust it with the exploratory claims
(``analysis.verdicts.families``), never the confirmatory ones. What binds:

* post hoc is sticky: it is recorded under ``post_hoc`` the first time it is seen (before anything is
  trained, so ``run --force``, which retrains the same seeds to bitwise the same spectra, cannot make an
  edited claim pre-registered), and stays until the user starts a new registration
  (``run --new-registration REASON``), which is recorded under ``history`` with the one it replaced;
* a design edit is judged by the runs each claim is tested on, not by the design's hash: each claim's
  planned runs are recorded under ``tested_on`` (run keys and seeds); once the claims were tested (the
  study folder holds ``verdicts.json``), a claim whose planned runs now differ from those (seeds added
  or dropped, alone or with any other edit) is post hoc (testing again on more seeds at the full alpha
  is optional stopping: use ``--until-decided``), and the edit is recorded under ``edits``; except when
  every run is new on the same seeds (another model, other data): data that did not exist when the
  claims were registered;
* a design's sequential plan (``--max-seeds``, ``--batch``, ``--spending``) is fixed by its first
  ``--until-decided`` run: another plan, dropping it, or adding one to a design already tested without
  it is refused with one line (:func:`check_binding`), since each would spend alpha again;
* ``analyze`` reads the registration beside the table (:func:`for_table`) and sweeps register their
  claims (``sweeps/<name>/registration.json``).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone  # not datetime.UTC: Python 3.11+, and 3.10 is supported
from pathlib import Path

from vitstudy_core.errors import StudyError
from vitstudy_core.hashing import digest
from vitstudy_core.io import atomic_write_json
from vitstudy_core.runfolder import RunFolder

REGISTRATION = "registration.json"
PRE, POST_HOC = "pre-registered", "post hoc"


_CONDITION_KEYS = {"dataset", "token_set", "epoch", "layers", "condition"}
# fields added with conditions (issue 23), left out of a claim's dump at their defaults so that a claim
# registered before they existed keeps its hash (and its registration)
_NEW_DEFAULTS: dict[str, object] = {
    "condition": None,
    "controls": [],
    "adjust_for": None,
    "uncertainty": "seeds",
    "match_tokens": None,
    "unit": None,  # unit: seeds, images or models (None: the default, seeds)
}


def _dump(claim) -> dict:
    """The claim's ``model_dump`` (JSON mode) without the fields of :data:`_NEW_DEFAULTS` at their default."""

    def strip(obj):
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        if not isinstance(obj, dict):
            return obj
        return {k: strip(v) for k, v in obj.items() if not (k in _NEW_DEFAULTS and v == _NEW_DEFAULTS[k])}

    return strip(claim.model_dump(mode="json"))


def _canonical(obj):
    """A claim dump with the layers of each region and each condition sorted: they are averaged (or the
    region's minimum taken), so their order carries no meaning. A kind's own ``layers`` list keeps its
    order (a trend's layers pair with depths)."""
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: _canonical(v) for k, v in obj.items()}
    if isinstance(out.get("regions"), dict):
        out["regions"] = {k: sorted(v) if isinstance(v, list) else v for k, v in out["regions"].items()}
    if isinstance(out.get("layers"), list) and set(out) <= _CONDITION_KEYS:
        out["layers"] = sorted(out["layers"])
    return out


def claim_hash(claim) -> str:
    """sha256 of the claim's canonical form (every field, defaults filled in, region layers as sets)."""
    return digest(_canonical(_dump(claim)))


def _legacy_hashes(claim) -> list[str]:
    """The hashes registrations written before region layers were sets used (still recognised): of the
    plain dump without the conditions' fields at their defaults (as they were written), and with them."""
    return [digest(_dump(claim)), digest(claim.model_dump(mode="json"))]


def _registered(data: dict, claim) -> tuple[str, dict | None]:
    """(the claim's hash, its registration entry or None), under its hash or a legacy hash."""
    claims, h = data.get("claims", {}), claim_hash(claim)
    return h, claims.get(h) or next((claims[k] for k in _legacy_hashes(claim) if k in claims), None)


def design_hash(design) -> str:
    d = design.model_dump(mode="json")
    if not d.get("probe", {}).get("blocks"):  # probe blocks off: the hash designs had before blocks existed
        d["probe"] = {k: v for k, v in d["probe"].items() if k != "blocks"}
    return digest(d)


def _stamp(now: float) -> dict:
    return {"registered_at": _iso(now), "registered_ts": now}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


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


def _plan_text(plan: dict | None) -> str:
    if not plan:
        return "no sequential plan (one fixed-sample look)"
    return f"--max-seeds {plan['max_seeds']} --batch {plan['batch']} --spending {plan['spending']}"


def check_binding(study_dir: Path, hyp, sequential: dict | None) -> None:
    """Refuse (one-line StudyError) a sequential plan that differs from the design's registered one.

    Args:
        sequential: the plan this invocation asks for (``max_seeds``, ``batch``, ``spending``) or None.
    """
    data = read_registration(study_dir)
    dh = design_hash(hyp.design)
    registered = data.get("sequential", {}).get(dh)
    tested = dh in data.get("designs", {}) and (Path(study_dir) / "verdicts.json").exists()
    if registered is None and not (sequential and tested):
        return
    if registered is not None and dict(registered) == dict(sequential or {}):
        return
    raise StudyError(
        f"this design was registered with {_plan_text(registered)}, this run asks for "
        f"{_plan_text(sequential)}: changing the plan after registration spends alpha again; run with the "
        "registered plan, or start a new registration (run --new-registration REASON)",
        str(Path(study_dir) / REGISTRATION),
        "--max-seeds",
    )


def start_new(study_dir: Path, reason: str, now: float | None = None) -> dict:
    """Start a new registration of a study (``run --new-registration REASON``): the current one moves to
    ``history`` with the time and the reason, and every claim registers afresh on this run."""
    if not reason.strip():
        raise StudyError("--new-registration: expected a reason (recorded with the new registration)")
    now = time.time() if now is None else now
    old = read_registration(study_dir)
    history = old.pop("history", [])
    history.append({"started_at": _iso(now), "started_ts": now, "reason": reason, "previous": old})
    data = {"claims": {}, "designs": {}, "history": history, "fresh": True}
    Path(study_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(study_dir) / REGISTRATION, data, indent=1, sort_keys=True)
    return data


def _mark_post_hoc(data: dict, claim, now: float, reason: str) -> None:
    """Record ``claim`` as post hoc (sticky) unless it already is."""
    data.setdefault("post_hoc", {}).setdefault(
        claim_hash(claim), {"name": claim.name, "since": _iso(now), "reason": reason}
    )


def _conditions_read(claim) -> set[str] | None:
    """The conditions ``claim`` reads (None: every condition: it names none, or a part of it reads the rows
    of every condition, e.g. an operand without a condition under a subset without one)."""
    named = {c for _, c in claim.conditions_named()}
    subset = getattr(getattr(claim, "subset", None), "condition", None)
    if not named or (subset is None and any(c.condition is None for _, _, c in claim.operands())):
        return None
    return named


def claim_specs(claim, specs) -> list:
    """The planned runs ``claim`` reads: those of the datasets it names and, in a design with conditions,
    of the conditions it names (an untrained condition reads its trained twin's epoch-0 rows, so the
    twin's runs); what the claim's registration is judged by."""
    named, conditions = set(claim.datasets_named()), _conditions_read(claim)
    mine = [s for s in specs if s.dataset["name"] in named]
    if conditions is None:
        return mine
    return [
        s
        for s in mine
        if getattr(s, "condition", None) in conditions
        or conditions & set(getattr(s, "epoch0_conditions", ()))
    ]


def _finished(claim, specs, runs_dir: Path) -> tuple[list[tuple[float, str]], int]:
    """((finish time, label) of each finished run ``claim`` reads (:func:`claim_specs`), earliest first;
    how many of them are planned)."""
    mine = claim_specs(claim, specs)
    done = [(t, s.label) for s in mine if (t := RunFolder(Path(runs_dir) / s.key).finished_at()) is not None]
    return sorted(done), len(mine)


def _earliest_finish(claim, specs, runs_dir: Path) -> float | None:
    """The earliest finish time (unix s) of the runs ``claim`` reads (None: none)."""
    done, _ = _finished(claim, specs, runs_dir)
    return done[0][0] if done else None


def _late_reason(now: float, done: list[tuple[float, str]], planned: int) -> str:
    """Why a claim registered at ``now`` is post hoc: which of its runs existed already, and what that means
    (runs reused from another study of the folder, e.g. a control file's trained cell, count too)."""
    first_t, first = done[0]
    return (
        f"registered {_iso(now)}, after {len(done)} of its {planned} runs had finished (the first, {first}, "
        f"at {_iso(first_t)}; runs reused from an earlier invocation or from another study of this output "
        "folder count): its data existed before the claim"
    )


def _claim_runs(claim, specs) -> dict:
    """The planned runs ``claim`` is tested on (:func:`claim_specs`): keys and seeds, sorted; ``reads``
    says they are the claim's own runs (entries without it, written before, hold every run of the datasets
    the claim names, whatever its conditions)."""
    mine = claim_specs(claim, specs)
    keys, seeds = sorted({s.key for s in mine}), sorted({int(s.seed) for s in mine})
    return {"runs": keys, "seeds": seeds, "reads": "claim"}


def _legacy_runs(claim, specs) -> dict:
    """A ``tested_on`` entry as registrations before ``reads`` wrote it (every run of the named datasets)."""
    named = set(claim.datasets_named())
    mine = [s for s in specs if s.dataset["name"] in named]
    return {"runs": sorted({s.key for s in mine}), "seeds": sorted({int(s.seed) for s in mine})}


def _runs_edited(data: dict, hyp, specs, tested: bool, now: float) -> dict[str, dict]:
    """Per claim hash, the ``edits`` entry of a claim whose planned runs differ from those it was tested on,
    unless every run is new on the same seeds (another model or other data); {} before any test.

    Judged by the runs, not the design's hash: ``seeds:`` edited together with an edit that changes no run
    is still an edit of the seeds."""
    before, out = data.get("tested_on", {}), dict[str, dict]()
    if not tested:
        return out
    for claim in hyp.claims:
        h = claim_hash(claim)
        old = before.get(h)
        new = _claim_runs(claim, specs) if not old or "reads" in old else _legacy_runs(claim, specs)
        if not old or set(old["runs"]) == set(new["runs"]):
            continue
        if not set(old["runs"]) & set(new["runs"]) and old["seeds"] == new["seeds"]:
            continue  # every run new on the declared seeds (another model, other data): fresh data
        if old["seeds"] != new["seeds"]:
            out[h] = {"at": _iso(now), "what": "seeds", "from": old["seeds"], "to": new["seeds"]}
        else:
            out[h] = {"at": _iso(now), "what": "runs", "from": len(old["runs"]), "to": len(new["runs"])}
    return out


def _edit_reason(edit: dict) -> str:
    if edit["what"] == "seeds":
        return f"design seeds edited from {edit['from']} to {edit['to']} after the claims were tested"
    return (
        f"its runs changed after it was tested ({edit['from']} planned runs then, {edit['to']} now, some "
        "of them the same)"
    )


def _seeds_edited(data: dict, design: dict, tested: bool, now: float) -> dict | None:
    """The ``edits`` entry when ``design`` is a registered design with other seeds and the claims were
    tested on it already; else None."""
    rest = {k: v for k, v in design.items() if k != "seeds"}
    for entry in data.get("designs", {}).values():
        old = entry.get("design")
        if (
            old
            and old.get("seeds") != design.get("seeds")
            and {k: v for k, v in old.items() if k != "seeds"} == rest
        ):
            if tested:
                return {"at": _iso(now), "what": "seeds", "from": old["seeds"], "to": design["seeds"]}
    return None


def register(
    study_dir: Path,
    hyp,
    sequential: dict | None = None,
    now: float | None = None,
    runs: tuple | None = None,
    force: bool = False,
    data_existed: bool = False,
) -> dict:
    """Add the claims and the design that are new to ``registration.json``; return the whole registration.

    Args:
        hyp: the validated hypothesis (its file's own seeds: the design as declared).
        sequential: the declared sequential plan (``max_seeds``, ``batch``, ``spending``), if any.
        now: the registration time (unix seconds; default: now).
        runs: ``(specs, runs_dir)``, the planned runs of the file's design: a claim new here whose runs
            had finished is post hoc from now on (sticky), whatever is retrained later.
        data_existed: without ``runs`` (a sweep): a claim new here is post hoc (its folder held verdicts).
        force: this invocation retrains every run (``--force``): right after a new registration the old
            runs are replaced, so they do not make its claims post hoc.
    """
    now = time.time() if now is None else now
    data = read_registration(study_dir)
    fresh = bool(data.pop("fresh", False)) and force
    tested = (Path(study_dir) / "verdicts.json").exists()
    claims, designs = data.setdefault("claims", {}), data.setdefault("designs", {})
    for claim in hyp.claims:
        h, entry = _registered(data, claim)
        if entry is not None:
            claims.setdefault(h, entry)  # a legacy hash moves to the canonical one, with its first time
            continue
        claims[h] = {"name": claim.name, **_stamp(now), "claim": _dump(claim)}
        done, planned = _finished(claim, *runs) if runs is not None else ([], 0)
        if (data_existed or done) and not fresh:
            why = (
                _late_reason(now, done, planned)
                if done
                else f"registered {_iso(now)}, after some of its runs had finished"
            )
            _mark_post_hoc(data, claim, now, why)
    dh, dump = design_hash(hyp.design), hyp.design.model_dump(mode="json")
    by_runs = _runs_edited(data, hyp, runs[0], tested, now) if runs is not None else {}
    for claim in hyp.claims:
        if (edit := by_runs.get(claim_hash(claim))) is not None:
            _mark_post_hoc(data, claim, now, _edit_reason(edit))
    for edit in {json.dumps(e, sort_keys=True): e for e in by_runs.values()}.values():
        data.setdefault("edits", []).append(edit)
    if dh not in designs:
        # registrations from before ``tested_on``, and sweeps (no runs): judged by the designs' seeds
        edit = None if data.get("tested_on") and runs is not None else _seeds_edited(data, dump, tested, now)
        if edit is not None:
            data.setdefault("edits", []).append(edit)
            for claim in hyp.claims:
                _mark_post_hoc(data, claim, now, _edit_reason(edit))
        designs[dh] = {**_stamp(now), "design": dump}
    if runs is not None:
        tested_on = data.setdefault("tested_on", {})
        tested_on.update({claim_hash(c): _claim_runs(c, runs[0]) for c in hyp.claims})
    if sequential:
        data.setdefault("sequential", {}).setdefault(dh, dict(sequential))
    atomic_write_json(Path(study_dir) / REGISTRATION, data, indent=1, sort_keys=True)
    return data


def _sticky(registration: dict, h: str) -> dict | None:
    return registration.get("post_hoc", {}).get(h)


def _started(registration: dict) -> dict:
    """``{"new_registration": "<time>: <reason>"}`` when the study started a new registration, else {}."""
    hist = registration.get("history") or []
    return {"new_registration": f"{hist[-1]['started_at']}: {hist[-1]['reason']}"} if hist else {}


def claim_status(registration: dict, hyp, specs, runs_dir: Path) -> dict[str, dict]:
    """Per claim name: ``hash``, ``registered_at``, ``status`` (pre-registered or post hoc) and, when post
    hoc, ``data_from`` (the earliest finish time, ISO, of the runs it is tested on) or ``reason``.

    A claim's runs are the planned runs it reads (:func:`claim_specs`; ``specs``: ``study.runspecs.RunSpec``);
    a claim recorded post hoc (sticky, see the module docstring) stays post hoc.
    """
    out = {}
    for claim in hyp.claims:
        h, reg = _registered(registration, claim)
        if reg is None:
            raise StudyError(
                f"claim {claim.name!r} is not registered (register before testing)", REGISTRATION
            )
        earliest = _earliest_finish(claim, specs, runs_dir)
        late = earliest is not None and earliest < reg["registered_ts"]
        sticky = _sticky(registration, h)
        entry = {
            "hash": h,
            "registered_at": reg["registered_at"],
            "status": POST_HOC if late or sticky else PRE,
        }
        if late and earliest is not None:  # late implies it; the check narrows the type
            entry["data_from"] = _iso(earliest)
        if sticky:
            entry["reason"] = sticky["reason"]
        out[claim.name] = {**entry, **_started(registration)}
    return out


def sticky_status(registration: dict, claims) -> dict[str, dict]:
    """Per claim name, its status from the registration alone (no run folders: a sweep, ``analyze``): post
    hoc when recorded so, or when the claim is not registered at all (written after the data existed)."""
    out = {}
    for claim in claims:
        h, reg = _registered(registration, claim)
        sticky = _sticky(registration, h)
        if reg is None:
            entry = {"hash": h, "registered_at": "never", "status": POST_HOC}
            entry["reason"] = "not in the registration: written after the data existed"
        else:
            entry = {"hash": h, "registered_at": reg["registered_at"], "status": POST_HOC if sticky else PRE}
            if sticky:
                entry["reason"] = sticky["reason"]
        out[claim.name] = {**entry, **_started(registration)}
    return out


def for_table(table: Path, hyp) -> tuple[set[str], dict[str, dict], str | None]:
    """What ``analyze`` knows of a table's registration: ``registration.json`` beside the table.

    Returns:
        (the post hoc claim names, per claim name its status entry, a note line or None). Without a
        registration file nothing is known: no status, and the note says so.
    """
    folder = Path(table).parent
    if not (folder / REGISTRATION).exists():
        return set(), {}, f"registration: none beside {table} (the claims' registration status is unknown)"
    status = sticky_status(read_registration(folder), hyp.claims)
    return {n for n, st in status.items() if st["status"] == POST_HOC}, status, None


def attach(results, status: dict[str, dict]) -> None:
    """Set each result's ``registration`` from ``status`` (claim name -> entry), where it has one."""
    for r in results:
        if r.name in status:
            r.registration = status[r.name]


def evaluate_registered(registration: dict, hyp, claims, table, source: str) -> list:
    """A sweep's claims (``claims``, a subset of ``hyp.claims``) tested on ``table``, post hoc ones adjusted
    as exploratory, each result carrying its registration status (:func:`sticky_status`); [] when there
    are no claims or no rows."""
    from analysis.verdicts import evaluate_claims

    if not claims or not len(table):
        return []
    status = sticky_status(registration, claims)
    post_hoc = {n for n, st in status.items() if st["status"] == POST_HOC}
    results = evaluate_claims(
        hyp.model_copy(update={"claims": list(claims)}), table, source, post_hoc=post_hoc
    )
    attach(results, status)
    return results
