"""What the report shows of a difference between conditions: the two sides' effects and their difference
in words (:func:`difference_lines`) and their per-seed effects side by side (:func:`effects_figure`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitstudy_core.fmt import fmt_num, fmt_p

if TYPE_CHECKING:
    from analysis.report.figures import Figure


def _side_line(side: dict[str, Any], unit: str) -> str:
    return (
        f"{side['condition']}: claim effect {fmt_num(side['effect'])}{unit} (95% CI {fmt_num(side['ci'][0])}, "
        f"{fmt_num(side['ci'][1])}), p {fmt_p(side['p'])}; per-seed effect mean {fmt_num(side['seed_effect_mean'])}"
    )


def difference_lines(sides: dict[str, Any], diff: dict[str, Any], statistic: str, unit: str) -> list[str]:
    """The two conditions' effects side by side and their difference (report lines)."""
    a, b = list(sides)
    lines = [f"per-seed effect compared: {statistic}"]
    lines += [_side_line(sides[n], unit) for n in (a, b)]
    lines.append(
        f"{a} - {b}: {fmt_num(diff['mean'])}{unit} (95% CI {fmt_num(diff['ci'][0])}, {fmt_num(diff['ci'][1])}), "
        f"p {fmt_p(diff['p'])}; {diff['test']}"
    )
    return lines


def effects_figure(
    sides: dict[str, dict[str, Any]],
    statistic: str,
    plotted: dict[str, Any],
    colours: dict[str, str] | None = None,
) -> Figure:
    """Two (or more) conditions' per-seed effects side by side: one dot per seed (joined across conditions
    by seed id), the mean with its 95% t CI per condition, each in its colour of the study's palette
    (``colours``; default: the palette of these conditions alone)."""
    import pandas as pd

    from analysis.report.figures import Figure, _png, new_figure, t_band
    from analysis.report.palette import condition_colours

    names = list(sides)
    colours = colours or condition_colours(names)
    fig, ax = new_figure(figsize=(1.6 + 1.4 * len(names), 3.4))
    per = pd.DataFrame({n: pd.Series(sides[n]["per_seed"], dtype=float) for n in names})
    for _, row in per.iterrows():
        ax.plot(range(len(names)), row.to_numpy(), color="0.6", lw=0.8, marker="o", ms=3, alpha=0.7)
    for j, n in enumerate(names):
        mean, low, high = t_band(per[[n]].dropna().to_numpy())
        colour = colours.get(n, f"C{j}")
        ax.errorbar([j + 0.15], mean, yerr=[mean - low, high - mean], fmt="s", color=colour, capsize=4)
    ax.axhline(0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    for tick, n in zip(ax.get_xticklabels(), names, strict=True):
        tick.set_color(colours.get(n, "black"))
    ax.set_ylabel(_wrapped(statistic), fontsize=7)
    ax.grid(alpha=0.3)
    caption = f"per-seed effect by condition ({statistic}); lines join a seed across conditions"
    drawn = {**plotted, "conditions": names, "colours": {n: colours.get(n, "") for n in names}}
    return Figure("effects_by_condition", caption, png=_png(fig), plotted=drawn)


def _wrapped(text: str, width: int = 40, lines: int = 3) -> str:
    """An axis label over at most ``lines`` lines of ``width`` characters, broken between words only
    (never inside one: "mean" stays "mean"); what does not fit ends in "...", the caption has it whole."""
    import textwrap

    return "\n".join(
        textwrap.wrap(
            text, width, break_long_words=False, break_on_hyphens=False, max_lines=lines, placeholder=" ..."
        )
    )
