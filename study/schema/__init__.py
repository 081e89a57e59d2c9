"""Hypothesis file schema: pydantic models with ``extra="forbid"``, loaded with ``yaml.safe_load``.

A hypothesis file has a ``name``, a ``description``, a ``design`` (what to train and measure) and a
list of ``claims`` (what to test on the measurements). ``load_hypothesis`` turns a file into a validated
:class:`Hypothesis` or raises :class:`~vitstudy_core.errors.StudyError` with one line naming the file, the
field and what was expected. Nothing in a hypothesis file executes.

This module is the top-level :class:`Hypothesis` model, its cross-checks between design, claims and sweep,
and the entry points that validate data or a file into it. Its parts live beside it: ``study.schema._design``
(the design), ``study.schema._unions`` (the plug-in unions: datasets, objectives, sources, claims),
``study.schema._sweep`` (the sweep), ``study.schema._errors`` (pydantic's errors as one line) and
``study.schema._yaml`` (the hardened YAML loader).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from analysis.kinds.base import Condition, Subset  # noqa: F401 - part of the schema's public names
from analysis.observables import ALL_METRICS
from runners.datasets.procedural import ProceduralDataset
from study.schema._conditions import FieldError as _FieldError
from study.schema._design import Design
from study.schema._errors import _study_error
from study.schema._sweep import Sweep, sweep_of  # noqa: F401 - sweep_of: part of the public names
from study.schema._unions import Claim
from study.schema._yaml import _read_yaml
from vitstudy_core.errors import StudyError
from vitstudy_core.knobs import INTEGER_KNOBS
from vitstudy_core.settings import Strict


def with_data_roots(hyp: Hypothesis, roots: dict[str, str], file: str | None = None) -> Hypothesis:
    """A copy of ``hyp`` whose on-disk datasets named in ``roots`` (name -> folder) get those paths.

    The name ``source`` sets the path (template) of an import source (``design.source.path``).
    """
    known = {d.name: d for d in hyp.design.datasets}
    source = hyp.design.source
    for name in roots:
        if (name not in known or not hasattr(known[name], "path")) and not (name == "source" and source):
            disk = sorted(n for n, d in known.items() if hasattr(d, "path")) + (["source"] if source else [])
            raise StudyError(
                f"expected the name of an on-disk dataset {disk}, got {name!r}", file, "--data-root"
            )
    datasets = [
        d.model_copy(update={"path": roots[d.name]}) if d.name in roots and d.name in known else d
        for d in hyp.design.datasets
    ]
    update: dict = {"datasets": datasets}
    if source is not None and "source" in roots:
        update["source"] = source.model_copy(update={"path": roots["source"], "paths": None})
    return hyp.model_copy(update={"design": hyp.design.model_copy(update=update)})


NAME_MAX = 128  # the study's name is a folder name (studies/<name>, <name>.lock) and an MLflow experiment's


class Hypothesis(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=NAME_MAX)
    description: str = ""
    design: Design
    claims: list[Claim] = Field(min_length=1)
    sweep: Sweep | None = None
    # every claim at a matched token count unless it sets its own match_tokens (analysis.probe)
    match_tokens: bool = False

    @model_validator(mode="after")
    def _check_probe_needs(self) -> Hypothesis:
        """``uncertainty: seeds+probe`` needs probe blocks and a covariance metric; matching needs spectra."""
        from analysis.probe import resamplable

        log = not self.design.run_source.measures_spectra  # a metric log: no spectra, no probe
        for i, claim in enumerate(self.claims):
            match = claim.match_tokens if claim.match_tokens is not None else self.match_tokens
            if match and log:
                raise _FieldError(
                    f"claims[{i}].match_tokens",
                    "matching token counts needs spectra; a metric log (table source) has none",
                )
            if claim.uncertainty != "seeds+probe":
                continue
            if match:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe resamples the full populations' block sums; it cannot be combined with "
                    "match_tokens (give one claim each)",
                )
            if log:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe resamples the probe's covariances; a metric log has none",
                )
            if self.design.probe.blocks < 2:
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    "seeds+probe needs design.probe.blocks >= 2 (e.g. 16): the probe's image blocks are resampled",
                )
            if not resamplable(claim.metric):
                raise _FieldError(
                    f"claims[{i}].uncertainty",
                    f"seeds+probe recomputes the metric from resampled covariances; {claim.metric!r} is "
                    "measured on a token subsample",
                )
        return self

    @model_validator(mode="after")
    def _check_sweep(self) -> Hypothesis:
        """A sweep varies knobs of a procedural design dataset within their domains; knob claims need it."""
        if self.sweep is not None and self.design.condition_names():
            which = "design.factors" if self.design.factors else "design.conditions"
            raise _FieldError(which, "a sweep varies one design's data: its design takes no conditions")
        varied = set(self.sweep.space) if self.sweep else set()
        for i, claim in enumerate(self.claims):
            knob = claim.knob()
            if knob is not None and knob not in varied:
                what = f"the sweep varies {sorted(varied)}" if varied else "the file has no sweep section"
                raise _FieldError(
                    f"claims[{i}].over", f"a claim over {knob!r} needs a sweep that varies it; {what}"
                )
        if self.sweep is None:
            return self
        names = {d.name: d for d in self.design.datasets}
        ds = names.get(self.sweep.dataset)
        if not isinstance(ds, ProceduralDataset):
            procedural = sorted(n for n, d in names.items() if isinstance(d, ProceduralDataset))
            raise _FieldError(
                "sweep.dataset",
                f"expected a procedural design dataset {procedural}, got {self.sweep.dataset!r}",
            )
        for knob, values in self.sweep.space.items():
            points = values if isinstance(values, list) else [values.low, values.high]
            if knob in INTEGER_KNOBS:
                given = points if isinstance(values, list) else [values.low, values.high, values.step or 1]
                odd = [v for v in given if float(v) != int(v)]
                if odd:
                    raise _FieldError(f"sweep.space.{knob}", f"{knob} takes integers, got {odd[0]!r}")
            for v in points:
                try:
                    ProceduralDataset.model_validate(
                        {**ds.model_dump(), knob: int(v) if knob in INTEGER_KNOBS else v}
                    )
                except ValidationError as exc:
                    why = exc.errors()[0]["msg"].removeprefix("Value error, ")
                    raise _FieldError(
                        f"sweep.space.{knob}", f"{v!r} is outside the knob's domain: {why}"
                    ) from None
        obj = self.sweep.objective
        if obj.epoch != "last" and obj.epoch not in self.design.checkpoint_epochs:
            raise _FieldError(
                "sweep.objective.epoch",
                f"expected 'last' or a checkpoint epoch {self.design.checkpoint_epochs}, got {obj.epoch!r}",
            )
        if obj.claim is not None:
            plain = [c.name for c in self.claims if c.knob() is None]
            if obj.claim not in plain:
                raise _FieldError(
                    "sweep.objective.claim",
                    f"expected the name of a claim not over a knob {plain}, got {obj.claim!r}",
                )
        if obj.metric is not None and obj.metric not in ALL_METRICS:
            raise _FieldError(
                "sweep.objective.metric",
                f"unknown metric {obj.metric!r}; expected one of {list(ALL_METRICS)}",
            )
        for layer in obj.layers or []:
            if layer not in self.design.layers:
                raise _FieldError(
                    "sweep.objective.layers", f"unknown layer {layer!r}; expected one of {self.design.layers}"
                )
        return self

    @field_validator("name")
    @classmethod
    def _folder_name(cls, v: str) -> str:
        if set(v) == {"."}:  # '.' or '..' would put the study's files outside studies/
            raise ValueError("expected a name with a letter, digit, '_' or '-' (it names a folder)")
        return v

    @model_validator(mode="after")
    def _check_claims(self) -> Hypothesis:
        """Every dataset, layer and epoch a claim names must exist in the design."""
        datasets = sorted(d.name for d in self.design.datasets)
        layers = set(self.design.layers)
        cnn = "stem" in layers  # a CNN's points (vitstudy_core.layers.cnn_layer_names)
        epochs = self.design.checkpoint_epochs
        check_claim_names(self.claims)
        for i, claim in enumerate(self.claims):
            for fld, what, value in claim.named():
                where = f"claims[{i}].{fld}"
                if what == "dataset" and value not in datasets:
                    raise _FieldError(
                        where, f"expected one of the design's datasets {datasets}, got {value!r}"
                    )
                if what == "layer" and value not in layers:
                    raise _FieldError(where, f"unknown layer {value!r}; expected one of {self.design.layers}")
                if what == "layer" and cnn and claim.token_set_of(fld) == "cls":
                    raise _FieldError(
                        where,
                        f"a CNN has no class token (token_set cls at {value}): use token_set all (a feature "
                        "map's positions; the pooled feature is the layer pool)",
                    )
                if what == "layer" and value == "patch_embed" and claim.token_set_of(fld) == "cls":
                    raise _FieldError(
                        where,
                        "the cls token set has no patch_embed (the patch embedding's output holds patch tokens "
                        "only; the class token joins at pos_embed): use token_set all or patch, or a later layer",
                    )
                if what == "epoch" and value != "last" and epochs and value not in epochs:
                    raise _FieldError(where, f"expected a checkpoint epoch {epochs} or 'last', got {value}")
            self._check_trend_points(i, claim, epochs)
        self._check_units()
        self._check_conditions_named()
        self._check_adjust_for()
        return self

    def _check_trend_points(self, i: int, claim: Claim, epochs: list[int]) -> None:
        """A claim over epochs neither fixes the epoch nor runs over one epoch; one over layers has >= 2."""
        over = getattr(claim, "over", None)
        if not claim.reads_subset_epoch():
            if "epoch" in claim.subset.model_fields_set and claim.subset.epoch != "last":
                raise _FieldError(
                    f"claims[{i}].subset.epoch",
                    f"a {claim.kind} over epochs runs over the checkpoint epochs and cannot fix the epoch: "
                    "leave subset.epoch out (list the epochs it uses under epochs)",
                )
            own = getattr(claim, "epochs", None)
            points = sorted(set(own or epochs))
            if points and len(points) < 2:
                raise _FieldError(
                    f"claims[{i}].epochs" if own else f"claims[{i}]",
                    f"a {claim.kind} over epochs needs >= 2 epochs (its x values), got {points}"
                    + ("" if own else " (the design's checkpoint epochs: add some to design.checkpoints)"),
                )
        elif over == "layer" and len(set(layers := list(getattr(claim, "layers", [])))) < 2:
            raise _FieldError(
                f"claims[{i}].layers",
                f"a {claim.kind} over layers needs >= 2 layers (x values), got {layers}",
            )

    def _check_adjust_for(self) -> None:
        """A claim's ``adjust_for`` scalar is one its runs record, in every cell (checked before training)."""
        from analysis.kinds.base import RUN_SCALARS

        objectives = [self.design.objective, *(c.design.objective for c in self.design.cells())]
        for i, claim in enumerate(self.claims):
            name = getattr(claim, "adjust_for", None)
            if name is None:
                continue
            for objective in objectives:
                if RUN_SCALARS[name] not in objective.records:
                    have = sorted(k for k, v in RUN_SCALARS.items() if v in objective.records)
                    raise _FieldError(
                        f"claims[{i}].adjust_for",
                        f"objective {objective.kind} does not record {name!r} (its runs record {have})",
                    )

    def _check_units(self) -> None:
        """Each claim's unit fits the design (``analysis.units.unit_problem``)."""
        from analysis.probe import resamplable
        from analysis.units import model_names, unit_problem
        from runners.sources.base import declares

        source = self.design.source.model_dump() if self.design.source is not None else None
        models = model_names(source)
        for i, claim in enumerate(self.claims):
            problem = unit_problem(
                claim,
                len(models) if source and declares(source["kind"], "models_are_seeds") else None,
                len(self.design.seeds),
                self.design.probe.blocks,
                resamplable(claim.metric),
                self.design.probe.size,
            )
            if problem:
                raise _FieldError(f"claims[{i}].unit", problem)

    def _check_conditions_named(self) -> None:
        """Every condition a claim names is one of the design's (``ClaimBase.conditions_named``); with a
        pretrained source a ``unit: images`` claim names models as its conditions."""
        from analysis.units import model_names

        own = self.design.condition_names()
        models = model_names(self.design.source.model_dump() if self.design.source is not None else None)
        for i, claim in enumerate(self.claims):
            names = models if models and claim.unit == "images" else own
            for fld, name in claim.conditions_named():
                if name not in names:
                    has = f"it has {names}" if names else "it has no conditions"
                    raise _FieldError(
                        f"claims[{i}].{fld}", f"condition {name!r} is not in the design ({has})"
                    )


def check_claim_names(claims: list[Claim]) -> None:
    """Each claim's name is its own: the verdicts, the report and MLflow tell claims apart by it."""
    first: dict[str, int] = {}
    for i, claim in enumerate(claims):
        j = first.setdefault(claim.name, i)
        if j != i:
            raise _FieldError(
                f"claims[{i}].name",
                f"claim name {claim.name!r} is used twice (also claims[{j}]): give each claim its own name",
            )


def parse_hypothesis(data: object, file: str = "<hypothesis>", trains: bool = True) -> Hypothesis:
    """Validate already-parsed YAML data; raise StudyError naming file, field and expectation.

    ``trains=False`` (``analyze`` on a saved table): ``design.max_runs``, a bound on training, is not
    applied."""
    if not isinstance(data, dict):
        raise StudyError(f"expected a mapping at the top level, got {type(data).__name__}", file)
    try:
        return Hypothesis.model_validate(data, context={"trains": trains})
    except ValidationError as exc:
        raise _study_error(exc, file) from None


def parse_claims(data: object, file: str = "<claims>") -> list:
    """Validate a list of claim mappings (or one) on their own, without a design: ``study.api.analyze`` on
    a table from anywhere. Errors name ``claims[i].field`` as in a hypothesis file.

    Returns:
        The validated claim models (the kinds' settings, ``analysis.kinds``), in order.
    """
    from pydantic import TypeAdapter

    items = [data] if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise StudyError(
            f"expected a claim mapping or a non-empty list of them, got {type(data).__name__}", file
        )
    try:
        claims = TypeAdapter(list[Claim]).validate_python(items)
    except ValidationError as exc:
        err = _study_error(exc, file)
        raise StudyError(err.message, file, f"claims{err.field}" if err.field else "claims") from None
    try:
        check_claim_names(claims)
    except _FieldError as exc:
        raise StudyError(exc.message, file, exc.field) from None
    return claims


def load_hypothesis(path: str | os.PathLike[str], trains: bool = True) -> Hypothesis:
    """Read and validate a hypothesis YAML file.

    The loader is safe (no tag executes code or constructs an object) and strict: a duplicate key, nesting
    deeper than :data:`MAX_DEPTH`, an alias bomb or a file over :data:`MAX_FILE_BYTES` is an error.
    """
    path = Path(path)
    if path.is_dir():
        raise StudyError(
            "is a directory (expected a hypothesis YAML file, such as hypotheses/u_shape.yaml)", str(path)
        )
    if not path.is_file():
        raise StudyError("file not found (expected a hypothesis YAML file)", str(path))
    return parse_hypothesis(_read_yaml(path), str(path), trains)
