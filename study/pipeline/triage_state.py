"""A plan's runs split by what must happen to each (:class:`Triage`): reused here, fetched from the store,
or trained. ``study.pipeline.triage`` makes it; the tracker records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from study.runspecs import RunSpec

if TYPE_CHECKING:
    from study.tracking.reuse import StoredRun


@dataclass
class Triage:
    """The plan split by what must happen to each run.

    Attributes:
        finished: keys whose run folder here holds a finished run (reused as is).
        stored: key -> finished MLflow run in the tracking store, absent or damaged here (downloaded, then
            reused).
        todo: runs to fill (train), in plan order.
        damaged: key -> why, for each run whose folder says finished but cannot be read
            (``RunFolder.damage``): it is in ``stored`` when the store holds a copy, else in ``todo``.
        logged: key -> the MLflow run id of the store's finished child of the run, for every planned run
            the store holds (reused from this folder or downloaded): what the parent run links to.
    """

    finished: list[str] = field(default_factory=list)
    stored: dict[str, StoredRun] = field(default_factory=dict)
    todo: list[RunSpec] = field(default_factory=list)
    damaged: dict[str, str] = field(default_factory=dict)
    logged: dict[str, str] = field(default_factory=dict)

    @property
    def reused_from(self) -> dict[str, str]:
        """key -> ``local`` or ``mlflow:<run id>`` for every reused run."""
        out = {k: "local" for k in self.finished}
        out.update({k: f"mlflow:{r.info.run_id}" for k, r in self.stored.items()})
        return out
