"""Every command in the README and the docs is run by a test, and every link and path they give exists.

The commands are read from ``README.md``, ``docs/*.md`` and ``bench/README.md``: the lines of code blocks
(fenced or indented; YAML and other non-shell blocks skipped) and inline code spans that start like a
command (``python -m study``, ``study VERB``, ``pip install``, ``PYTHONPATH=. python bench/...``, ...).
Each one must match exactly one rule of :data:`RULES`:

* ``Run``: cheap and self-contained, so it is run here as written, in a temporary folder (with
  ``hypotheses/`` linked in and whatever inputs it names made first), with PYTHONPATH set to the repo;
* ``Mapped``: it is run, at test size, by the named tests of the default suite; the test asserts that
  they are collected by ``python -m pytest`` with the default options (a ``slow`` test would not be);
* ``Bench``: a benchmark (minutes to hours): the script exists and takes every option the docs give it
  (its ``--help``); where a test runs its code path at tiny size, that test is named too;
* ``External``: another tool's command the docs show for setting up a cluster; no test of ours runs it,
  and the reason says so.

A command that matches no rule fails the test, so a new command in the docs needs a test (or a rule saying
why not). Every ``python -m study VERB`` command must also name a real verb and only options that verb
has. About 40 s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md"]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
# how a command starts: optional prompt and wrappers, then a program we know
_WRAPPERS = r"(?:\$ )?(?:nice )?(?:/usr/bin/time -v )?"
_START = re.compile(_WRAPPERS + r"(?:PYTHONPATH=\S+ )?(?:python3?|pip|study|mlflow|ray|sudo|apt-get)(?: |$)")


# --------------------------------------------------------------------------------------------------
# Reading the docs
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Command:
    """One shell command of the docs (a part of an ``&&`` chain is a command of its own)."""

    text: str
    where: str  # file:line

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def _strip_comment(line: str) -> str:
    """Drop a trailing ``# comment``: a ``#`` after whitespace, outside quotes."""
    for m in re.finditer(r"\s#", line):
        head = line[: m.start()]
        if head.count('"') % 2 == 0 and head.count("'") % 2 == 0:
            return head.rstrip()
    return line.rstrip()


def _commands_in(text: str, where: str) -> list[Command]:
    """The commands of one code line (or inline span): comment dropped, ``&&`` split, wrappers kept."""
    text = _strip_comment(text.strip())
    text = re.sub(r"^\$ ", "", text)
    out = []
    for part in text.split("&&"):
        part = " ".join(part.split())
        if _START.match(part) and _looks_like_a_command(part):
            out.append(Command(part, where))
    return out


def _looks_like_a_command(text: str) -> bool:
    """``study`` and ``python -m study`` need a verb after them; output lines such as ``study second:
    5 runs planned`` and the bare name ``python -m study`` are not commands."""
    bare = _unwrap(text)
    if bare.startswith("study"):
        return bool(re.match(r"study [a-z]+(?: |$)", bare)) and not re.match(r"study \w+:", bare)
    if bare.startswith(("python -m study", "python3 -m study")):
        return bool(re.match(r"python3? -m study [a-z-]+", bare))
    return True


def _unwrap(text: str) -> str:
    """The command without ``nice`` / ``/usr/bin/time -v`` in front (PYTHONPATH= is kept)."""
    return re.sub(r"^(?:nice |/usr/bin/time -v )+", "", text)


def extract_commands(path: Path) -> list[Command]:
    """Every command in a Markdown file's code blocks and inline code spans."""
    lines = path.read_text().split("\n")
    rel = path.relative_to(REPO).as_posix()
    found: list[Command] = []
    fence: str | None = None
    prose: list[tuple[int, str]] = []
    pending = ""  # a code line continued with a trailing backslash
    prev_blank, in_indented = True, False
    for i, line in enumerate(lines, 1):
        m = re.match(r"^\s*```(\w*)", line)
        if m:
            fence = None if fence is not None else m.group(1)
            continue
        code = fence is not None and fence in SHELL_LANGS
        if fence is None:
            indented = line.startswith("    ") and line.strip() and (prev_blank or in_indented)
            in_indented = bool(indented) or (in_indented and not line.strip())
            code = bool(indented)
            prev_blank = not line.strip()
            if not code:
                prose.append((i, line))
        if code:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            found += _commands_in(pending + line, f"{rel}:{i}")
            pending = ""
    found += _inline_commands(prose, rel)
    return found


def _inline_commands(prose: list[tuple[int, str]], rel: str) -> list[Command]:
    """Commands in inline code spans of the prose (a span may run over a line break)."""
    text = "\n".join(line for _, line in prose)
    starts = {}
    offset = 0
    for n, line in prose:
        starts[offset] = n
        offset += len(line) + 1
    offsets = sorted(starts)
    out = []
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(m.group(1).split())
        line_no = starts[max(o for o in offsets if o <= m.start())]
        out += _commands_in(span, f"{rel}:{line_no}")
    return out


ALL_COMMANDS = [c for path in DOC_FILES for c in extract_commands(path)]


# --------------------------------------------------------------------------------------------------
# What runs each command
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Run the command as written in a temporary folder, after ``setup(folder)`` made its inputs."""

    setup: Callable[[Path], None] | None = None
    cwd_repo: bool = False  # a bench script run from the repo root (``PYTHONPATH=.``)
    # exit statuses that pass: a bench script's "over its time budget" (a measurement, which a test on a
    # loaded machine does not judge) is not an error
    ok: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class Mapped:
    """Run at test size by these tests of the default suite (``file::function``)."""

    tests: tuple[str, ...]


@dataclass(frozen=True)
class Bench:
    """A benchmark: its options are checked against its ``--help``; ``tests`` run its code path small."""

    tests: tuple[str, ...] = ()


@dataclass(frozen=True)
class External:
    """Another tool's set-up command; no test of this project runs it."""

    reason: str


@dataclass(frozen=True)
class Rule:
    pattern: str
    action: Run | Mapped | Bench | External
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", re.compile(self.pattern))


def _pilot(folder: Path) -> None:
    """A pilot's tidy table, and a finished run of u_shape.yaml's design (its epoch time), as a pilot leaves them."""
    from analysis.simulate import simulate_study_table
    from analysis.table import save_table
    from study.runspecs import plan_runs
    from study.schema import load_hypothesis
    from vitstudy_core.runfolder import RunFolder

    save_table(simulate_study_table(n_seeds=3), folder / "pilot" / "table.parquet")
    spec = plan_runs(load_hypothesis(folder / "hypotheses" / "u_shape.yaml"))[0]
    spec = spec.model_copy(update={"seed": 99, "key": "pilot"})
    RunFolder(folder / "study_results" / "runs" / "pilot").write_result(
        {"status": "finished", "run": spec.model_dump(), "history": [{"epoch": 1, "epoch_s": 30.0}]}
    )


def _study_table(folder: Path) -> None:
    """A finished study's tidy table where ``run`` leaves it (simulated: 5 seeds, a planted U)."""
    from analysis.simulate import simulate_study_table
    from analysis.table import save_table

    save_table(
        simulate_study_table(n_seeds=5), folder / "study_results" / "studies" / "u_shape" / "table.parquet"
    )


def _spectrum(folder: Path) -> None:
    import numpy as np

    np.save(folder / "SPECTRUM.npy", np.exp(-0.3 * np.arange(16)))


E2E = (
    "tests/test_end_to_end.py::test_outputs_written",
    "tests/test_end_to_end.py::test_rerun_reuses_and_analyze_agrees",
)
CLUSTER = (
    "tests/scale_out/test_executors.py::test_executor_contract"  # the Ray executor on a loopback cluster
)
PLUGIN = "tests/plugins/test_third_party_plugin.py::"
RULES: list[Rule] = [
    # ---- run here
    Rule(r"^python -m study validate hypotheses/[\w/]+\.yaml$", Run()),
    Rule(
        r"^python -m study analyze hypotheses/u_shape\.yaml --table study_results/studies/u_shape/table\.parquet$",
        Run(_study_table),
    ),
    Rule(r"^python -m study plan hypotheses/u_shape\.yaml --pilot pilot/table\.parquet$", Run(_pilot)),
    Rule(r"^python -m study metrics SPECTRUM\.npy$", Run(_spectrum)),
    Rule(r"^python -m study plugins$", Run()),
    # docs/plugins.md's example package, built and installed in a fresh venv by one slow test module
    Rule(
        r'^python -m pip install "setuptools>=70\.1"$',
        Mapped((PLUGIN + "test_plugins_names_the_distribution",)),
    ),
    Rule(
        r"^python -m pip wheel --no-deps --no-build-isolation -w dist \.$",
        Mapped((PLUGIN + "test_plugins_names_the_distribution",)),
    ),
    Rule(
        r"^python -m pip install dist/vitstudy_example-0\.1\.0-",
        Mapped((PLUGIN + "test_plugins_names_the_distribution",)),
    ),
    Rule(
        r"^python -m pytest tests/$",
        Mapped((PLUGIN + "test_the_shipped_contract_suite_runs_on_the_plugins_parts",)),
    ),
    Rule(
        r"^python -m study run example\.yaml --out out$",
        Mapped((PLUGIN + "test_a_study_using_the_three_parts_validates_and_runs",)),
    ),
    Rule(r"^PYTHONPATH=\. python bench/analyze\.py$", Run(cwd_repo=True, ok=(0, 3))),  # 3: over budget
    # ---- the suite itself and installs
    Rule(
        r'^pip install -e "\.\[test\]"$',
        Mapped(("tests/test_docs.py::test_ci_runs_the_readme_test_command_in_a_venv_then_the_slow_tests",)),
    ),
    Rule(
        r"^python -m pytest -m slow$",
        Mapped(("tests/test_docs.py::test_ci_runs_the_readme_test_command_in_a_venv_then_the_slow_tests",)),
    ),
    Rule(
        r"^python -m pytest$",
        Mapped(("tests/test_docs.py::test_ci_runs_the_readme_test_command_in_a_venv_then_the_slow_tests",)),
    ),
    Rule(
        r"^pip install -e \.$",
        Mapped(
            (
                "tests/test_packaging.py::test_the_wheel_holds_our_four_packages_and_no_generic_core",
                "tests/test_packaging.py::test_installed_copy_is_the_one_imported",
            )
        ),
    ),
    Rule(
        r'^pip install -e "\.\[(?:ray|dashboard|slurm)\]"$',
        Mapped(("tests/test_docs.py::test_extras_named_in_the_docs_exist",)),
    ),
    # ---- run at test size by other tests
    Rule(  # writes the installed timm's registry into the package's data file (a test writes a copy)
        r"^python -m runners\.model_table$",
        Mapped(
            (
                "tests/test_model_table.py::test_ship_table_adds_the_installed_version_and_keeps_the_others",
                "tests/test_model_table.py::test_the_shipped_table_is_the_installed_timm_s_registry",
            )
        ),
    ),
    Rule(r"^python -m study run hypotheses/u_shape\.yaml$", Mapped(E2E)),
    Rule(r"^python -m study run FILE$", Mapped(E2E)),
    Rule(
        r"^python -m study run hypotheses/controls\.yaml$",
        Mapped(
            (
                "tests/schema/test_conditions.py::test_a_cell_shared_with_a_single_condition_file_is_not_retrained",
            )
        ),
    ),
    Rule(
        r"^python -m study run hypotheses/paper/tgo_i_import\.yaml --data-root source=\S+$",
        Mapped(("tests/sources/test_imported.py::test_tgo_i_import_file_on_a_tgo_layout_log",)),
    ),
    Rule(
        r"^python -m study run FILE --data-root NAME=PATH$",
        Mapped(
            (
                "tests/sources/test_imported.py::test_tgo_i_import_file_on_a_tgo_layout_log",
                "tests/schema/test_design.py::test_cli_data_root_flag_errors",
            )
        ),
    ),
    Rule(
        r"^python -m study run FILE --until-decided",
        Mapped(
            (
                "tests/test_until_decided.py::test_stops_early_on_a_planted_large_effect",
                "tests/test_until_decided.py::test_until_decided_with_real_training",
            )
        ),
    ),
    Rule(r"^python -m study run FILE --executor ray ", Mapped((CLUSTER,))),
    Rule(  # every GPU of a node: against a fake list of GPUs here, the real ones under -m gpu
        r"^(CUDA_VISIBLE_DEVICES=\S+ python -m study run FILE|python -m study run FILE --runs-per-gpu \d"
        r"|python -m study run FILE --gpus [\d,]+|python -m study run hypotheses/paper/\w+\.yaml --out \S+)$",
        Mapped(
            (
                "tests/scale_out/test_gpu_workers.py::test_auto_runs_one_pinned_worker_per_gpu",
                "tests/scale_out/test_gpu_workers.py::test_runs_per_gpu_and_a_chosen_subset",
            )
        ),
    ),
    Rule(
        r"^python -m study (run hypotheses/u_shape\.yaml|sweep FILE) --executor slurm ",
        Mapped(
            (
                "tests/scale_out/test_slurm.py::test_a_study_on_slurm_gives_the_local_executor_s_tables_bit_for_bit",
            )
        ),
    ),
    Rule(
        r"^python -m study validate FILE$",
        Mapped(("tests/schema/test_schema.py::test_malformed_file_one_line_exit_2",)),
    ),
    Rule(
        r"^python -m study plan FILE",
        Mapped(("tests/stats/test_planning.py::test_plan_verb_table_and_json",)),
    ),
    Rule(r"^python -m study report ", Mapped(("tests/report/test_report.py::test_cli_report_and_ui",))),
    Rule(
        r"^python -m study ui",
        Mapped(
            (
                "tests/report/test_report.py::test_cli_report_and_ui",
                "tests/faults/test_hardening.py::test_ui_sigterm_stops_the_server_group",
            )
        ),
    ),
    Rule(
        r"^mlflow ui --backend-store-uri ", Mapped(("tests/report/test_report.py::test_cli_report_and_ui",))
    ),
    Rule(
        r"^(?:/usr/bin/time -v )?python -m study sweep hypotheses/complexity_sweep\.yaml",
        Mapped(
            (
                "tests/sweep/test_sweep.py::test_tiny_sweep_end_to_end",
                "tests/sweep/test_sweep.py::test_shipped_sweep_validates_and_its_claims_run_on_a_sweep_table",
            )
        ),
    ),
    Rule(
        r"^python -m study submit ",
        Mapped(
            (
                "tests/scale_out/test_cluster_cases.py::test_case3_submit_forwards_every_option_the_interpreter_and_the_file_s_variables",
                "tests/scale_out/test_cluster_cli.py::test_submit_command_runs_a_sweep_file_as_a_sweep_with_absolute_paths",
            )
        ),
    ),
    Rule(
        r"^python -m study status",
        Mapped(
            (
                "tests/scale_out/test_cluster_cli.py::test_status_reads_a_postgresql_lease_store",
                "tests/scale_out/test_cluster_cli.py::test_status_counts_each_study_s_runs_by_state_from_a_lease_folder",
            )
        ),
    ),
    Rule(
        r"^python -m study doctor", Mapped(("tests/faults/test_hardening.py::test_doctor_finds_and_repairs",))
    ),
    # "two `python -m study run` of one file against one store ... train each run once"
    Rule(
        r"^python -m study run$",
        Mapped(("tests/tracking/test_concurrency.py::test_two_invocations_train_each_run_once",)),
    ),
    # tests/clusters.py starts the test cluster's nodes with `ray start`, as the docs do
    Rule(r"^ray start ", Mapped((CLUSTER,))),
    # ---- benchmarks
    Rule(
        r"^(?:PYTHONPATH=\. )?python3? bench/gpu_check\.py",
        Bench(
            ("tests/scale_out/test_gpu_check.py::test_cpu_smoke_runs_every_step_and_writes_json_and_table",)
        ),
    ),
    Rule(
        r"^(?:nice )?PYTHONPATH=\. python bench/(calibration|cli|extract|train|data|scale|faults|executor|probe_coverage|step_profile|slurm_overhead|pretrained_study|dino_learns)\.py",
        Bench(),
    ),
    # ---- other tools' set-up commands
    Rule(
        r"^pip install torch torchvision --index-url https://download\.pytorch\.org/whl/cpu$",
        External(
            "the PyTorch project's CPU wheels: a download from its index, which CI (pip's registry only) cannot reach"
        ),
    ),
    Rule(
        r"^sudo -u postgres create(user|db) ",
        External("PostgreSQL's own tools; tests/clusters.py starts a throwaway server with initdb instead"),
    ),
    Rule(
        r"^python -c \"import timm; \[timm\.create_model\(n, pretrained=True\) for n in ",
        External(
            "timm fetching published weights into the Hugging Face cache (the network); "
            "tests/sources/test_pretrained.py builds that cache from tiny models and runs the study offline"
        ),
    ),
    Rule(
        r"^mlflow server ",
        External(
            "an MLflow tracking server; the scale-out tests log to PostgreSQL directly (not measured, see bench)"
        ),
    ),
]


def rule_for(cmd: Command) -> list[Rule]:
    """The rules whose pattern matches the command (without ``nice`` in front)."""
    text = cmd.text.removeprefix("nice ") if cmd.text.startswith("nice PYTHONPATH") else cmd.text
    return [r for r in RULES if r.regex.search(text)]


def _by_action(kind: type) -> list[tuple[Command, Rule]]:
    pairs = [(c, rs[0]) for c in ALL_COMMANDS if len(rs := rule_for(c)) == 1]
    return [(c, r) for c, r in pairs if isinstance(r.action, kind)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STUDY_FAULT", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONPATH=str(REPO), MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    return env


def _shell(text: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a documented command line with bash; ``python`` is this interpreter."""
    env = _env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# --------------------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------------------
def test_the_docs_hold_commands():
    """The extraction finds what it should (guards against a parser that silently finds nothing)."""
    texts = {c.text for c in ALL_COMMANDS}
    assert "pip install -e ." in texts and "python -m study run hypotheses/u_shape.yaml" in texts
    assert 'pip install -e ".[test]"' in texts and "python -m pytest" in texts
    assert any(t.startswith("python -m study submit ") for t in texts)  # a continued line, joined
    assert not any(t.startswith("study second") for t in texts)  # an output line is no command


def test_readme_starts_with_the_two_commands():
    first = REPO.joinpath("README.md").read_text().split("\n")[:4]
    assert first[2] == "    pip install -e . && python -m study run hypotheses/u_shape.yaml"
    assert first[3] == '    pip install -e ".[test]" && python -m pytest'


def test_every_command_is_run_or_mapped():
    unmatched = [str(c) for c in ALL_COMMANDS if not rule_for(c)]
    assert not unmatched, "commands in the docs that no test runs (add a rule to RULES):\n" + "\n".join(
        unmatched
    )
    ambiguous = [f"{c} <- {[r.pattern for r in rule_for(c)]}" for c in ALL_COMMANDS if len(rule_for(c)) > 1]
    assert not ambiguous, "commands matched by more than one rule:\n" + "\n".join(ambiguous)


def test_every_rule_is_used():
    """A rule no command matches any more is stale: the docs changed, so should the mapping."""
    used = {id(r) for c in ALL_COMMANDS for r in rule_for(c)}
    assert not [r.pattern for r in RULES if id(r) not in used]


RUNNABLE = _by_action(Run)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder that is not the repo, with ``hypotheses/`` linked in, as a user's checkout-less folder."""
    folder = tmp_path_factory.mktemp("docs")
    (folder / "hypotheses").symlink_to(REPO / "hypotheses", target_is_directory=True)
    return folder


def test_cheap_commands_run_as_written(work):
    """validate, analyze, plan, metrics and bench/analyze.py, as the docs write them; two at a time."""
    unique = {c.text: (c, r) for c, r in RUNNABLE if not c.text.endswith("--help")}
    assert unique, "no runnable command found"
    for _, rule in unique.values():
        if rule.action.setup is not None:
            rule.action.setup(work)

    def one(item):
        cmd, rule = item
        return cmd, _shell(cmd.text, REPO if rule.action.cwd_repo else work)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, unique.values()))
    ok = {c.text: r.action.ok for c, r in unique.values()}
    failed = [
        f"{c}: exit {p.returncode}\n{p.stderr[-1500:]}" for c, p in results if p.returncode not in ok[c.text]
    ]
    assert not failed, "\n".join(failed)


def _verbs() -> dict[str, list[str]]:
    """Every verb of ``python -m study`` and its option strings, from the CLI's own parser."""
    import argparse

    from study.cli._parser import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: [o for a in p._actions for o in a.option_strings] for verb, p in sub.choices.items()}


def test_every_verb_has_help_and_a_row_in_the_readme():
    verbs = _verbs()
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(
            zip(verbs, pool.map(lambda v: _shell(f"python -m study {v} --help", REPO), verbs), strict=True)
        )
    assert {v: p.returncode for v, p in runs.items()} == dict.fromkeys(verbs, 0)
    readme = REPO.joinpath("README.md").read_text()
    table = readme[readme.index("## The verbs") :]
    assert not [v for v in verbs if f"| `{v}" not in table], "verbs missing from the README's table"


def test_study_commands_name_real_verbs_and_options():
    verbs = _verbs()
    bad = []
    for cmd in ALL_COMMANDS:
        m = re.match(r"(?:\S+=\S+ )?(?:python3? -m study|study) ([a-z-]+)(.*)", _unwrap(cmd.text))
        if not m:
            continue
        verb, rest = m.groups()
        if verb not in verbs:
            bad.append(f"{cmd}: no verb {verb!r}")
            continue
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest))
        bad += [f"{cmd}: {verb} has no option {o}" for o in sorted(options - set(verbs[verb]))]
    assert not bad, "\n".join(bad)


def _argparse_options(script: Path) -> set[str]:
    """The option strings a script's argparse parser declares (``add_argument("--x", ...)`` calls)."""
    import ast

    opts = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            opts |= {
                a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            }
    return opts


def test_benchmarks_take_the_options_the_docs_give_them():
    """Each documented benchmark exists and declares every option the docs give it (read from its source:
    importing a benchmark loads torch, and running one takes minutes)."""
    scripts: dict[str, set[str]] = {}
    for cmd, _ in _by_action(Bench):
        m = re.search(r"(bench/\w+\.py)(.*)", cmd.text)
        scripts.setdefault(m.group(1), set()).update(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", m.group(2)))
    assert len(scripts) >= 8
    bad = []
    for script, options in sorted(scripts.items()):
        if not (REPO / script).is_file():
            bad.append(f"{script}: no such file")
            continue
        declared = _argparse_options(REPO / script)
        bad += [f"{script} has no option {o}" for o in sorted(options - declared)]
    assert not bad, "\n".join(bad)


def test_mapped_tests_exist_and_run_by_default():
    """Every test a rule names is collected by what CI runs: the default ``python -m pytest`` or the slow
    tests after it (``.ci/run``), never a GPU-only test."""
    named = sorted({t for r in RULES if isinstance(r.action, Mapped | Bench) for t in r.action.tests})
    files = sorted({t.split("::")[0] for t in named})
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",  # collected in this one process, not by pytest-xdist's workers (pyproject's addopts)
            "-p",
            "no:cacheprovider",
            "-m",
            "not gpu",
            *files,
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    collected = {line.split("[")[0] for line in out.stdout.splitlines() if "::" in line}
    missing = [t for t in named if t not in collected]
    assert not missing, (
        f"named tests not collected by default:\n{missing}\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    )


def test_ci_runs_the_readme_test_command_in_a_venv_then_the_slow_tests():
    """The README's second command is what CI runs, as a line of its own, in a venv it makes and enters
    first; the slow tests run after it."""
    readme = REPO.joinpath("README.md").read_text().split("\n")
    command = [ln.strip() for ln in readme[:8] if ln.startswith("    ")][1]
    assert command == 'pip install -e ".[test]" && python -m pytest'
    ci = [ln.strip() for ln in REPO.joinpath(".ci", "run").read_text().split("\n")]
    at = ci.index(command)
    assert ci.index('python -m venv "$venv"') < ci.index('. "$venv/bin/activate"') < at
    assert "python -m pytest -m slow" in ci[at + 1 :] and "pip install" not in " ".join(ci[at + 1 :])


def test_extras_named_in_the_docs_exist():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    extras = tomllib.loads(REPO.joinpath("pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {m for c in ALL_COMMANDS for m in re.findall(r'pip install -e "\.\[(\w+)\]"', c.text)}
    assert named and named <= set(extras)


# --------------------------------------------------------------------------------------------------
# Links and paths
# --------------------------------------------------------------------------------------------------
def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    for line in re.sub(r"```.*?```", "", path.read_text(), flags=re.S).split("\n"):
        m = re.match(r"^#{1,6} (.+)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            out.add(slug.replace(" ", "-"))
    return out


def test_relative_links_point_at_files_and_headings():
    bad = []
    for path in DOC_FILES:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.relative_to(REPO)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{path.relative_to(REPO)}: {target}: no such heading")
    assert not bad, "\n".join(bad)


def test_paths_the_docs_name_exist():
    """Every repo path in backticks (``analysis/...``, ``tests/test_x.py``, ``hypotheses/...``) exists."""
    roots = ("analysis", "runners", "study", "vitstudy_core", "tests", "bench", "hypotheses", "docs")
    ignored = [g.strip() for g in REPO.joinpath(".gitignore").read_text().split("\n") if "/" in g]
    bad = []
    for path in DOC_FILES:
        for span in re.findall(r"`([^`\s]+)`", path.read_text()):
            span = span.split("::")[0].rstrip(".,;:")
            if span.split("/")[0] in roots and "/" in span and not re.search(r"[<>{}*]|NNN", span):
                if not (REPO / span).exists() and not any(span.startswith(g) for g in ignored):
                    bad.append(f"{path.relative_to(REPO)}: {span}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def test_readme_is_short():
    assert len(REPO.joinpath("README.md").read_text()) <= 20_000


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("python -m study run FILE  # a comment", ["python -m study run FILE"]),
        ('pip install -e ".[test]" && python -m pytest', ['pip install -e ".[test]"', "python -m pytest"]),
        ("study second: 5 runs planned, 5 reused", []),
        ("claim   verdict   effect", []),
        ("$ PYTHONPATH=. python bench/faults.py --n 10", ["PYTHONPATH=. python bench/faults.py --n 10"]),
    ],
)
def test_command_extraction(line, expected):
    assert [c.text for c in _commands_in(line, "x:1")] == expected


def test_an_unknown_command_matches_no_rule():
    assert not rule_for(Command("python -m study run hypotheses/new.yaml --frobnicate", "x:1"))


def test_readme_documents_metrics_on_a_run_s_spectra_and_the_controls_post_hoc():
    """Before: ``metrics`` was documented for ``.npy`` only (it also reads a run's ``spectra.npz``), and
    the controls.yaml verdicts omitted the "(post hoc)" a user following the README sees."""
    readme = REPO.joinpath("README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `metrics"))
    assert ".npy" in row and "spectra.npz" in row
    controls = " ".join(readme.split("## Conditions, controls", 1)[1].split("\n## ", 1)[0].split())
    assert 'every claim reading its trained runs shows "(post hoc)"' in controls
    assert "the shuffled-labels claim (new runs only) is pre-registered" in controls


def _kind_examples() -> dict[str, dict]:
    """docs/statistics.md's "One claim of each kind": kind -> its claim (each YAML block one claim)."""
    import yaml

    text = (REPO / "docs" / "statistics.md").read_text()
    section = text.split("## One claim of each kind\n", 1)[1].split("\n## ", 1)[0]
    found: dict[str, dict] = {}
    for block in re.findall(r"```yaml\n(.*?)```", section, re.S):
        (claim,) = yaml.safe_load(block)
        assert claim["kind"] not in found, f"two examples of {claim['kind']}"
        found[claim["kind"]] = claim
    return found


def test_every_claim_kind_has_a_whole_example_in_the_docs_that_validates(tmp_path):
    """One full claim per built-in kind (the README shows a whole one for u_shape only), each validated in
    the design the section describes, its claims across conditions in that design with conditions."""
    import study
    from analysis.kinds import KINDS
    from analysis.kinds.versus import ACROSS_KINDS
    from vitstudy_core.plugins import origin

    examples = _kind_examples()
    assert set(examples) == {k for k in KINDS if origin(KINDS, k) == "built-in"}
    datasets = [
        {"name": "objects", "variant": "objects", "n_train": 64, "n_test": 32, "image_size": 16},
        {"name": "cue_mix", "variant": "objects", "texture_reliance": 0.5, "n_train": 64, "n_test": 32,
         "image_size": 16},
        {"name": "textures", "variant": "textures", "n_train": 64, "n_test": 32, "image_size": 16},
    ]  # fmt: skip
    design = {
        "datasets": datasets,
        "model": {"preset": "vit_cpu12"},
        "seeds": [0, 1, 2],
        "checkpoints": [0, 1, 2],
        "training": {"epochs": 2},
        "probe": {"size": 16},
    }
    conditions = [{"name": "trained"}, {"name": "untrained", "untrained": True}]
    for kind, claim in examples.items():
        across = kind in ACROSS_KINDS
        data = {
            "name": f"docs_{kind}",
            "design": {**design, "conditions": conditions} if across else design,
            "claims": [claim],
        }
        checked = study.validate(data, tmp_path / "out")
        assert checked.n_claims == 1 and not checked.warnings, (kind, checked.warnings)
