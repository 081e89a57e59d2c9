"""The MLflow boundary: the only package that talks to MLflow.

Public modules: ``tracker`` (the store and the parent run: :func:`open_tracker`), ``store`` (the tracking
URI, the store's folder and its schema), ``reuse`` (finished runs read back from the store), ``ui`` (the
MLflow UI), ``cleanup`` (stale runs and heartbeats). Private: ``_write`` (child runs written).
"""

from __future__ import annotations
