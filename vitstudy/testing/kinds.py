"""Contract checks of the claim kinds (:data:`analysis.kinds.KINDS`).

A kind passes when its example claim validates through the real hypothesis schema, its table adapter
returns a well-formed ``Outcome`` on a simulated study, its verdict, figures and explanation come out, a
claim naming a dataset the table lacks fails with one line, and each calibration scenario runs through
the kind's own array test, at one look and at several.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from analysis.kinds import KINDS, FigureContext
from analysis.kinds.base import ClaimBase, Outcome, TableView
from analysis.report.figures import Figure
from analysis.simulate import simulate_study_table
from analysis.verdicts import ACCEPTED, INCONCLUSIVE, REJECTED, evaluate_claims
from vitstudy_core.errors import StudyError

DESIGN = {
    "datasets": [{"name": "objects"}, {"name": "mixed"}, {"name": "textures", "variant": "textures"}],
    "seeds": [0, 1, 2, 3, 4],
    "checkpoints": [0, 2, 4],
}
# the conditions a cross-condition kind's example may name
CONDITIONS = ("trained", "untrained")


@lru_cache(maxsize=1)
def _plain_table() -> pd.DataFrame:
    return simulate_study_table(
        n_seeds=5, datasets=("objects", "mixed", "textures"), epochs=(0, 2, 4), seed=3
    )


@lru_cache(maxsize=1)
def _conditions_table() -> pd.DataFrame:
    """The same study in two conditions: as simulated, and with extra noise (another condition's runs)."""
    plain = _plain_table()
    noisy = plain.assign(value=plain.value + np.random.default_rng(4).normal(0, 1.0, len(plain)))
    return pd.concat([t.assign(condition=c) for c, t in zip(CONDITIONS, (plain, noisy), strict=True)])


def _names_conditions(kind: str) -> bool:
    return "condition" in str(KINDS[kind].example)


def table_for(kind: str) -> pd.DataFrame:
    """The simulated tidy table a kind's example is checked on (with conditions if the example names some)."""
    return _conditions_table() if _names_conditions(kind) else _plain_table()


def example_hypothesis(kind: str, **override: object):  # -> study.schema.Hypothesis
    """A hypothesis over :data:`DESIGN` whose one claim is the kind's ``example`` (``override`` on top)."""
    from study.schema import Design, parse_hypothesis

    design: dict = dict(DESIGN)
    if _names_conditions(kind) and "conditions" in Design.model_fields:
        design["conditions"] = [{"name": "trained"}, {"name": "untrained", "untrained": True}]
    doc = {
        "name": "t",
        "design": design,
        "claims": [{"name": f"{kind} example", **KINDS[kind].example, **override}],
    }
    return parse_hypothesis(doc)


def check_kind_model(kind: str) -> None:
    """The model is a ``ClaimBase`` registered under its own ``kind`` literal, with an example of it."""
    entry = KINDS[kind]
    assert issubclass(entry.model, ClaimBase) and entry.name == kind
    literal: Any = entry.model.model_fields["kind"].annotation
    assert literal.__args__ == (kind,), f"{kind}: kind literal"
    assert entry.example and entry.example["kind"] == kind, f"{kind}: example claim"


def check_kind_evaluates(kind: str) -> None:
    """The example validates, evaluates to a well-formed Outcome and a verdict that round-trips."""
    hyp = example_hypothesis(kind)
    claim = hyp.claims[0]
    assert type(claim) is KINDS[kind].model
    out = KINDS[kind].evaluate(TableView(table_for(kind)), claim, where="contract", excluded={})
    assert isinstance(out, Outcome)
    assert 0.0 <= out.p_value <= 1.0 and math.isfinite(out.effect), (
        f"{kind}: p {out.p_value}, effect {out.effect}"
    )
    assert out.ci[0] <= out.ci[1] and out.seeds_used == [0, 1, 2, 3, 4]
    assert all(isinstance(w, str) and "\n" not in w for w in out.warnings)
    (result,) = evaluate_claims(hyp, table_for(kind))
    assert result.verdict in (ACCEPTED, REJECTED, INCONCLUSIVE) and result.kind == kind
    assert result.to_dict()["details"] == result.from_dict(result.to_dict()).to_dict()["details"]


def check_kind_figures_and_explanation(kind: str) -> None:
    """Its figures are PNGs that say what they plotted; its explanation is lines of text."""
    hyp = example_hypothesis(kind)
    (result,) = evaluate_claims(hyp, table_for(kind))
    figures = KINDS[kind].figures(FigureContext(table_for(kind), hyp.claims[0], result))
    assert figures and all(isinstance(f, Figure) for f in figures)
    assert all(f.png and f.png.startswith(b"\x89PNG") for f in figures), [f.missing for f in figures]
    assert all(f.plotted.get("epochs") and f.plotted.get("datasets") for f in figures)
    lines = KINDS[kind].explain(hyp.claims[0], result)
    assert lines and all(isinstance(x, str) and x for x in lines)


def check_kind_missing_dataset_is_one_line(kind: str) -> None:
    """A claim over a dataset the table lacks is a one-line ``StudyError`` naming the file and claim."""
    table = table_for(kind)
    small = table[table.dataset != ("textures" if "textures" in str(KINDS[kind].example) else "objects")]
    try:
        evaluate_claims(example_hypothesis(kind), small, source="f.yaml")
    except StudyError as err:
        assert "\n" not in str(err) and str(err).startswith("f.yaml: claims[0]"), str(err)
    else:
        raise AssertionError(f"{kind}: a dataset missing from the table raised nothing")


def check_kind_calibration(kind: str) -> None:
    """Every calibration scenario runs at effect 0 and above, one shot and at several looks; a single
    look at S seeds is exactly the one-shot study."""
    for label, sc in KINDS[kind].calibration.items():
        assert sc.sequential, f"{kind}/{label}: not split into draw + test"
        simulate = sc.simulate
        assert simulate is not None, f"{kind}/{label}: no simulate"
        for effect in (0.0, 2.0):
            r = simulate(5, effect, np.random.default_rng(0))
            assert (
                {"p", "covered", "warned"} <= set(r) <= {"p", "covered", "warned", "contradicted", "fallback"}
            )
            assert math.isnan(r["p"]) or 0.0 <= r["p"] <= 1.0
            assert r["covered"] in (None, True, False) and isinstance(r["warned"], bool)
            one = simulate(6, effect, np.random.default_rng(1))
            (look,) = sc.at_looks([6], effect, np.random.default_rng(1))
            assert one == look or (math.isnan(one["p"]) and math.isnan(look["p"])), f"{kind}/{label}"
            looks = sc.at_looks([3, 4, 6], effect, np.random.default_rng(2))
            assert len(looks) == 3 and all(isinstance(x["contradicted"], bool) for x in looks)


CHECKS = {
    "kinds": [
        check_kind_model,
        check_kind_evaluates,
        check_kind_figures_and_explanation,
        check_kind_missing_dataset_is_one_line,
        check_kind_calibration,
    ]
}
