"""study: claims about ViT representation geometry -> multi-seed experiments -> statistical verdicts.

Flow (one direction, one job per module)::

    hypothesis YAML -> study.schema (validated spec) -> study.runspecs (run specs)
      -> runners (train + extract spectra per run) -> analysis.table (tidy table)
      -> analysis.kinds (one module per claim kind) -> analysis.verdicts -> report + MLflow (study.tracking.tracker)

``core`` is the bottom layer every package imports; ``runners`` and ``analysis`` import nothing from ``study``.

From Python (``study.api``; the CLI's verbs call the same functions)::

    import study
    result = study.run("hypotheses/u_shape.yaml", out="study_results")   # or study.load("study_results")
    result.verdicts, result.profile("eed_pct"), result.figure("u"), study.analyze(claims, my_table)

The names are imported on first use, so ``import study`` (and ``python -m study``) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "SeedPlan",
    "StudyError",
    "StudyResult",
    "Validation",
    "Verdicts",
    "analyze",
    "load",
    "plan",
    "report",
    "run",
    "validate",
]

if TYPE_CHECKING:
    from study.api import SeedPlan, Validation, analyze, load, plan, report, run, validate
    from study.results import StudyResult, Verdicts
    from vitstudy_core.errors import StudyError

_HOME = {"StudyResult": "study.results", "Verdicts": "study.results", "StudyError": "vitstudy_core.errors"}


def __getattr__(name: str) -> Any:
    """``study.run`` and the other public names, imported from ``study.api`` when first asked for."""
    if name not in __all__:
        raise AttributeError(f"module 'study' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_HOME.get(name, "study.api")), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
