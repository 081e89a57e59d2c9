"""Pre-registration binds what it says (``study.registration``): ``--force``, hand-edited seeds, a changed
``--max-seeds``, ``analyze`` and sweeps respect it; region order is not an edit; a new registration is
recorded. Runs come from the source source of ``tests/test_until_decided.py`` (seconds, no training)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from study.cli import main
from study.registration import claim_hash
from study.schema import parse_hypothesis
from tests.planted import DIFF, U
from tests.planted import write_planted as _write

STUDY = "studies/tiny"


@pytest.fixture
def source(planted):
    """``source(effect)``: runs are filled by a PlantedSource with that effect."""
    return planted


def _run(path, out, *extra) -> int:
    return main(["run", path, "--out", str(out), "--no-mlflow", "--workers", "1", "--no-report", *extra])


def _verdicts(out) -> dict:
    return json.loads((out / STUDY / "verdicts.json").read_text())


def _status(out) -> dict[str, str]:
    return {c["name"]: c["registration"]["status"] for c in _verdicts(out)["claims"]}


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_force_after_an_edit_keeps_the_claim_post_hoc(tmp_path, source, capsys):
    source(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF, U])
    assert _run(path, out) == 0
    edited = dict(U, regions={"early": ["pos_embed"], "bottleneck": ["block_02"], "late": ["norm"]})
    _write(tmp_path, [DIFF, edited])
    time.sleep(1.1)
    # straight to --force: every run retrained (bitwise the same), yet the data existed before the edit
    assert _run(path, out, "--force") == 0
    assert _status(out) == {"higher": "pre-registered", "dip": "post hoc"}
    assert _run(path, out, "--force") == 0  # and again: post hoc is sticky
    assert _status(out)["dip"] == "post hoc"
    reg = json.loads((out / STUDY / "registration.json").read_text())
    assert [e["name"] for e in reg["post_hoc"].values()] == ["dip"]
    # until the user starts a new registration, which is recorded; retrained after it, it is pre-registered
    capsys.readouterr()
    assert _run(path, out, "--force", "--new-registration", "regions fixed before new data") == 0
    assert _status(out) == {"higher": "pre-registered", "dip": "pre-registered"}
    reg = json.loads((out / STUDY / "registration.json").read_text())
    assert reg["history"][-1]["reason"] == "regions fixed before new data"
    assert len(reg["history"][-1]["previous"]["claims"]) == 3
    assert "new_registration" in _verdicts(out)["claims"][0]["registration"]


def test_new_registration_without_new_data_is_still_post_hoc(tmp_path, source):
    source(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF])
    assert _run(path, out) == 0
    time.sleep(1.1)
    assert _run(path, out, "--new-registration", "re-reading") == 0
    assert _status(out) == {"higher": "post hoc"}  # the runs finished before the new registration


def test_hand_edited_seeds_are_flagged(tmp_path, source, capsys):
    source(0.0)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF], seeds=(0, 1, 2))
    assert _run(path, out) == 0
    assert _status(out) == {"higher": "pre-registered"}
    _write(tmp_path, [DIFF], seeds=(0, 1, 2, 3, 4))
    capsys.readouterr()
    assert _run(path, out) == 0
    printed = capsys.readouterr().out
    assert _status(out) == {"higher": "post hoc"}
    assert "seeds edited from [0, 1, 2] to [0, 1, 2, 3, 4]" in printed
    reg = json.loads((out / STUDY / "registration.json").read_text())
    assert reg["edits"] == [
        {"at": reg["edits"][0]["at"], "what": "seeds", "from": [0, 1, 2], "to": [0, 1, 2, 3, 4]}
    ]


@pytest.mark.parametrize(
    "seeds, max_runs, runs_of, status",
    [
        ((0, 1, 2, 3), 299, "", "post hoc"),  # seeds edited with a no-op edit elsewhere: a new design hash
        ((0, 1), 300, "", "post hoc"),  # seeds dropped
        ((0, 1, 2), 299, "", "pre-registered"),  # a new design hash, the same runs
        ((0, 1, 2), 300, "other-model", "pre-registered"),  # every run new on the same seeds
        ((3, 4, 5), 300, "other-model", "post hoc"),  # new runs, but on other seeds than it was tested on
    ],
)
def test_register_judges_a_design_edit_by_the_claim_s_runs(tmp_path, seeds, max_runs, runs_of, status):
    from types import SimpleNamespace

    from study.registration import register, sticky_status

    def hyp_and_runs(seeds, max_runs, runs_of=""):
        data = yaml.safe_load(open(_write(tmp_path, [DIFF], seeds=seeds)))
        data["design"]["max_runs"] = max_runs
        hyp = parse_hypothesis(data)
        specs = [SimpleNamespace(key=f"{runs_of}k{s}", seed=s, dataset={"name": "objects"}) for s in seeds]
        return hyp, (specs, tmp_path / "runs")

    study = tmp_path / "studies" / "tiny"
    hyp, runs = hyp_and_runs((0, 1, 2), 300)
    register(study, hyp, runs=runs)
    (study / "verdicts.json").write_text("{}")  # the claims were tested
    hyp, runs = hyp_and_runs(seeds, max_runs, runs_of)
    reg = register(study, hyp, runs=runs)
    assert sticky_status(reg, hyp.claims)["higher"]["status"] == status
    assert [e["what"] for e in reg.get("edits", [])] == (["seeds"] if status == "post hoc" else [])


def test_a_claim_registered_after_its_runs_says_which_runs_existed(tmp_path):
    """A control file run after the default study reuses its trained runs: each claim is post hoc, and the
    reason names how many of its runs, which one first, and that reused runs count (it was said nowhere)."""
    from types import SimpleNamespace

    from study.registration import claim_status, register
    from vitstudy_core.runfolder import RunFolder

    hyp = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [DIFF]))))
    specs = [
        SimpleNamespace(key=f"k{s}", seed=s, dataset={"name": "objects"}, label=f"trained/objects/seed{s}")
        for s in (0, 1, 2)
    ]
    RunFolder(tmp_path / "runs" / "k0").write_result({"status": "finished", "finished_at": 1.0e9})
    reg = register(tmp_path / "studies" / "tiny", hyp, runs=(specs, tmp_path / "runs"), now=2.0e9)
    status = claim_status(reg, hyp, specs, tmp_path / "runs")["higher"]
    assert status["status"] == "post hoc"
    why = status["reason"]
    assert "after 1 of its 3 runs had finished (the first, trained/objects/seed0, at 2001-09-09" in why
    assert "another study of this output folder" in status["reason"]


@pytest.mark.slow  # through the CLI; test_register_judges_a_design_edit_by_the_claim_s_runs is the default
def test_seeds_edited_with_a_no_op_design_edit_are_still_flagged(tmp_path, source, capsys):
    """An edit elsewhere in the design that changes no run (here ``max_runs``) gives the design a new hash;
    the claim is judged by its runs: 3 of its 4 runs are the ones it was tested on, so it is post hoc."""
    source(0.0)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF], seeds=(0, 1, 2))
    assert _run(path, out) == 0
    data = yaml.safe_load(open(path))
    data["design"]["seeds"] = [0, 1, 2, 3]
    data["design"]["max_runs"] = 299
    open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
    capsys.readouterr()
    assert _run(path, out) == 0
    assert _status(out) == {"higher": "post hoc"}
    assert "seeds edited from [0, 1, 2] to [0, 1, 2, 3]" in capsys.readouterr().out
    reg = json.loads((out / STUDY / "registration.json").read_text())
    assert [(e["what"], e["from"], e["to"]) for e in reg["edits"]] == [("seeds", [0, 1, 2], [0, 1, 2, 3])]
    assert reg["tested_on"][claim_hash(parse_hypothesis(data).claims[0])]["seeds"] == [0, 1, 2, 3]


@pytest.mark.slow  # through the CLI; test_register_judges_a_design_edit_by_the_claim_s_runs is the default
def test_a_design_edit_that_keeps_the_runs_keeps_the_claims_pre_registered(tmp_path, source):
    source(0.0)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF], seeds=(0, 1, 2))
    assert _run(path, out) == 0
    data = yaml.safe_load(open(path))
    data["design"]["max_runs"] = 299  # a new design hash, the same runs
    open(path, "w").write(yaml.safe_dump(data, sort_keys=False))
    assert _run(path, out) == 0
    assert _status(out) == {"higher": "pre-registered"}
    assert "edits" not in json.loads((out / STUDY / "registration.json").read_text())


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_changed_max_seeds_is_refused_in_one_line(tmp_path, source, capsys):
    source(0.0)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF])
    assert _run(path, out, "--until-decided", "--max-seeds", "5", "--batch", "2") == 0
    before = (out / STUDY / "verdicts.json").read_text()
    capsys.readouterr()
    assert _run(path, out, "--until-decided", "--max-seeds", "9", "--batch", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-seeds 5 --batch 2" in err and "--max-seeds 9" in err, err
    assert _run(path, out) == 2  # dropping the plan is a change too
    assert (out / STUDY / "verdicts.json").read_text() == before
    assert _run(path, out, "--until-decided", "--max-seeds", "5", "--batch", "2") == 0  # the same plan


def test_looks_added_to_a_design_tested_without_them_are_refused(tmp_path, source, capsys):
    source(0.0)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF])
    assert _run(path, out) == 0
    capsys.readouterr()
    assert _run(path, out, "--until-decided", "--max-seeds", "9") == 2
    assert "no sequential plan" in capsys.readouterr().err


def test_analyze_shows_the_registration(tmp_path, source, capsys):
    source(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF, U])
    assert _run(path, out) == 0
    table = str(out / STUDY / "table.parquet")
    capsys.readouterr()
    assert main(["analyze", path, "--table", table, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [c["registration"]["status"] for c in got] == ["pre-registered"] * 2
    # a claim edited after the table exists: analyze never prints it as plain ACCEPTED
    edited = dict(DIFF, a={"layers": ["norm"]})  # norm is 1.0 above block_02: ACCEPTED
    _write(tmp_path, [edited, U])
    assert main(["analyze", path, "--table", table]) == 0
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("higher "))
    assert "ACCEPTED (post hoc)" in row, printed
    assert "not in the registration" in printed
    # a table with no registration beside it says so
    bare = tmp_path / "elsewhere" / "table.parquet"
    bare.parent.mkdir()
    bare.write_bytes((out / STUDY / "table.parquet").read_bytes())
    assert main(["analyze", path, "--table", str(bare)]) == 0
    assert "registration: none beside" in capsys.readouterr().out


def test_region_layers_in_another_order_are_not_an_edit(tmp_path, source):
    base = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [U]))), "h.yaml")
    flipped = dict(U, regions={"early": ["pos_embed"], "bottleneck": ["block_02"], "late": ["block_03"]})
    flipped["regions"]["early"] = ["patch_embed", "pos_embed"]
    a = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [flipped]))), "h.yaml")
    flipped["regions"]["early"] = ["pos_embed", "patch_embed"]
    b = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [flipped]))), "h.yaml")
    assert claim_hash(a.claims[0]) == claim_hash(b.claims[0]) != claim_hash(base.claims[0])
    cond = dict(DIFF, a={"layers": ["block_01", "block_02"]})
    c1 = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [cond]))), "h.yaml")
    cond["a"] = {"layers": ["block_02", "block_01"]}
    c2 = parse_hypothesis(yaml.safe_load(open(_write(tmp_path, [cond]))), "h.yaml")
    assert claim_hash(c1.claims[0]) == claim_hash(c2.claims[0])
    # end to end: reordered regions after the data exist stay pre-registered
    source(0.5)
    out = tmp_path / "out"
    flipped["regions"]["early"] = ["patch_embed", "pos_embed"]
    path = _write(tmp_path, [flipped])
    assert _run(path, out) == 0
    flipped["regions"]["early"] = ["pos_embed", "patch_embed"]
    _write(tmp_path, [flipped])
    time.sleep(1.1)
    assert _run(path, out) == 0
    assert _status(out) == {"dip": "pre-registered"}


def test_registrations_written_before_canonical_hashes_still_count(tmp_path, source):
    """A registration.json keyed by the old hash (the plain model dump) is recognised, not re-registered."""
    from vitstudy_core.hashing import digest

    source(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [U])
    assert _run(path, out) == 0
    reg_path = out / STUDY / "registration.json"
    reg = json.loads(reg_path.read_text())
    (h, entry), claim = (
        next(iter(reg["claims"].items())),
        parse_hypothesis(yaml.safe_load(open(path)), path).claims[0],
    )
    reg["claims"] = {digest(claim.model_dump(mode="json")): entry}
    reg_path.write_text(json.dumps(reg))
    time.sleep(1.1)
    assert _run(path, out) == 0
    assert _status(out) == {"dip": "pre-registered"}
    assert json.loads(reg_path.read_text())["claims"][h]["registered_at"] == entry["registered_at"]


@pytest.mark.parametrize("edit_claim", [False, True])
def test_sweep_claims_are_registered(tmp_path, source, edit_claim):
    from tests.conftest import TINY_SWEEP

    source(0.0)
    doc = yaml.safe_load(TINY_SWEEP)
    doc["design"]["checkpoints"], doc["design"]["training"]["epochs"] = [2], 2
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
    sweep_dir = out / "sweeps" / "tiny_sweep"
    reg = json.loads((sweep_dir / "registration.json").read_text())
    assert sorted(e["name"] for e in reg["claims"].values()) == sorted(c["name"] for c in doc["claims"])
    claims = json.loads((sweep_dir / "verdicts.json").read_text())["claims"]
    assert [c["registration"]["status"] for c in claims] == ["pre-registered"] * 2
    if edit_claim:
        doc["claims"][1]["level"] = 40.0
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        assert (
            main(["sweep", str(path), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
        )
        claims = json.loads((sweep_dir / "verdicts.json").read_text())["claims"]
        assert [c["registration"]["status"] for c in claims] == ["pre-registered", "post hoc"]


def test_controls_after_the_default_study_judges_each_claim_by_the_runs_it_reads(tmp_path):
    """hypotheses/controls.yaml run after the default study (hypotheses/u_shape.yaml, whose runs are its
    trained cell's): the claim on shuffled labels reads only the shuffled runs, all new, so it is
    pre-registered; every claim reading the trained runs (or their epoch 0, untrained) is post hoc.
    ``tested_on`` lists each claim's own runs (before: all 10 runs for every claim, all post hoc)."""
    from study.registration import claim_status, register
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis
    from tests.conftest import REPO
    from vitstudy_core.runfolder import RunFolder

    default = {s.key for s in plan_runs(load_hypothesis(REPO / "hypotheses" / "u_shape.yaml"))}
    hyp = load_hypothesis(REPO / "hypotheses" / "controls.yaml")
    specs = plan_runs(hyp)
    assert len(default) == 5 and default < {s.key for s in specs}
    for key in default:
        RunFolder(tmp_path / "runs" / key).write_result({"status": "finished", "finished_at": 1.0e9})
    reg = register(tmp_path / "studies" / "controls", hyp, runs=(specs, tmp_path / "runs"), now=2.0e9)
    status = {n: st["status"] for n, st in claim_status(reg, hyp, specs, tmp_path / "runs").items()}
    assert status == {
        "the objects dip exceeds both controls (trained vs untrained and shuffled)": "post hoc",
        "the dip is deeper trained than untrained": "post hoc",
        "the dip is deeper on true labels than on shuffled ones": "post hoc",
        "eed_pct dips in middle layers (objects, shuffled labels)": "pre-registered",
        "eed_pct dips in middle layers (objects, untrained)": "post hoc",
    }
    runs = {reg["claims"][h]["name"]: set(e["runs"]) for h, e in reg["tested_on"].items()}
    shuffled = {s.key for s in specs if s.condition == "shuffled"}
    assert runs["eed_pct dips in middle layers (objects, shuffled labels)"] == shuffled
    assert runs["eed_pct dips in middle layers (objects, untrained)"] == default
    assert len(runs["the objects dip exceeds both controls (trained vs untrained and shuffled)"]) == 10


def test_a_registration_from_before_per_claim_runs_is_no_edit(tmp_path):
    """A ``tested_on`` written before each claim's own runs were recorded (every run of its datasets, no
    ``reads``) is compared as it was written: rerunning the same design is no edit, and the entry is
    rewritten with the claim's own runs."""
    from study.registration import _legacy_runs, claim_hash, register, sticky_status
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis
    from tests.conftest import REPO

    hyp = load_hypothesis(REPO / "hypotheses" / "controls.yaml")
    specs, folder = plan_runs(hyp), tmp_path / "studies" / "controls"
    reg = register(folder, hyp, runs=(specs, tmp_path / "runs"), now=1.0e9)
    reg["tested_on"] = {claim_hash(c): _legacy_runs(c, specs) for c in hyp.claims}  # as written before
    (folder / "registration.json").write_text(json.dumps(reg))
    (folder / "verdicts.json").write_text("{}")  # the claims were tested
    reg = register(folder, hyp, runs=(specs, tmp_path / "runs"), now=2.0e9)
    assert {st["status"] for st in sticky_status(reg, hyp.claims).values()} == {"pre-registered"}
    assert "edits" not in reg and all(e["reads"] == "claim" for e in reg["tested_on"].values())
