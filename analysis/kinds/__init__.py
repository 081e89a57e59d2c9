"""Claim kinds as plug-ins: every module in this package (but ``base``) registers one kind on import.

    from analysis.kinds import KINDS, get_kind
    get_kind("u_shape").evaluate(view, claim, where, excluded)

Adding a kind is adding one module here (see ``analysis.kinds.base`` for what it defines) plus its test;
the hypothesis schema, the verdicts, the report and the calibration bench find it through this registry.
"""

from __future__ import annotations

import importlib
import pkgutil

from analysis.kinds._parts.controls import apply_controls, controls_figures, explain_controls
from analysis.kinds._parts.display import FigureContext
from analysis.kinds._parts.registry import KINDS, ClaimKind, get_kind, register_kind
from analysis.kinds._parts.scenario import Scenario

__all__ = [
    "KINDS",
    "ClaimKind",
    "FigureContext",
    "Scenario",
    "apply_controls",
    "claim_models",
    "controls_figures",
    "explain_controls",
    "get_kind",
    "register_kind",
]

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if _module != "base" and not _module.startswith("_"):
        importlib.import_module(f"{__name__}.{_module}")


def claim_models() -> list[type]:
    """Every registered kind's pydantic claim model, in registration order."""
    return [k.model for k in KINDS.values()]
