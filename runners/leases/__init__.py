"""Claims on runs: a run key is filled by one live worker at a time, anywhere, and taken over when it dies.

Public modules: ``store`` (:func:`open_lease_store`, :func:`fill_once`), ``model`` (the lease store's
interface and the lease's life), ``sql`` (the PostgreSQL/SQLite store and its engines), ``members``
(which runs each study planned). Private: ``_file`` (leases as files in a shared folder).
"""

from __future__ import annotations
