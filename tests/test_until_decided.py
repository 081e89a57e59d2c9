"""``run --until-decided`` and pre-registration, end to end.

A fake run source writes synthetic run folders (a planted per-seed effect in an observable, noise from the
seed), so looks are quick; one test trains real tiny models.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import yaml

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS
from tests.planted import DIFF, U  # noqa: E402
from tests.planted import write_planted as _write
from vitstudy_core.runfolder import RunFolder


def _run(path, out, *extra) -> int:
    return main(["run", path, "--out", str(out), "--no-mlflow", "--workers", "1", "--no-report", *extra])


def test_stops_early_on_a_planted_large_effect(tmp_path, planted):
    src = planted(0.5)
    path = _write(tmp_path, [DIFF])
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "9", "--batch", "3") == 0
    v = json.loads((tmp_path / "out/studies/tiny/verdicts.json").read_text())
    assert sorted(src.filled) == [0, 1, 2]  # decided at the first look: no seed added
    seq = v["sequential"]
    assert seq["stopped_at"] == 3 and len(seq["looks"]) == 1 and seq["stopped_because"].startswith("every")
    claim = v["claims"][0]
    assert claim["verdict"] == "ACCEPTED" and claim["sequential"]["decided_at_look"] == 1
    look = claim["sequential"]["looks"][0]
    assert look["p"] < look["nominal"] < 0.05 and look["fraction"] == pytest.approx(1 / 3)
    assert "nominal level of look 1" in claim["reason"]


def test_the_recorded_spending_is_the_one_the_verdicts_used_when_alphas_differ(tmp_path, planted):
    """Two confirmatory claims at alpha 0.05 and 0.01: the summary's looks spend (0.05 + 0.01) / 2 in all
    (each claim at its Holm first-step level, alpha / 2), and each claim's own spending is the one its
    verdict was tested at (the summary once spent the first claim's 0.05 for the whole family)."""
    planted(0.0)
    path = _write(tmp_path, [{**DIFF, "alpha": 0.05}, {**DIFF, "name": "strict", "alpha": 0.01}])
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "5", "--batch", "2") == 0
    v = json.loads((tmp_path / "out/studies/tiny/verdicts.json").read_text())
    looks = v["sequential"]["looks"]
    assert [lk["seeds"] for lk in looks] == [3, 5]
    assert looks[-1]["alpha_spent"] == pytest.approx(0.03)
    for claim in v["claims"]:
        own = [lk["alpha_spent"] for lk in claim["sequential"]["looks"]]
        assert [lk["by_claim"][claim["name"]] for lk in looks] == pytest.approx(own)
        assert own[-1] == pytest.approx(claim["sequential"]["level"])
    assert {c["name"]: c["sequential"]["level"] for c in v["claims"]} == pytest.approx(
        {"higher": 0.025, "strict": 0.005}
    )


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_goes_to_the_maximum_on_a_null(tmp_path, planted):
    src = planted(0.0)
    path = _write(tmp_path, [DIFF])
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "7", "--batch", "2") == 0
    v = json.loads((tmp_path / "out/studies/tiny/verdicts.json").read_text())
    assert sorted(src.filled) == list(range(7))  # the file's seeds, then 3, 4, then 5, 6
    seq = v["sequential"]
    assert [lk["seeds"] for lk in seq["looks"]] == [3, 5, 7] and seq["stopped_at"] == 7
    assert seq["stopped_because"] == "the maximum number of seeds"
    assert [round(lk["alpha_spent"], 6) for lk in seq["looks"]][-1] == 0.05
    claim = v["claims"][0]
    assert claim["verdict"] == "INCONCLUSIVE" and claim["n_seeds"] == 7
    assert [lk["seeds"] for lk in claim["sequential"]["looks"]] == [3, 5, 7]
    # a second invocation reuses every run: nothing is trained again
    src.filled.clear()
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "7", "--batch", "2") == 0
    assert src.filled == []


def test_undecided_claims_record_the_levels_they_were_tested_at(tmp_path, planted):
    """Two confirmatory claims that never cross: each was tested at its Holm share (alpha / 2) with
    t-calibrated levels, and verdicts.json says so (not the full alpha)."""
    from analysis.sequential import nominal_levels

    planted(0.0)
    other = dict(DIFF, name="higher_too", b={"layers": ["block_03"]}, a={"layers": ["block_02"]})
    path = _write(tmp_path, [DIFF, other])
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "7", "--batch", "2") == 0
    v = json.loads((tmp_path / "out/studies/tiny/verdicts.json").read_text())
    undecided = [c for c in v["claims"] if c["verdict"] == "INCONCLUSIVE"]
    assert [c["name"] for c in undecided] == ["higher"], [c["verdict"] for c in v["claims"]]
    for claim in undecided:
        seq = claim["sequential"]
        assert seq["level"] == pytest.approx(0.025)
        want = nominal_levels([3 / 7, 5 / 7, 1.0], 0.025, "obf", [3, 5, 7])
        np.testing.assert_allclose([lk["nominal"] for lk in seq["looks"]], want)
        assert "alpha 0.025" in claim["reason"]


def test_bad_sequential_options_are_one_line_errors(tmp_path, planted, capsys):
    planted(0.0)
    path = _write(tmp_path, [DIFF])
    assert _run(path, tmp_path / "out", "--until-decided", "--max-seeds", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-seeds" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_edited_claim_is_post_hoc_and_exploratory(tmp_path, planted, capsys):
    planted(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF, U])
    assert main(["run", path, "--out", str(out), "--no-mlflow", "--workers", "1"]) == 0
    study = out / "studies/tiny"
    reg = json.loads((study / "registration.json").read_text())
    assert len(reg["claims"]) == 2 and len(reg["designs"]) == 1
    v1 = json.loads((study / "verdicts.json").read_text())
    assert [c["registration"]["status"] for c in v1["claims"]] == ["pre-registered"] * 2
    assert [c["adjustment"] for c in v1["claims"]] == ["holm", "holm"]
    first = {c["name"]: c["registration"]["registered_at"] for c in v1["claims"]}

    # the regions are edited after the data exist; the other claim is unchanged
    edited = dict(U, regions={"early": ["pos_embed"], "bottleneck": ["block_02"], "late": ["norm"]})
    _write(tmp_path, [DIFF, edited])
    time.sleep(1.1)  # registration times are shown to the second
    capsys.readouterr()
    assert main(["run", path, "--out", str(out), "--no-mlflow", "--workers", "1"]) == 0
    printed = capsys.readouterr().out
    v2 = json.loads((study / "verdicts.json").read_text())
    higher, dip = v2["claims"]
    assert higher["registration"]["status"] == "pre-registered"
    assert higher["registration"]["registered_at"] == first["higher"] and higher["adjustment"] == "holm"
    assert dip["registration"]["status"] == "post hoc" and dip["adjustment"] == "holm"
    assert dip["registration"]["registered_at"] > first["dip"]
    assert len(json.loads((study / "registration.json").read_text())["claims"]) == 3
    # alone in its (exploratory) family, its p is not adjusted; the confirmatory family holds one claim
    assert dip["p_adjusted"] == pytest.approx(dip["p_value"])
    assert higher["p_adjusted"] == pytest.approx(higher["p_value"])
    assert "ACCEPTED (post hoc)" in printed and "dip: post hoc: registered" in printed
    md = (study / "report.md").read_text()
    assert "claim dip: registered" in md and "post hoc" in md and "adjusted with the exploratory claims" in md
    assert f"claim higher: registered {first['higher']}, pre-registered" in md
    html = (study / "report.html").read_text()
    assert "(post hoc)" in html and 'class="registration"' in html
    # the verdicts in the first run were confirmatory: Holm over both claims
    assert v1["claims"][0]["p_adjusted"] >= v1["claims"][0]["p_value"]


def test_registration_tags_on_the_mlflow_parent_run(tmp_path, planted):
    from mlflow.tracking import MlflowClient

    from study.tracking.store import default_tracking_uri

    planted(0.5)
    out = tmp_path / "out"
    path = _write(tmp_path, [DIFF])
    assert main(["run", path, "--out", str(out), "--workers", "1", "--no-report", "--until-decided"]) == 0
    client = MlflowClient(default_tracking_uri(out))
    exp = client.get_experiment_by_name("tiny")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`study.role` = 'study'")
    tags = parent.data.tags
    assert (
        tags["registration.claim.0"].startswith("higher: ")
        and "pre-registered" in tags["registration.claim.0"]
    )
    assert " @ " in tags["registration.design"] and tags["sequential"].startswith("1 looks")


def test_until_decided_with_real_training(tmp_path):
    """Two tiny models trained for real, one look each; the report names the looks."""
    data = yaml.safe_load(TINY_HYPOTHESIS)
    data["design"]["seeds"] = [0]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    assert (
        main(
            ["run", str(path), "--out", str(out), "--no-mlflow", "--workers", "1"]
            + ["--until-decided", "--max-seeds", "2", "--batch", "1"]
        )
        == 0
    )
    v = json.loads((out / "studies/tiny/verdicts.json").read_text())
    assert [lk["seeds"] for lk in v["sequential"]["looks"]] == [1, 2]
    for key in v["runs"]:
        result = RunFolder(out / "runs" / key).read_result()
        assert result["status"] == "finished" and result["finished_at"] > 0
    md = (out / "studies/tiny/report.md").read_text()
    assert "sequential seeds (obf spending over at most 2 seeds" in md and "look 2 (2 seeds)" in md
