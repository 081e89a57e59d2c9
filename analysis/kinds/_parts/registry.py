"""The claim kind registry: :class:`ClaimKind` (what a kind registers), :data:`KINDS`,
:func:`register_kind` and :func:`get_kind`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analysis.kinds._parts.claim import ClaimBase
from analysis.kinds._parts.display import FigureContext, Result, metric_unit
from analysis.kinds._parts.outcome import Outcome
from analysis.kinds._parts.scenario import Scenario
from vitstudy_core.registry import Registry

if TYPE_CHECKING:
    from analysis.report.figures import Figure


def _no_figures(ctx: FigureContext) -> list[Figure]:
    return []


def _no_explanation(claim: Any, result: Result) -> list[str]:
    return []


def _declared_margin(claim: Any) -> float | None:
    return getattr(claim, "margin", None)


def _t_based(claim: Any) -> int:
    return 0


def _asserts_an_effect(claim: Any) -> float | None:
    return None


def _declared_sesoi(claim: Any) -> float | None:
    return claim.sesoi


def _one_test(claim: Any) -> int:
    return 1


@dataclass(frozen=True)
class ClaimKind:
    """A registered claim kind (see the module docstring).

    Attributes:
        name: the ``kind:`` value in a hypothesis file.
        model: the pydantic claim model.
        evaluate: ``(TableView, claim, where, excluded) -> Outcome``.
        calibration: scenario label -> :class:`Scenario` (labels are unique across kinds).
        figures: ``FigureContext -> list[analysis.report.figures.Figure]`` for the report (the effect plot is
            added for every kind).
        explain: ``(claim, result) -> list[str]``: report lines saying what the test found (the verdict's
            reason, power, warnings and excluded seeds are added for every kind).
        rejection_margin: ``claim -> margin or None``: a margin within which equivalence REJECTS the
            claim (default: the claim's ``margin`` field, if any).
        holds_within: ``claim -> margin or None``: the claim says the effect lies within +-margin (an
            equivalence), so a second interval (the seed x probe one) agrees when it lies inside; None
            (the default): the claim says there is an effect, and an interval agrees when it excludes 0.
        labellings_per_seed: ``claim -> int``: for a randomisation test, the equally likely labellings
            of one seed's data under the null (2 for sign flips, K! for a permutation of K conditions), so
            its p cannot go below ``labellings^-S``; 0 for a t-based test (the default). What
            ``python -m study plan`` reads to say how many seeds a claim needs at the least.
        planning_effect: ``claim -> effect or None``: the effect ``plan`` sizes the seeds for when no
            pilot gives one (default: the claim's ``sesoi``).
        holm_contrasts: ``claim -> k``: the claim's p is Holm-adjusted across k contrasts (a trend over
            ``any`` of k layers), so ``plan`` sizes it at alpha / k and its floor is k * labellings^-S
            (default 1).
        effect_unit: ``claim -> str``: the unit suffix of the claim's effect as the report prints it
            (`` pp per unit of clutter`` for a slope over a knob; default the metric's, :func:`metric_unit`).
        images: ``claim -> phrase or None``: why a claim of this kind cannot take ``unit: images`` (None:
            it can); None (the default): the kind does not allow ``unit: images`` (it has no calibration
            rows for it, ``analysis.unit_calibration``).
        images_calibrated: the metrics on which this kind's ``unit: images`` calibration rows hold
            (``bench/calibration.py --unit-images``); others are refused until theirs do.
        example: a valid claim of this kind as a hypothesis file writes it (without ``name``), over a
            design of datasets ``objects``, ``mixed``, ``textures`` and a 12-block ViT: the contract test
            (tests/plugins/test_kind_contract.py) evaluates it and draws its figures.
    """

    name: str
    model: type[ClaimBase]
    evaluate: Callable[..., Outcome]
    calibration: dict[str, Scenario] = field(default_factory=dict)
    figures: Callable[[FigureContext], list[Figure]] = _no_figures
    explain: Callable[[Any, Result], list[str]] = _no_explanation
    rejection_margin: Callable[[Any], float | None] = _declared_margin
    holds_within: Callable[[Any], float | None] = _asserts_an_effect
    labellings_per_seed: Callable[[Any], int] = _t_based
    planning_effect: Callable[[Any], float | None] = _declared_sesoi
    holm_contrasts: Callable[[Any], int] = _one_test
    effect_unit: Callable[[Any], str] = metric_unit
    images: Callable[[Any], str | None] | None = None
    images_calibrated: frozenset[str] = frozenset()
    example: dict[str, Any] = field(default_factory=dict)


def _new_labels(name: str, kind: ClaimKind) -> None:
    """Registry check: registered under its own name and ``kind`` literal, with calibration labels no
    other kind has."""
    field_ = kind.model.model_fields.get("kind")
    if kind.name != name or field_ is None or getattr(field_.annotation, "__args__", None) != (name,):
        raise ValueError(f"claim kind {name!r}: its model needs kind: Literal[{name!r}] and name={name!r}")
    labels = {label for k in KINDS.values() for label in k.calibration}
    if labels & set(kind.calibration):
        raise ValueError(f"calibration labels {sorted(labels & set(kind.calibration))} are taken")


KINDS: Registry[ClaimKind] = Registry("claim kind", check=_new_labels, group="vitstudy.kinds")


def register_kind(kind: ClaimKind) -> ClaimKind:
    """Add a kind to :data:`KINDS` (its name and its calibration labels must be new)."""
    return KINDS.register(kind.name, kind)


def get_kind(name: str) -> ClaimKind:
    """The registered kind ``name`` (unknown: a one-line StudyError listing the kinds)."""
    return KINDS.get(name)
