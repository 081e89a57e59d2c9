"""How numbers are printed: one formatter for the terminal's verdict table and the report."""

from __future__ import annotations

import math
from typing import Any


def fmt_num(x: Any, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; ``n/a`` for None, NaN or anything that is not a number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def fmt_interval(value: Any, ci: Any, unit: str = "", label: bool = True) -> str:
    """``1.23 pp (95% CI 0.80, 1.66)`` (``label=False``: ``1.23 pp (0.80, 1.66)``, under a header that says
    it): every interval the verdict table, ``verdicts.txt`` and the report print, two decimals each."""
    low, high = ci
    return f"{fmt_num(value)}{unit} ({'95% CI ' if label else ''}{fmt_num(low)}, {fmt_num(high)})"


def fmt_p(p: Any) -> str:
    """A p-value: three decimals, ``<0.001`` below that, ``n/a`` when no test was possible."""
    try:
        p = float(p)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def unit_of(metric: str) -> str:
    """The unit suffix of a metric's effect: `` pp`` (percentage points) for ``*_pct`` metrics."""
    return " pp" if str(metric).endswith("_pct") else ""


def fmt_hours(hours: Any) -> str:
    """A duration given in hours, in the unit that shows it: ``2.50 h``, ``12.4 min`` under an hour,
    ``3.2 s`` under a minute (a tiny design's runs printed as ``0.000 h`` said nothing); ``?`` for None."""
    try:
        h = float(hours)
    except (TypeError, ValueError):
        return "?"
    if math.isnan(h):
        return "?"
    if h >= 1:
        return f"{h:.2f} h"
    if h * 60 >= 1:
        return f"{h * 60:.1f} min"
    return f"{h * 3600:.1f} s"


def count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``: a count with its noun in the number it takes."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
