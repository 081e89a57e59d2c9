"""study: claims about ViT representation geometry -> multi-seed experiments -> statistical verdicts.

Flow (one direction, one job per module)::

    hypothesis YAML -> study.schema (validated spec) -> study.runspecs (run specs)
      -> runners (train + extract spectra per run) -> analysis.table (tidy table)
      -> analysis.kinds (one module per claim kind) -> analysis.verdicts -> report + MLflow (study.tracking)

``core`` is the bottom layer every package imports; ``runners`` and ``analysis`` import nothing from ``study``.
"""

from __future__ import annotations

__version__ = "0.1.0"
