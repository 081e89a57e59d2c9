"""A study's results as a page people can look at: ``report.html`` (self-contained) and ``report.md``.

    python -m study report study_results/studies/u_shape

``write_report(study_dir)`` reads what ``run`` left in ``studies/<name>/`` (``verdicts.json``,
``table.parquet``, ``hypothesis.yaml``) and in ``runs/<key>/`` (``covariances.npz``, ``result.json``)
and writes:

* ``report.html``: one file, images embedded as base64 PNG, inline CSS, no script and no external URL,
  so it opens from disk anywhere;
* ``report.md``: the same summary in Markdown, its figures saved as ``figures/*.png`` next to it.

Content: the hypothesis text; the verdict table; per claim the figure that shows it (the metric by
layer with a thin line per seed and the across-seed mean with a 95% t band per dataset, declared
regions shaded; or, for a claim over epochs, the metric against epoch with a line per layer) and its
effect with the 95% CI (a forest plot); covariance heatmaps at the first and last checkpoint; the
command and package versions that reproduce it. Figures are chosen from the claim's fields, not its
kind, so a new claim kind renders (its table row, its effect plot, a profile) without code changes.
Anything missing or unreadable is listed under "Missing" and marked where it would have been; the
report never fails because one artifact is bad. This module never imports torch.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import platform
import sys
import textwrap
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported anywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from scipy import stats  # noqa: E402

from core.errors import StudyError  # noqa: E402

_PACKAGES = ("numpy", "pandas", "scipy", "statsmodels", "matplotlib", "mlflow", "torch", "timm", "pydantic")
_DPI = 90  # enough to read axis labels; keeps a 15-layer study's report well under 1 MB
_CI = 0.95
_REGION_COLOURS = {"early": "#4c72b0", "bottleneck": "#dd8452", "late": "#55a868"}
_VERDICT_COLOURS = {"ACCEPTED": "#2e7d32", "REJECTED": "#c62828", "INCONCLUSIVE": "#6d6d6d"}


@dataclass
class Figure:
    """One rendered figure: ``png`` bytes, or ``None`` with ``missing`` saying why."""

    name: str
    caption: str
    png: bytes | None = None
    missing: str | None = None


@dataclass
class _Section:
    title: str
    claim: dict
    figures: list[Figure] = field(default_factory=list)


# ---- helpers ------------------------------------------------------------------------------------------
def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def t_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Across-seed mean and two-sided 95% t interval per column.

    Args:
        values: (S, L) one row per seed, one column per layer (or epoch); NaN entries are ignored.

    Returns:
        (mean, low, high), each (L,): ``mean +- t_{0.975, n-1} * sd / sqrt(n)`` with ``n`` the non-NaN
        seeds of the column; low = high = mean where n < 2.
    """
    values = np.asarray(values, dtype=np.float64)
    n = np.sum(~np.isnan(values), axis=0)
    mean = np.nanmean(values, axis=0) if values.size else np.full(values.shape[1], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.nanstd(values, axis=0, ddof=1) if values.shape[0] > 1 else np.zeros_like(mean)
        q = np.where(n > 1, stats.t.ppf(0.5 + _CI / 2, np.maximum(n - 1, 1)), 0.0)
        half = np.where(n > 1, q * sd / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, mean - half, mean + half


def _fmt(x, digits: int = 2) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _fmt_p(p) -> str:
    try:
        p = float(p)
    except (TypeError, ValueError):
        return "n/a"
    if math.isnan(p):
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _subset_text(subset: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in (subset or {}).items() if v is not None)


def _ordered_datasets(claim: dict) -> list[str]:
    """The datasets an ordering claim compares, in declared order (they live in its details, not its
    subset); empty for every other claim."""
    details = claim.get("details") if isinstance(claim.get("details"), dict) else {}
    return list(details.get("per_seed_summary") or {}) if claim.get("kind") == "ordering" else []


def _claim_subset_text(claim: dict) -> str:
    """A claim's subset, led by the datasets of an ordering claim."""
    order = _ordered_datasets(claim)
    head = f"datasets=[{', '.join(order)}]" if order else ""
    return ", ".join(t for t in (head, _subset_text(claim.get("subset"))) if t)


def versions() -> dict[str, str]:
    """Python, platform and installed package versions (read from metadata: nothing is imported)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ---- what a claim covers --------------------------------------------------------------------------------
def _claim_datasets(claim: dict, table: pd.DataFrame) -> list[str]:
    """Datasets named anywhere in the claim's subset (``dataset``, ``datasets``, ``a``/``b``, ...)."""
    names = set(table["dataset"].unique())
    found: list[str] = []

    def visit(v) -> None:
        if isinstance(v, str) and v in names and v not in found:
            found.append(v)
        elif isinstance(v, list | tuple):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    visit(claim.get("subset") or {})
    visit(_ordered_datasets(claim))
    visit((claim.get("details") or {}).get("conditions") or {})
    return found or sorted(names)


def _claim_epochs(claim: dict, table: pd.DataFrame) -> list[int]:
    """Epochs the claim's subset covers: ``epoch: last | N | all | [..]`` or ``epochs: [..]``."""
    subset = claim.get("subset") or {}
    available = sorted(int(e) for e in table["epoch"].unique())
    if not available:
        return []
    spec = subset.get("epochs", subset.get("epoch", "last"))
    if spec in (None, "last"):
        return [available[-1]]
    if spec == "first":
        return [available[0]]
    if spec == "all":
        return available
    if isinstance(spec, list | tuple):
        return [int(e) for e in spec if int(e) in available] or available
    try:
        return [int(spec)] if int(spec) in available else [available[-1]]
    except (TypeError, ValueError):
        return [available[-1]]


def _over_epochs(claim: dict, epochs: list[int]) -> bool:
    return claim.get("kind") == "trend" or len(epochs) > 1


def _claim_layers(claim: dict) -> list[str] | None:
    subset = claim.get("subset") or {}
    layers = subset.get("layers") or subset.get("layer")
    if isinstance(layers, str):
        return [layers]
    return list(layers) if layers else None


# ---- figures -------------------------------------------------------------------------------------------
def profile_figure(table: pd.DataFrame, claim: dict, regions: dict | None) -> Figure:
    """The claim's metric by layer at its epoch: per-seed lines, mean and 95% t band per dataset."""
    metric, subset = claim["metric"], claim.get("subset") or {}
    tset = subset.get("token_set", "all")
    epochs = _claim_epochs(claim, table)
    name = f"profile_{metric}"
    caption = f"{metric} by layer ({tset} tokens, epoch {epochs[-1] if epochs else '?'})"
    sel = table[(table.metric == metric) & (table.token_set == tset)]
    if sel.empty or not epochs:
        return Figure(name, caption, missing=f"no {metric}/{tset} rows in the table")
    sel = sel[sel.epoch == epochs[-1]]
    layer_order = sel.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
    x = np.arange(len(layer_order))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(layer_order)), 3.6))
    for r_name, r_layers in (regions or {}).items():
        idx = [layer_order.index(layer) for layer in r_layers if layer in layer_order]
        if idx:
            colour = _REGION_COLOURS.get(r_name, "#999999")
            ax.axvspan(min(idx) - 0.4, max(idx) + 0.4, color=colour, alpha=0.12, lw=0)
            ax.text((min(idx) + max(idx)) / 2, 1.0, r_name, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=8, color=colour)  # fmt: skip
    for i, ds in enumerate(_claim_datasets(claim, table)):
        wide = sel[sel.dataset == ds].pivot_table(index="seed", columns="layer", values="value")
        wide = wide.reindex(columns=layer_order)
        if wide.empty:
            continue
        colour = f"C{i}"
        for _, row in wide.iterrows():
            ax.plot(x, row.to_numpy(), color=colour, alpha=0.35, lw=0.8)
        mean, low, high = t_band(wide.to_numpy())
        ax.fill_between(x, low, high, color=colour, alpha=0.25, lw=0)
        ax.plot(
            x, mean, color=colour, lw=2, marker="o", ms=3, label=f"{ds} (mean of {len(wide)} seeds, 95% t CI)"
        )
    ax.set_xticks(x, layer_order, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return Figure(name, caption, png=_png(fig))


def epoch_figure(table: pd.DataFrame, claim: dict) -> Figure:
    """The claim's metric against epoch, one line per layer (across-seed mean), per dataset."""
    metric, subset = claim["metric"], claim.get("subset") or {}
    tset = subset.get("token_set", "all")
    name = f"epochs_{metric}"
    caption = f"{metric} against epoch, one line per layer ({tset} tokens; mean over seeds)"
    epochs = _claim_epochs(claim, table)
    sel = table[(table.metric == metric) & (table.token_set == tset) & (table.epoch.isin(epochs))]
    layers = _claim_layers(claim)
    if layers:
        sel = sel[sel.layer.isin(layers)]
    if sel.empty:
        return Figure(name, caption, missing=f"no {metric}/{tset} rows over epochs in the table")
    datasets = _claim_datasets(claim, table)
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 3.6), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, ds in zip(axes[0], datasets, strict=True):
        mean = sel[sel.dataset == ds].groupby(["layer_index", "layer", "epoch"])["value"].mean().reset_index()
        order = mean.drop_duplicates("layer").sort_values("layer_index")["layer"].tolist()
        for j, layer in enumerate(order):
            m = mean[mean.layer == layer].sort_values("epoch")
            ax.plot(m.epoch, m.value, marker="o", ms=3, lw=1.2, color=cmap(j / max(1, len(order) - 1)),
                    label=layer)  # fmt: skip
        ax.set_title(ds, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return Figure(name, caption, png=_png(fig))


def effect_figure(claim: dict) -> Figure:
    """Forest plot of one claim: the effect with its 95% CI against zero."""
    name = "effect"
    unit = " (pp)" if str(claim.get("metric", "")).endswith("_pct") else ""
    caption = f"effect with 95% CI{unit}"
    effect, lo, hi = (float(claim.get(k, float("nan"))) for k in ("effect", "ci_low", "ci_high"))
    if math.isnan(effect):
        return Figure(name, caption, missing="no effect estimate (no test was possible)")
    label = textwrap.fill(str(claim.get("name", "")), 36)  # the whole name, wrapped, never clipped
    fig, ax = plt.subplots(figsize=(6.0, 1.0 + 0.15 * (label.count("\n") + 1)))
    colour = _VERDICT_COLOURS.get(claim.get("verdict"), "black")
    if not (math.isnan(lo) or math.isnan(hi)):
        ax.errorbar([effect], [0], xerr=[[effect - lo], [hi - effect]], fmt="o", color=colour, capsize=5)
    else:
        ax.plot([effect], [0], "o", color=colour)
    ax.axvline(0, color="black", lw=0.8, ls="--")
    ax.set_yticks([0], [label], fontsize=8)
    ax.set_xlabel(f"{claim.get('metric', '')} effect{unit}")
    ax.grid(axis="x", alpha=0.3)
    return Figure(name, caption, png=_png(fig))


def covariance_figures(runs_dir: Path, run_keys: list[str], labels: dict, missing: list[str]) -> list[Figure]:
    """Heatmaps of the ``all``-token covariance at the first and last checkpoint of the first run that has
    ``covariances.npz`` (keys ``"{epoch}/{layer}"``, float32 (D, D)); up to 4 layers spread over depth."""
    caption = "covariance of the probe tokens (all), first vs last checkpoint"
    present = [k for k in run_keys if (runs_dir / k / "covariances.npz").is_file()]
    if not present:
        return [Figure("covariances", caption, missing="covariance snapshots not recorded")]
    for key in present:
        path = runs_dir / key / "covariances.npz"
        try:
            with np.load(path) as f:
                covs = {k: f[k] for k in f.files}
            parsed = {(int(k.split("/")[0]), k.split("/")[1]): v for k, v in covs.items()}
            if not parsed:
                raise ValueError("no '{epoch}/{layer}' keys")
        except Exception as exc:  # noqa: BLE001 - a truncated npz raises many types; mark it, go on
            missing.append(
                f"run {labels.get(key, key)} (key {key}): artifact covariances.npz unreadable ({exc})"
            )
            continue
        epochs = sorted({e for e, _ in parsed})
        layers = list(dict.fromkeys(layer for _, layer in parsed))
        pick = [layers[i] for i in sorted({round(j * (len(layers) - 1) / 3) for j in range(4)})]
        rows = [epochs[0], epochs[-1]] if len(epochs) > 1 else epochs
        fig, axes = plt.subplots(
            len(rows), len(pick), figsize=(2.6 * len(pick), 2.5 * len(rows)), squeeze=False
        )
        for r, epoch in enumerate(rows):
            for c, layer in enumerate(pick):
                ax = axes[r][c]
                cov = parsed.get((epoch, layer))
                if cov is None:
                    ax.set_axis_off()
                    ax.set_title(f"{layer} @ {epoch}: absent", fontsize=7)
                    continue
                vmax = float(np.nanmax(np.abs(cov))) or 1.0
                im = ax.imshow(cov, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
                ax.set_title(f"{layer}, epoch {epoch}", fontsize=8)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
        return [Figure("covariances", f"{caption}: run {labels.get(key, key)} (key {key})", png=_png(fig))]
    return [Figure("covariances", caption, missing="every covariances.npz was unreadable (see Missing)")]


# ---- the report ----------------------------------------------------------------------------------------
def _read_inputs(study_dir: Path, missing: list[str]) -> tuple[dict, dict, pd.DataFrame | None]:
    vpath = study_dir / "verdicts.json"
    if not vpath.is_file():
        raise StudyError("no verdicts.json here (expected a study folder written by `run`)", str(study_dir))
    try:
        verdicts = json.loads(vpath.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(f"cannot read verdicts ({exc})", str(vpath)) from None
    hyp: dict = {}
    try:
        hyp = yaml.safe_load((study_dir / "hypothesis.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        missing.append(f"hypothesis.yaml unreadable ({type(exc).__name__}); claim regions not shown")
    table = None
    try:
        table = pd.read_parquet(study_dir / "table.parquet")
    except Exception as exc:  # noqa: BLE001 - missing or corrupt: report what we have
        missing.append(f"table.parquet unreadable ({type(exc).__name__}); claim figures not shown")
    return verdicts, hyp, table


def build_report(study_dir: Path, runs_dir: Path | None = None) -> dict:
    """Everything the report shows, as data: ``{title, description, claims, sections, covariances,
    missing, runs, reused, failed, environment}``."""
    study_dir = Path(study_dir)
    runs_dir = Path(runs_dir) if runs_dir else study_dir.parent.parent / "runs"
    missing: list[str] = []
    verdicts, hyp, table = _read_inputs(study_dir, missing)
    claims = verdicts.get("claims", [])
    yaml_claims = hyp.get("claims") or []
    labels = verdicts.get("labels", {})
    sections = []
    for i, c in enumerate(claims):
        raw = yaml_claims[i] if i < len(yaml_claims) and isinstance(yaml_claims[i], dict) else {}
        merged = {**raw, **c}  # the verdict's resolved fields win; regions etc. come from the file
        sec = _Section(f"Claim {i + 1}: {c.get('name', '')}", merged)
        if table is None or table.empty:
            sec.figures.append(Figure(f"profile_{i}", "claim figure", missing="table.parquet unavailable"))
        else:
            try:
                epochs = _claim_epochs(merged, table)
                if _over_epochs(merged, epochs):
                    sec.figures.append(epoch_figure(table, merged))
                else:
                    sec.figures.append(profile_figure(table, merged, merged.get("regions")))
            except Exception as exc:  # noqa: BLE001 - one bad claim must not sink the report
                sec.figures.append(
                    Figure(f"profile_{i}", "claim figure", missing=f"{type(exc).__name__}: {exc}")
                )
        sec.figures.append(effect_figure(merged))
        for f in sec.figures:
            f.name = f"claim{i + 1}_{f.name}"
        sections.append(sec)
    covs = covariance_figures(runs_dir, verdicts.get("runs", []), labels, missing)
    env: dict = {}
    for key in verdicts.get("runs", []):
        try:
            env = json.loads((runs_dir / key / "result.json").read_text()).get("environment") or {}
        except (OSError, json.JSONDecodeError):
            continue
        if env:
            break
    for sec in sections:
        for f in sec.figures:
            if f.missing:
                missing.append(f"{sec.title}: {f.caption}: {f.missing}")
    for f in covs:
        if f.missing and f.missing != "covariance snapshots not recorded":
            missing.append(f"{f.caption}: {f.missing}")
    return {
        "title": verdicts.get("hypothesis", hyp.get("name", study_dir.name)),
        "description": str(hyp.get("description", "")).strip(),
        "file": verdicts.get("file"),
        "command": verdicts.get("command"),
        "claims": claims,
        "sections": sections,
        "covariances": covs,
        "missing": missing,
        "runs": verdicts.get("runs", []),
        "reused": verdicts.get("reused", []),
        "failed": verdicts.get("failed", {}),
        "run_environment": env,
    }


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.4}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}
.ACCEPTED{color:#2e7d32;font-weight:bold}.REJECTED{color:#c62828;font-weight:bold}
.INCONCLUSIVE{color:#6d6d6d;font-weight:bold}
figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}img{max-width:100%;height:auto}
.missing{background:#fff3e0;border-left:4px solid #ef6c00;padding:6px 10px}
pre{background:#f6f6f6;padding:8px;overflow-x:auto}
"""


def _verdict_rows(claims: list[dict]) -> list[list[str]]:
    rows = []
    for c in claims:
        unit = " pp" if str(c.get("metric", "")).endswith("_pct") else ""
        seeds = c.get("n_seeds", c.get("seeds", ""))
        seeds = str(len(seeds)) if isinstance(seeds, list | tuple) else str(seeds)
        rows.append(
            [
                str(c.get("name", "")),
                str(c.get("kind", "")),
                str(c.get("metric", "")),
                _claim_subset_text(c),
                str(c.get("verdict", "")),
                f"{_fmt(c.get('effect'))}{unit} ({_fmt(c.get('ci_low'))}, {_fmt(c.get('ci_high'))})",
                _fmt_p(c.get("p_value")),
                _fmt_p(c.get("p_adjusted")),
                seeds,
            ]
        )
    return rows


_HEADERS = ["claim", "kind", "metric", "subset", "verdict", "effect (95% CI)", "p", "p (Holm)", "seeds"]


def _reproduce(rep: dict, vers: dict) -> tuple[str, str]:
    command = rep.get("command") or (f"python -m study run {rep['file']}" if rep.get("file") else "n/a")
    lines = [f"{k}: {v}" for k, v in vers.items()]
    lines += [f"run environment {k}: {v}" for k, v in (rep.get("run_environment") or {}).items()]
    return command, "\n".join(lines)


def _html(rep: dict, vers: dict) -> str:
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>study report: {e(rep['title'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Study report: {e(rep['title'])}</h1>",
    ]
    if rep["description"]:
        out.append(f'<p class="description">{e(rep["description"])}</p>')
    out.append(
        f"<p>{len(rep['runs'])} runs ({len(rep['reused'])} reused from earlier invocations, "
        f"{len(rep['failed'])} failed).</p>"
    )
    out.append('<h2>Verdicts</h2><table id="verdicts" class="verdicts"><thead><tr>')
    out += [f"<th>{e(h)}</th>" for h in _HEADERS]
    out.append("</tr></thead><tbody>")
    for row in _verdict_rows(rep["claims"]):
        cells = [
            f'<td class="{e(v)}">{e(v)}</td>' if j == 4 else f"<td>{e(v)}</td>" for j, v in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    for c in rep["claims"]:
        for w in c.get("warnings") or []:
            out.append(f'<p class="warning">! {e(str(c.get("name")))}: {e(str(w))}</p>')
        for seed, why in (c.get("seeds_excluded") or {}).items():
            out.append(
                f'<p class="warning">! {e(str(c.get("name")))}: seed {e(str(seed))} excluded ({e(str(why))})</p>'
            )

    def fig_html(f: Figure) -> str:
        if f.png is None:
            return f'<p class="missing">missing: {e(f.caption)}: {e(f.missing or "")}</p>'
        data = base64.b64encode(f.png).decode("ascii")
        return (
            f'<figure><img alt="{e(f.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(f.caption)}</figcaption></figure>"
        )

    for sec in rep["sections"]:
        c = sec.claim
        out.append(f"<h2>{e(sec.title)}</h2>")
        out.append(
            f'<p>Verdict <span class="{e(str(c.get("verdict")))}">{e(str(c.get("verdict")))}</span>; '
            f"kind <code>{e(str(c.get('kind')))}</code>, metric <code>{e(str(c.get('metric')))}</code>, "
            f"subset <code>{e(_claim_subset_text(c))}</code>.</p>"
        )
        if c.get("regions"):
            regions = "; ".join(f"{k}: {', '.join(v)}" for k, v in c["regions"].items())
            out.append(f"<p>Regions (declared in the file): {e(regions)}</p>")
        out += [fig_html(f) for f in sec.figures]
    out.append("<h2>Covariance snapshots</h2>")
    for f in rep["covariances"]:
        if f.png is None and f.missing == "covariance snapshots not recorded":
            out.append('<p class="note">covariance snapshots not recorded</p>')
        else:
            out.append(fig_html(f))
    if rep["missing"]:
        out.append('<h2>Missing</h2><ul class="missing">')
        out += [f"<li>{e(m)}</li>" for m in rep["missing"]]
        out.append("</ul>")
    command, vtext = _reproduce(rep, vers)
    out.append(f"<h2>Reproduce</h2><pre>{e(command)}</pre><pre>{e(vtext)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


def _markdown(rep: dict, vers: dict, fig_paths: dict[str, str]) -> str:
    def cell(v: str) -> str:
        return v.replace("|", "\\|")

    out = [f"# Study report: {rep['title']}", ""]
    if rep["description"]:
        out += [rep["description"], ""]
    out += [
        f"{len(rep['runs'])} runs ({len(rep['reused'])} reused, {len(rep['failed'])} failed).",
        "",
        "## Verdicts",
        "",
        "| " + " | ".join(_HEADERS) + " |",
        "|" + "---|" * len(_HEADERS),
    ]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in _verdict_rows(rep["claims"])]
    out.append("")
    for c in rep["claims"]:
        out += [f"- ! {c.get('name')}: {w}" for w in c.get("warnings") or []]
        out += [
            f"- ! {c.get('name')}: seed {k} excluded ({v})"
            for k, v in (c.get("seeds_excluded") or {}).items()
        ]
    for sec in rep["sections"]:
        out += ["", f"## {sec.title}", ""]
        for f in sec.figures:
            out.append(
                f"![{f.caption}]({fig_paths[f.name]})"
                if f.name in fig_paths
                else f"*missing: {f.caption}: {f.missing}*"
            )
            out.append("")
    out += ["## Covariance snapshots", ""]
    for f in rep["covariances"]:
        out.append(f"![{f.caption}]({fig_paths[f.name]})" if f.name in fig_paths else f"*{f.missing}*")
    if rep["missing"]:
        out += ["", "## Missing", ""] + [f"- {m}" for m in rep["missing"]]
    command, vtext = _reproduce(rep, vers)
    out += ["", "## Reproduce", "", "```", command, "```", "", "```", vtext, "```", ""]
    return "\n".join(out)


def write_report(
    study_dir: str | Path, runs_dir: str | Path | None = None, command: str | None = None
) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` (figures under ``figures/``) into ``study_dir``.

    Args:
        study_dir: ``<out>/studies/<name>`` as written by ``run``.
        runs_dir: the run folders (default ``<out>/runs``), for covariance snapshots and versions.
        command: the command to print under "Reproduce" (default: the one in ``verdicts.json``).

    Returns:
        (html path, markdown path).

    Raises:
        StudyError: ``study_dir`` has no readable ``verdicts.json`` (nothing to report on).
    """
    study_dir = Path(study_dir)
    rep = build_report(study_dir, runs_dir)
    if command:
        rep["command"] = command
    vers = versions()
    fig_dir = study_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    fig_paths: dict[str, str] = {}
    for f in [f for s in rep["sections"] for f in s.figures] + rep["covariances"]:
        if f.png is not None:
            (fig_dir / f"{f.name}.png").write_bytes(f.png)
            fig_paths[f.name] = f"figures/{f.name}.png"
    html_path, md_path = study_dir / "report.html", study_dir / "report.md"
    for path, text in ((html_path, _html(rep, vers)), (md_path, _markdown(rep, vers, fig_paths))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return html_path, md_path
