"""The stages of one study, each from one artifact to the next: plan -> triage -> execute -> log -> collect
-> evaluate -> outputs, and the orchestration that runs them in order inside the tracker.

Public modules: ``stages`` (each stage on its own), ``orchestrate`` (:func:`run_study`: them in order),
``triage`` (a plan's runs split into reused, fetched and to train) with ``triage_state`` (the
:class:`Triage` it makes), ``tables`` (the tidy table of finished runs), ``scalars`` (run scalars joined
to it), ``runlog`` (runs logged to the tracker), ``outputs`` (verdicts, tables and the report written),
``stopping`` (a clean stop on a signal), ``evaluation`` (the claims tested on the table).
"""

from __future__ import annotations
