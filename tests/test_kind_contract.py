"""One contract over every registered claim kind (as the metric registry has one over every metric).

A kind passes when its example claim validates through the real hypothesis schema, its table adapter
returns a well-formed Outcome on a simulated study, its verdict, figures and explanation come out, a
claim naming a dataset the table lacks fails with one line, and each calibration scenario runs through
the kind's own array test.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.figures import Figure
from analysis.kinds import KINDS, FigureContext
from analysis.kinds._claim import ClaimBase
from analysis.kinds._outcome import Outcome
from analysis.kinds._table import TableView
from analysis.simulate import simulate_study_table
from analysis.verdicts import ACCEPTED, INCONCLUSIVE, REJECTED, evaluate_claims
from study.schema import parse_hypothesis
from vitstudy_core.errors import StudyError

DESIGN = {
    "datasets": [{"name": "objects"}, {"name": "mixed"}, {"name": "textures", "variant": "textures"}],
    "seeds": [0, 1, 2, 3, 4],
    "checkpoints": [0, 2, 4],
}


# the conditions the cross-condition kinds' examples name (analysis.kinds.versus)
CONDITIONS = ("trained", "untrained")


def _plain_table():
    return simulate_study_table(
        n_seeds=5, datasets=("objects", "mixed", "textures"), epochs=(0, 2, 4), seed=3
    )


@pytest.fixture(scope="module")
def plain_table():
    return _plain_table()


@pytest.fixture(scope="module")
def conditions_table(plain_table):
    """The same study in two conditions: as simulated, and with extra noise (another condition's runs)."""
    noisy = plain_table.assign(
        value=plain_table.value + np.random.default_rng(4).normal(0, 1.0, len(plain_table))
    )
    return pd.concat([t.assign(condition=c) for c, t in zip(CONDITIONS, (plain_table, noisy), strict=True)])


def _names_conditions(kind: str) -> bool:
    return "condition" in str(KINDS[kind].example)


@pytest.fixture
def table(request, plain_table, conditions_table):
    """The table a kind's example is tested on: with conditions when the example names some."""
    return conditions_table if _names_conditions(request.node.callspec.params["kind"]) else plain_table


def _claim(kind: str, **override):
    from study.schema_design import Design

    design = dict(DESIGN)
    if _names_conditions(kind) and "conditions" in Design.model_fields:  # a design with conditions
        design["conditions"] = [{"name": "trained"}, {"name": "untrained", "untrained": True}]
    doc = {
        "name": "t",
        "design": design,
        "claims": [{"name": f"{kind} example", **KINDS[kind].example, **override}],
    }
    return parse_hypothesis(doc)


@pytest.mark.parametrize("kind", list(KINDS))
def test_model_is_registered_under_its_kind(kind):
    entry = KINDS[kind]
    assert issubclass(entry.model, ClaimBase) and entry.name == kind
    assert entry.model.model_fields["kind"].annotation.__args__ == (kind,)
    assert entry.example and entry.example["kind"] == kind


@pytest.mark.parametrize("kind", list(KINDS))
def test_evaluate_gives_a_well_formed_outcome(kind, table):
    hyp = _claim(kind)
    claim = hyp.claims[0]
    assert type(claim) is KINDS[kind].model
    out = KINDS[kind].evaluate(TableView(table), claim, where="contract", excluded={})
    assert isinstance(out, Outcome)
    assert 0.0 <= out.p_value <= 1.0 and math.isfinite(out.effect)
    assert out.ci[0] <= out.ci[1] and out.seeds_used == [0, 1, 2, 3, 4]
    assert all(isinstance(w, str) and "\n" not in w for w in out.warnings)
    (result,) = evaluate_claims(hyp, table)
    assert result.verdict in (ACCEPTED, REJECTED, INCONCLUSIVE) and result.kind == kind
    assert result.to_dict()["details"] == result.from_dict(result.to_dict()).to_dict()["details"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_figures_and_explanation(kind, table):
    hyp = _claim(kind)
    (result,) = evaluate_claims(hyp, table)
    figures = KINDS[kind].figures(FigureContext(table, hyp.claims[0], result))
    assert figures and all(isinstance(f, Figure) for f in figures)
    assert all(f.png and f.png.startswith(b"\x89PNG") for f in figures), [f.missing for f in figures]
    assert all(f.plotted.get("epochs") and f.plotted.get("datasets") for f in figures)
    lines = KINDS[kind].explain(hyp.claims[0], result)
    assert lines and all(isinstance(x, str) and x for x in lines)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_dataset_the_table_lacks_is_one_line(kind, table):
    hyp = _claim(kind)
    small = (
        table[table.dataset != "textures"]
        if "textures" in str(KINDS[kind].example)
        else table[table.dataset != "objects"]
    )
    with pytest.raises(StudyError) as err:
        evaluate_claims(hyp, small, source="f.yaml")
    assert "\n" not in str(err.value) and str(err.value).startswith("f.yaml: claims[0]")


@pytest.mark.parametrize("label", [(k, lab) for k in KINDS for lab in KINDS[k].calibration], ids=str)
def test_calibration_scenarios_run(label):
    kind, lab = label
    rng = np.random.default_rng(0)
    for effect in (0.0, 2.0):
        r = KINDS[kind].calibration[lab].simulate(5, effect, rng)
        assert {"p", "covered", "warned"} <= set(r) <= {"p", "covered", "warned", "contradicted", "fallback"}
        assert math.isnan(r["p"]) or 0.0 <= r["p"] <= 1.0
        assert r["covered"] in (None, True, False) and isinstance(r["warned"], bool)


@pytest.mark.parametrize("label", [(k, lab) for k in KINDS for lab in KINDS[k].calibration], ids=str)
def test_calibration_scenarios_test_the_first_seeds_at_each_look(label):
    """Every scenario splits into draw + test, so a sequential design tests one study at several looks;
    a single look at S seeds is exactly the one-shot study."""
    kind, lab = label
    sc = KINDS[kind].calibration[lab]
    assert sc.sequential
    for effect in (0.0, 2.0):
        one = sc.simulate(6, effect, np.random.default_rng(1))
        (look,) = sc.at_looks([6], effect, np.random.default_rng(1))
        assert one == look or (math.isnan(one["p"]) and math.isnan(look["p"]))
        looks = sc.at_looks([3, 4, 6], effect, np.random.default_rng(2))
        assert len(looks) == 3 and all(isinstance(r["contradicted"], bool) for r in looks)
