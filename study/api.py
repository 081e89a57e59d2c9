"""The Python API: the CLI's verbs as functions that return objects (DataFrames, figures) instead of printing.

    import study

    study.validate("hypotheses/u_shape.yaml")                   # Validation (.message: the CLI's "ok: ..." line)
    result = study.run("hypotheses/u_shape.yaml", out="study_results", workers=2)   # StudyResult
    result.verdicts                                             # DataFrame, one row per claim
    result.profile("eed_pct")                                   # per-seed rows, mean and 95% t CI by layer
    result = study.load("study_results")                        # a finished study (or sweep) folder
    study.analyze("hypotheses/u_shape.yaml", my_table)          # Verdicts of a table from anywhere

``python -m study validate|plan|run|analyze|report`` parse their flags and call these functions, so the CLI
and the API are one code path. A hypothesis is given as a YAML file's path, as the mapping such a file
holds, or as a validated ``study.schema.Hypothesis``. Bad input raises
``vitstudy_core.errors.StudyError``: the CLI's one line (file, field, expectation; a parameter is named by
its CLI flag, ``--workers``), as an exception, never an exit.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from study.results import StudyResult, Verdicts, read_result
from study.schema import Hypothesis
from vitstudy_core.errors import StudyError

if TYPE_CHECKING:
    from analysis.sequential import Spending

HypothesisLike = str | os.PathLike | Mapping[str, Any] | Hypothesis
Log = Callable[[str], None]


def _hypothesis(hypothesis: HypothesisLike, trains: bool = True) -> tuple[Hypothesis, Path | None, str]:
    """(the validated hypothesis, its file or None, the name errors give for it). ``trains=False``: for a
    saved table, without ``design.max_runs`` (a bound on training)."""
    from study.schema import load_hypothesis, parse_hypothesis

    if isinstance(hypothesis, Hypothesis):
        return hypothesis, None, f"<hypothesis {hypothesis.name}>"
    if isinstance(hypothesis, Mapping):
        return parse_hypothesis(dict(hypothesis), "<hypothesis>", trains), None, "<hypothesis>"
    if isinstance(hypothesis, str | os.PathLike):
        return load_hypothesis(hypothesis, trains), Path(hypothesis), str(hypothesis)
    raise StudyError(
        f"expected a hypothesis file's path, a mapping or a Hypothesis, got {type(hypothesis).__name__}"
    )


def _as_file(hypothesis: HypothesisLike, hyp: Hypothesis, path: Path | None, out: Path) -> Path:
    """The hypothesis's file; a mapping or a Hypothesis is written to ``<out>/hypotheses/<name>.yaml``
    first (the study records its file: ``verdicts.json``, ``hypothesis.yaml``, the MLflow parent run)."""
    if path is not None:
        return path
    import yaml

    from vitstudy_core.io import atomic_write_text

    data = (
        dict(hypothesis)
        if isinstance(hypothesis, Mapping)
        else hyp.model_dump(mode="json", exclude_unset=True)
    )
    return atomic_write_text(out / "hypotheses" / f"{hyp.name}.yaml", yaml.safe_dump(data, sort_keys=False))


# ---- validate and plan ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Validation:
    """A hypothesis that passed every check ``run`` makes before training (:func:`validate`).

    Attributes:
        hypothesis: the validated hypothesis; file: how it was given (path, or ``<hypothesis>``).
        n_claims, n_seeds: its claims and seeds; n_runs: runs planned (a sweep: trials x seeds).
        n_trials: a sweep's trials (None for a study).
        n_cells, n_trained_cells: a design with conditions: its cells, and those that train (0: none).
        warnings: what passes but cannot be tested (``field: why``; ``study.preflight.design_warnings``).
    """

    hypothesis: Hypothesis
    file: str
    n_claims: int
    n_seeds: int
    n_runs: int
    n_trials: int | None = None
    n_cells: int = 0
    n_trained_cells: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """The line ``python -m study validate`` prints."""
        if self.n_trials is not None:
            return (
                f"ok: {self.file}: {self.n_claims} claim(s), a sweep of {self.n_trials} trial(s) x "
                f"{self.n_seeds} seeds = {self.n_runs} run(s)"
            )
        if self.n_cells:  # a design with conditions: its size, as the plan counts it
            n_datasets = len(self.hypothesis.design.datasets)
            return (
                f"ok: {self.file}: {self.n_claims} claim(s), {self.n_cells} cell(s) ({self.n_trained_cells} "
                f"trained) x {n_datasets} dataset(s) x {self.n_seeds} seed(s) = {self.n_runs} run(s) planned"
            )
        return f"ok: {self.file}: {self.n_claims} claim(s), {self.n_runs} run(s) planned"


def validate(hypothesis: HypothesisLike, out: str | Path = "study_results") -> Validation:
    """Check a hypothesis without running anything: its schema, then what would stop ``run`` later (model
    and patch sizes, memory and disk for ``out``, every claim on a synthetic table).

    Raises:
        StudyError: the first problem, in one line.
    """
    from study.preflight import check_hypothesis, design_warnings
    from study.runspecs import plan_runs

    hyp, _, file = _hypothesis(hypothesis)
    check_hypothesis(hyp, file, Path(out))
    seeds = len(hyp.design.seeds)
    warned = tuple(design_warnings(hyp))
    if hyp.sweep is not None:
        from study.sweep.loop import trial_target
        from study.sweep.storage_check import check_storage

        check_storage(hyp.sweep.storage, file)  # as `sweep` checks it, naming the file's sweep.storage
        trials = trial_target(hyp, None, file)
        return Validation(hyp, file, len(hyp.claims), seeds, trials * seeds, trials, warnings=warned)
    cells = hyp.design.cells() if hyp.design.condition_names() else []
    trained = sum(1 for c in cells if not c.untrained)
    runs = len(plan_runs(hyp))
    return Validation(hyp, file, len(hyp.claims), seeds, runs, None, len(cells), trained, warned)


@dataclass(frozen=True)
class SeedPlan:
    """Seeds and run-hours each claim needs for 80%/90% power (:func:`plan`).

    Attributes:
        data: the plan as ``python -m study plan --json`` prints it (``study.seed_plan.plan_study``).
    """

    data: dict

    @property
    def claims(self) -> pd.DataFrame:
        """One row per claim (index: its name): effect, SD and its bound, seeds for 80%/90%, run-hours."""
        return pd.DataFrame(self.data["claims"]).set_index("claim")

    def to_json(self) -> str:
        import json

        return json.dumps(self.data, indent=1, default=float)

    def __str__(self) -> str:
        """The text table ``python -m study plan`` prints."""
        from study.seed_plan import format_plan

        return format_plan(self.data)


def plan(
    hypothesis: HypothesisLike, out: str | Path = "study_results", pilot: str | Path | None = None
) -> SeedPlan:
    """The seeds each claim needs for 80%/90% power, and the run-hours (trains nothing).

    Args:
        out: the output folder of ``run``: its finished runs give the time per run, its study's own table
            is the pilot when ``pilot`` is not given.
        pilot: a tidy table (.parquet or .csv) to take the per-seed SD from.
    """
    import study.seed_plan as seed_plan

    hyp, _, _ = _hypothesis(hypothesis)
    if pilot is not None and not Path(pilot).is_file():
        raise StudyError("file not found (expected a tidy table, .parquet or .csv)", str(pilot), "--pilot")
    pilot = Path(pilot) if pilot is not None else None
    # the module's timers, looked up now: measured only when no finished run gives the time
    data = seed_plan.plan_study(hyp, Path(out), pilot, seed_plan._timed_step, seed_plan._timed_extract)
    return SeedPlan(data)


# ---- run ------------------------------------------------------------------------------------------------
class _Bar:
    """Training progress as a ``tqdm.auto`` bar per look (a widget in Jupyter with ipywidgets, text
    elsewhere); log lines go through ``tqdm.write`` so they do not tear a bar that is drawn."""

    def __init__(self) -> None:
        self._bar: Any = None

    def start(self, heading: str, total: int) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=heading, unit="run")

    def advance(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(label)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, line: str) -> None:
        if self._bar is None:
            print(line, flush=True)
        else:
            self._bar.write(line)


def _workers(value: int | str) -> int | str:
    if value == "auto":
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and value.isdigit() and int(value) >= 1:
        return int(value)
    raise StudyError(f"--workers: expected 'auto' or a positive integer, got {value!r}")


def _sequential(
    hyp: Hypothesis, file: str, until_decided: bool, max_seeds: int | None, batch: int, spending: Spending
):
    """The ``until_decided`` plan (``study.pipeline.orchestrate.SequentialPlan``), or None."""
    if not until_decided:
        return None
    from study.pipeline.orchestrate import SequentialPlan

    n = len(hyp.design.seeds)
    most = max_seeds if max_seeds is not None else 2 * n
    if most < n or batch < 1:
        raise StudyError(
            f"expected --max-seeds >= the file's {n} seeds and --batch >= 1, got {most} and {batch}",
            file,
            "--max-seeds",
        )
    return SequentialPlan(most, batch, spending)


def _with_roots(
    hyp: Hypothesis, file: str, data_roots: Mapping[str, str] | Sequence[str] | None
) -> Hypothesis:
    """``hyp`` with its on-disk datasets' folders from ``data_roots`` (name -> folder, or ``NAME=PATH``
    strings as ``--data-root`` gives them)."""
    from study.schema import with_data_roots

    if data_roots is None or isinstance(data_roots, Mapping):
        roots = {str(k): str(v) for k, v in (data_roots or {}).items()}
    else:
        given = [str(r) for r in data_roots]
        roots = dict(r.partition("=")[::2] for r in given)
        if any(not k or not v for k, v in roots.items()) or len(roots) != len(given):
            raise StudyError(f"--data-root: expected NAME=PATH, got {given}")
    return with_data_roots(hyp, roots, file) if roots else hyp


def _placement(
    executor: str,
    address: str,
    cpus: float,
    gpus: float,
    leases: str | None,
    options: Mapping[str, str] | None = None,
):
    """Where the runs execute (``stages.Placement``), checked: an unreachable cluster or database is one
    line before anything is written."""
    import study.pipeline.stages as stages
    from study.cluster.jobs import check_reachable

    if cpus <= 0 or gpus < 0:
        raise StudyError("--cpus-per-run / --gpus-per-run: expected CPUs > 0 and GPUs >= 0")
    placement = stages.Placement(executor, address, cpus, gpus, leases, tuple((options or {}).items()))
    check_reachable(placement)
    return placement


def run(
    hypothesis: HypothesisLike,
    out: str | Path = "study_results",
    *,
    workers: int | str = "auto",
    force: bool = False,
    track: bool = True,
    log_model: bool = False,
    report: bool = True,
    data_roots: Mapping[str, str] | Sequence[str] | None = None,
    new_registration: str | None = None,
    until_decided: bool = False,
    max_seeds: int | None = None,
    batch: int = 2,
    spending: Spending = "obf",
    executor: str = "local",
    address: str = "auto",
    cpus_per_run: float = 1,
    gpus_per_run: float = 0,
    leases: str | None = None,
    executor_options: Mapping[str, str] | None = None,
    progress: bool = True,
    log: Log | None = None,
    command: str | None = None,
) -> StudyResult:
    """Train (or reuse) the runs a hypothesis needs and test its claims: ``python -m study run``'s stages
    (``study.pipeline.orchestrate.run_study``), the same flags as keyword arguments.

    Args:
        hypothesis: a file's path, a mapping (written to ``<out>/hypotheses/<name>.yaml`` first) or a
            ``Hypothesis``; not a sweep (see ``python -m study sweep``).
        out: the output folder (runs, data caches, ``studies/<name>/``, the MLflow store).
        workers: parallel training processes, or ``auto`` (one per CPU core).
        force, track, log_model, report: ``--force``, not ``--no-mlflow``, ``--log-model``, not
            ``--no-report``.
        data_roots: dataset name -> folder of an on-disk dataset, or ``NAME=PATH`` strings (``--data-root``).
        new_registration: start the study's registration afresh, for this reason.
        until_decided, max_seeds, batch, spending: add seeds in batches until every confirmatory claim is
            decided (group-sequential; default ``max_seeds``: twice the file's seeds).
        executor, address, cpus_per_run, gpus_per_run, leases: where runs train (``stages.Placement``).
        executor_options: the executor's own options (Slurm: ``partition``, ``time``,
            ``array_parallelism`` and any ``sbatch`` option, as ``--slurm-*`` gives them).
        progress: a progress bar per look (``tqdm.auto``), log lines printed above it; False: lines only.
        log: where progress lines go instead (a callable taking one line).
        command: what to record as the command that ran the study (MLflow, the report).

    Returns:
        The finished study's :class:`StudyResult` (``outcome``: what was trained, reused and failed).
    """
    import study.pipeline.orchestrate as orchestrate
    import study.pipeline.stages as stages

    hyp, path, file = _hypothesis(hypothesis)
    if hyp.sweep is not None:
        raise StudyError(
            "this file declares a sweep: run it with `python -m study sweep FILE`", file, "sweep"
        )
    out = Path(out)
    hyp = _with_roots(hyp, file, data_roots)
    if new_registration is not None and not new_registration.strip():
        raise StudyError("--new-registration: expected a reason (recorded with the new registration)")
    workers = _workers(workers)
    placement = _placement(executor, address, cpus_per_run, gpus_per_run, leases, executor_options)
    bar = _Bar() if progress and log is None else None
    opts = stages.RunOptions(
        workers, force, track, log_model, report, command, placement, bar, new_registration
    )
    seq = _sequential(hyp, file, until_decided, max_seeds, batch, spending)
    hyp_path = _as_file(hypothesis, hyp, path, out)
    emit = log or (bar.write if bar is not None else print)
    outcome = orchestrate.run_study(hyp, hyp_path, out, opts, seq, log=emit)
    return read_result(outcome.study_dir, outcome)


# ---- load, analyze, report ------------------------------------------------------------------------------
def _study_folder(path: Path, name: str | None) -> Path:
    """The study or sweep folder ``path`` names: itself (it holds ``verdicts.json``), or the one finished
    study or sweep of an output folder (``name`` picks one of several)."""
    if (path / "verdicts.json").is_file() and name is None:
        return path
    found = {
        p.name: p
        for sub in ("studies", "sweeps")
        for p in sorted((path / sub).glob("*"))
        if (p / "verdicts.json").is_file()
    }
    if name is not None:
        if name not in found:
            raise StudyError(
                f"expected a finished study or sweep named one of {sorted(found)}, got {name!r}", str(path)
            )
        return found[name]
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        raise StudyError(
            "expected a study folder with verdicts.json, or an output folder holding one (run the study first)",
            str(path),
        )
    names = sorted(found)
    raise StudyError(
        f"{len(names)} finished studies and sweeps here {names}: pick one with "
        f"study.load({str(path)!r}, name={names[0]!r})",
        str(path),
    )


def load(path: str | Path = "study_results", name: str | None = None) -> StudyResult:
    """A finished study or sweep, from its folder alone (no training, no MLflow).

    Args:
        path: a study folder (``<out>/studies/<name>``), a sweep folder (``<out>/sweeps/<name>``), or an
            output folder holding one finished study or sweep.
        name: which study or sweep of an output folder that holds several.

    Raises:
        StudyError: nothing finished there (no ``verdicts.json``), or several and no ``name``.
    """
    return read_result(_study_folder(Path(path), name))


def _claims(claims_or_hypothesis: Any) -> tuple[Any, str]:
    """(an object with ``.claims``, the name errors give): a hypothesis in any form, or claims alone (a
    mapping with a ``kind``, or a list of such mappings or of validated claim models)."""
    from types import SimpleNamespace

    from study.schema import parse_claims

    given = claims_or_hypothesis
    if isinstance(given, Mapping) and "kind" in given and "design" not in given:
        given = [given]
    if isinstance(given, list):
        dicts = [dict(c) if isinstance(c, Mapping) else c.model_dump(mode="json") for c in given]
        return SimpleNamespace(claims=parse_claims(dicts, "<claims>")), "<claims>"
    hyp, _, file = _hypothesis(given, trains=False)  # analyze trains nothing: max_runs does not apply
    return hyp, file


def _check_named(claims: Any, table: pd.DataFrame, file: str) -> None:
    """Every dataset and layer a claim names is in the table (claims without a design are checked here
    instead of against one)."""
    layers = table.drop_duplicates("layer").sort_values("layer_index")["layer"]
    present = {"dataset": sorted(map(str, table["dataset"].unique())), "layer": list(map(str, layers))}
    for i, claim in enumerate(claims):
        for fld, what, value in claim.named():
            if what in present and value not in present[what]:
                raise StudyError(
                    f"expected a {what} of the table {present[what]}, got {value!r}",
                    file,
                    f"claims[{i}].{fld}",
                )


def analyze(claims_or_hypothesis: Any, table: pd.DataFrame | str | Path) -> Verdicts:
    """Test claims on a tidy table from anywhere (no training): ``python -m study analyze``.

    Args:
        claims_or_hypothesis: a hypothesis (file path, mapping or ``Hypothesis``), or claims alone: one claim
            mapping (``{name, kind, metric, subset, ...}`` as under ``claims:`` in a file) or a list of them;
            claims alone are checked against the table's datasets and layers instead of a design.
        table: (N rows) DataFrame with columns ``dataset, seed, epoch, layer, token_set, metric, value``
            (``layer_index`` and ``n_tokens`` are derived when absent), or a .parquet/.csv file of one; a
            file's ``registration.json`` beside it gives the claims' registration status.

    Returns:
        :class:`Verdicts`, one result per claim (Holm across confirmatory claims, as in a study).

    Raises:
        StudyError: a column is missing (the error names every missing one), a value is malformed, or a
            claim names a dataset, layer or metric slice the table lacks.
    """
    import study.registration as registration
    from analysis.table import check_table, load_table
    from analysis.verdicts import evaluate_claims

    hyp, file = _claims(claims_or_hypothesis)
    if isinstance(table, pd.DataFrame):
        frame, note = check_table(table), None
        post_hoc: set[str] = set()
        status: dict[str, dict] = {}
    else:
        frame = load_table(table)
        post_hoc, status, note = registration.for_table(Path(table), hyp)
    if file == "<claims>":
        _check_named(hyp.claims, frame, file)
    results = evaluate_claims(hyp, frame, source=file, post_hoc=post_hoc)
    registration.attach(results, status)
    return Verdicts(results, note)


def report(study: str | Path, out: str | Path = "study_results") -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` of a finished study or sweep: ``python -m study report``.

    Args:
        study: its folder (``<out>/studies/<name>`` or ``<out>/sweeps/<name>``) or its hypothesis file (then
            the folder is looked up under ``out``).

    Returns:
        (the HTML path, the Markdown path).
    """
    from study.schema import load_hypothesis

    folder = Path(study)
    if folder.is_file():
        hyp = load_hypothesis(folder)
        folder = Path(out) / ("sweeps" if hyp.sweep else "studies") / hyp.name
    if (folder / "trials.csv").is_file() and (folder / "verdicts.json").is_file():
        from study.sweep.report import report_from_folder

        html_path = report_from_folder(folder)
        return html_path, html_path.with_suffix(".md")
    html_path = read_result(folder).report()
    return html_path, html_path.with_suffix(".md")
