"""Property-based fuzzing of every input the tool reads, through the CLI's ``main``.

Each input is broken at random (hypothesis files, tidy tables, spectra, dataset folders, result.json,
verdicts.json, command lines, environment overrides). Property: the exit status is 0 (the input happened
to be valid) or 2 with exactly one line on stderr naming the file; never a traceback, never a run trained.
A fixed seed and example budget keep the suite deterministic and under a minute.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS

FUZZ = settings(
    max_examples=12, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
TINY = yaml.safe_load(TINY_HYPOTHESIS)


def _cli(argv: list[str]) -> tuple[int, str]:
    """``main(argv)`` -> (exit status, stderr); argparse's SystemExit counts as its status."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, err.getvalue()


def _assert_clean(rc: int, err: str, file: str | None = None, expect_error: bool = False) -> None:
    assert rc in ((2,) if expect_error else (0, 2)), (rc, err)
    assert "Traceback" not in err
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith("error: ")
        if file is not None:
            assert file in err, err


# ---- hypothesis files ------------------------------------------------------------------------------
JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(TINY) if p]


@st.composite
def mutated_hypothesis(draw) -> tuple[dict, str]:
    """The tiny hypothesis with one field replaced, removed or joined by an unknown key."""
    import copy

    data = copy.deepcopy(TINY)
    path = draw(st.sampled_from(PATHS))
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    action = draw(st.sampled_from(["replace", "delete", "unknown"]))
    if action == "replace":
        parent[path[-1]] = draw(JUNK)
    elif action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent["no_such_key_" + draw(st.text("abc", min_size=1, max_size=3))] = 1
    return data, action


def _write(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return path


@FUZZ
@given(mutated_hypothesis())
def test_fuzz_hypothesis_fields(case):
    data, action = case
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "h.yaml", yaml.safe_dump(data, allow_unicode=True))
        rc, err = _cli(["validate", str(path), "--out", str(Path(tmp) / "out")])
        _assert_clean(rc, err, str(path), expect_error=action == "unknown")
        assert not (Path(tmp) / "out").exists()


YAML_JUNK = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200),
    st.sampled_from(
        [
            "",
            "name: !!python/object/apply:os.system ['touch pwned']\n",
            "name: !!python/object/new:builtins.dict [[[a, 1]]]\n",
            "!!python/name:os.system\n",
            "a: &a {x: 1}\nb:\n  <<: *a\n  <<: *a\n",
            "a: &a [1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
            "d: &d [*c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d]\n"
            "f: &f [*e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f]\n",
            "[" * 5000 + "]" * 5000,
            "{a: " * 3000 + "1" + "}" * 3000,
            TINY_HYPOTHESIS + "claims: []\n",
            TINY_HYPOTHESIS.replace("name: tiny", "name: ..", 1),
            TINY_HYPOTHESIS + "\n" + "# pad\n" * 200_000,
            "\ufeffname: é\u202e\x85\n",
            "name: tiny\n\x00\n",
        ]
    ),
)


@FUZZ
@given(YAML_JUNK)
def test_fuzz_hypothesis_text(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp), "h.yaml", content)
        rc, err = _cli(["validate", str(path)])
        _assert_clean(rc, err, str(path))
        assert not Path("pwned").exists()


def test_duplicate_key_names_key_and_line(tmp_path):
    path = _write(tmp_path, "h.yaml", TINY_HYPOTHESIS + "claims: []\n")
    rc, err = _cli(["validate", str(path)])
    assert rc == 2 and "duplicate key 'claims'" in err and "line 16" in err and "first on line 10" in err, err


# ---- tidy tables -----------------------------------------------------------------------------------
def _good_table() -> pd.DataFrame:
    from study.preflight import synthetic_table
    from study.schema import parse_hypothesis

    return synthetic_table(parse_hypothesis(TINY))


GOOD_TABLE = None


@FUZZ
@given(
    st.sampled_from(["drop", "dtype", "inf", "duplicate", "nan", "null_text", "float_seed"]),
    st.integers(0, 10**6),
    st.sampled_from([".parquet", ".csv"]),
)
def test_fuzz_tables(defect, which, suffix):
    global GOOD_TABLE
    GOOD_TABLE = _good_table() if GOOD_TABLE is None else GOOD_TABLE
    df = GOOD_TABLE.copy()
    cols = ["dataset", "seed", "epoch", "layer", "token_set", "metric", "value"]
    row = which % len(df)
    if defect == "drop":
        df = df.drop(columns=cols[which % len(cols)])
    elif defect == "dtype":
        df["value"] = df["value"].astype(str) + "x"
    elif defect == "inf":
        df.loc[row, "value"] = np.inf
    elif defect == "duplicate":
        df = pd.concat([df, df.iloc[[row]]])
    elif defect == "nan":
        df.loc[row, "value"] = np.nan
    elif defect == "null_text":
        df["layer"] = df["layer"].astype(object)
        df.loc[row, "layer"] = None
    else:
        df["seed"] = df["seed"] + 0.5
    with tempfile.TemporaryDirectory() as tmp:
        hyp = _write(Path(tmp), "h.yaml", TINY_HYPOTHESIS)
        table = Path(tmp) / f"t{suffix}"
        df.to_csv(table, index=False) if suffix == ".csv" else df.to_parquet(table, index=False)
        rc, err = _cli(["analyze", str(hyp), "--table", str(table)])
        _assert_clean(rc, err, str(table), expect_error=defect != "nan")


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_table_bytes(content):
    with tempfile.TemporaryDirectory() as tmp:
        hyp = _write(Path(tmp), "h.yaml", TINY_HYPOTHESIS)
        for suffix in (".parquet", ".csv"):
            table = _write(Path(tmp), f"t{suffix}", content)
            _assert_clean(*_cli(["analyze", str(hyp), "--table", str(table)]), str(table), expect_error=True)


# ---- spectra ---------------------------------------------------------------------------------------
ARRAYS = st.one_of(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20).map(np.array),
    st.lists(st.integers(-5, 5), min_size=1, max_size=10).map(lambda v: np.array(v).reshape(-1, 1)),
    st.lists(st.text(max_size=3), max_size=5).map(np.array),
    st.just(np.array([1 + 2j, 3j])),
    st.just(np.array(3.0)),
)


@FUZZ
@given(ARRAYS, st.binary(max_size=100))
def test_fuzz_spectra(arr, junk):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.npy"
        np.save(path, arr)
        _assert_clean(*_cli(["metrics", str(path)]), str(path))
        path.write_bytes(junk)
        _assert_clean(*_cli(["metrics", str(path)]), str(path), expect_error=True)


# ---- run folders (result.json) and study folders (verdicts.json) ------------------------------------
@FUZZ
@given(JUNK, st.binary(max_size=50))
def test_fuzz_result_json(value, junk):
    from study.runspecs import plan_runs
    from study.schema import parse_hypothesis

    key = plan_runs(parse_hypothesis(TINY))[0].key
    with tempfile.TemporaryDirectory() as tmp:
        hyp = _write(Path(tmp), "h.yaml", TINY_HYPOTHESIS)
        run_dir = Path(tmp) / "out" / "runs" / key
        run_dir.mkdir(parents=True)
        for spectra in (junk, None):
            if spectra is None:
                np.savez(run_dir / "spectra.npz", **{"2/block_01/all": np.arange(4.0)})
            else:
                (run_dir / "spectra.npz").write_bytes(spectra)
            for content in (json.dumps(value), json.dumps({"status": "finished", "n_tokens": value}), junk):
                (run_dir / "result.json").write_bytes(
                    content.encode() if isinstance(content, str) else content
                )
                _assert_clean(*_cli(["table", str(hyp), "--out", str(Path(tmp) / "out")]))


@FUZZ
@given(JUNK, st.binary(max_size=50))
def test_fuzz_verdicts_json(value, junk):
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "studies" / "tiny"
        study.mkdir(parents=True)
        for content in (json.dumps(value), json.dumps({"claims": [value]}), junk):
            (study / "verdicts.json").write_bytes(content.encode() if isinstance(content, str) else content)
            rc, err = _cli(["report", str(study)])
            _assert_clean(rc, err, str(study))


# ---- dataset folders -------------------------------------------------------------------------------
@FUZZ
@given(
    st.sampled_from(["truncated", "not_image", "flat_layout", "empty", "one_class"]),
    st.binary(min_size=0, max_size=64),
)
@pytest.mark.slow  # minutes-budget: the same path is covered by faster default tests
def test_fuzz_dataset_folder(defect, junk):
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        for split in ("train", "val"):
            for cls in ("a", "b") if defect != "one_class" else ("a",):
                d = root / split / cls if defect != "flat_layout" else root / split
                d.mkdir(parents=True, exist_ok=True)
                for i in range(10 if defect != "empty" else 0):
                    buf = io.BytesIO()
                    Image.new("RGB", (8, 8), (i * 20, 0, 0)).save(buf, "PNG")
                    data = buf.getvalue()
                    if defect == "truncated" and i == 3:
                        data = data[: len(data) // 2]
                    if defect == "not_image" and i == 3:
                        data = junk
                    (d / f"{cls}{i}.png").write_bytes(data)
        text = TINY_HYPOTHESIS.replace(
            "datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]",
            f"datasets: [{{name: objects, kind: imagefolder, path: '{root}', image_size: 8}}]",
        ).replace("probe: {size: 16}", "probe: {size: 8}")
        hyp = _write(Path(tmp), "h.yaml", text)
        out = Path(tmp) / "out"
        rc, err = _cli(["run", str(hyp), "--out", str(out), "--workers", "1", "--no-mlflow", "--no-report"])
        _assert_clean(rc, err, expect_error=True)
        assert not list(out.glob("runs/*/result.json"))  # nothing trained


# ---- command lines and environment overrides -------------------------------------------------------
VERBS = ["validate", "run", "analyze", "metrics", "table", "report", "ui", "doctor", "bogus"]


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.sampled_from(VERBS),
            st.sampled_from(["--out", "--workers", "--table", "--data-root", "--port", "--to", "-x", "--"]),
            st.text(max_size=12),
        ),
        max_size=5,
    )
)
def test_fuzz_command_line(argv):
    if argv[:1] == ["ui"]:  # never start a server from a fuzz test
        argv = ["ui", "--out", "/nonexistent/x"]
    if argv[:1] == ["run"] and len(argv) > 1:  # a run only of files that cannot exist
        argv = ["run", "/nonexistent/h.yaml", *argv[2:]]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)  # anything a verb writes by default lands here
        try:
            rc, err = _cli(argv)
        finally:
            os.chdir(cwd)
        assert rc in (0, 1, 2) and "Traceback" not in err, (argv, rc, err)
        if rc == 2:
            assert len(err.strip().splitlines()) == 1, err


@FUZZ
@given(st.text(max_size=30), st.text(max_size=30))
def test_fuzz_environment(fault, root):
    with tempfile.TemporaryDirectory() as tmp:
        hyp = _write(
            Path(tmp),
            "h.yaml",
            TINY_HYPOTHESIS.replace(
                "datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]",
                "datasets: [{name: objects, kind: imagefolder, path: '${FUZZ_ROOT}/x', image_size: 8}]",
            ),
        )
        env = {"STUDY_FAULT": fault, "FUZZ_ROOT": root}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update({k: v for k, v in env.items() if "\x00" not in v})
        try:
            rc, err = _cli(
                ["run", str(hyp), "--out", str(Path(tmp) / "out"), "--no-mlflow", "--workers", "1"]
            )
        finally:
            for k, v in old.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        _assert_clean(rc, err, expect_error=True)


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/object/new:os.system"])
def test_no_tag_executes(tmp_path, tag):
    marker = tmp_path / "pwned"
    path = _write(tmp_path, "h.yaml", f"name: {tag} ['touch {marker}']\n")
    rc, err = _cli(["validate", str(path)])
    assert rc == 2 and not marker.exists()
