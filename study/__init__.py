"""study: claims about ViT representation geometry -> multi-seed experiments -> statistical verdicts.

Flow (one direction, one job per module)::

    hypothesis YAML -> study.schema (validated spec) -> study.planner (run specs)
      -> runners (train + extract spectra per run) -> analysis.table (tidy table)
      -> analysis.claims (tests) -> analysis.verdicts -> reports + MLflow (study.tracking)
"""

from __future__ import annotations

__version__ = "0.1.0"
