"""The report: what a study shows people, as ``report.html`` and ``report.md``, and the figures in it.

Public modules: ``page`` (the page written), ``sections`` (what it shows), ``figures`` (the figure
helpers every claim kind draws with), ``knob_figures`` (over a sweep's knobs), ``condition_figures``
(per condition), ``palette`` (the colours).
"""

from __future__ import annotations
