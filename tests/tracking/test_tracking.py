"""study/tracking/tracker.py + run reuse: the MLflow layout, reuse across hypothesis files through the store,
cached reruns, --force, and one-line errors for missing/corrupt store artifacts. Tiny runs (seconds)."""

from __future__ import annotations

import inspect
import json
import shutil
import time

import pytest

from study.cli import main
from study.pipeline.orchestrate import run_study
from study.pipeline.stages import RunOptions
from study.pipeline.tables import collect_table
from study.runspecs import plan_runs
from study.schema import load_hypothesis
from study.tracking.tracker import sanitize_metric_name
from vitstudy_core.errors import StudyError

DESIGN = """\
design:
  datasets: [{name: objects, variant: objects, n_train: 32, n_test: 16, image_size: 8}]
  model: {preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2}
  training: {epochs: 1, batch_size: 16, max_steps_per_epoch: 2}
  seeds: [0, 1]
  checkpoints: [0, 1]
  probe: {size: 8}
"""
FIRST = (
    "name: first\ndescription: the first file\n"
    + DESIGN
    + """claims:
  - name: u
    kind: u_shape
    metric: eed_pct
    subset: {dataset: objects}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
"""
)
# another file over the same design, with another claim: it needs exactly the same runs
SECOND = (
    "name: second\ndescription: another claim, same design\n"
    + DESIGN
    + """claims:
  - name: u on effective rank at init
    kind: u_shape
    metric: effective_rank
    subset: {dataset: objects, epoch: 0}
    regions: {early: [block_01], bottleneck: [block_02], late: [block_03]}
"""
)


def _client(out):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{(out / 'mlflow.db').resolve()}")


def _runs(out, name):
    client = _client(out)
    exp = client.get_experiment_by_name(name)
    return [] if exp is None else client.search_runs([exp.experiment_id])


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking")
    (root / "first.yaml").write_text(FIRST)
    (root / "second.yaml").write_text(SECOND)
    out = root / "out"
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    outcome = run_study(
        load_hypothesis(root / "first.yaml"),
        root / "first.yaml",
        out,
        RunOptions(workers=1),
        log=lambda s: None,
    )
    yield root, out, outcome
    mp.undo()


def test_tracker_leaves_the_environment_alone(study):
    """mlflow.set_tracking_uri would export MLFLOW_TRACKING_URI and send later studies to this store."""
    import os

    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_sanitize_metric_name():
    assert sanitize_metric_name("eed_pct/block_05/all") == "eed_pct/block_05/all"
    assert sanitize_metric_name("eed%/block 1:cls") == "eed_/block 1_cls"


def test_mlflow_layout(study):
    root, out, outcome = study
    assert len(outcome.trained) == 2 and outcome.reused == []
    client = _client(out)
    runs = _runs(out, "first")
    parents = [r for r in runs if r.data.tags.get("study.role") == "study"]
    children = [r for r in runs if r.data.tags.get("study.role") == "training"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    keys = {s.key for s in plan_runs(load_hypothesis(root / "first.yaml"))}
    assert {c.data.tags["run_key"] for c in children} == keys
    for r in (parent, *children):
        tags = r.data.tags
        assert len(tags["spec_hash"]) == 64 and tags["git_dirty"] in {"true", "false", "none"}
        assert tags["git_commit"] == tags["mlflow.source.git.commit"]
    assert parent.data.tags["verdict.0"].endswith(": u") and len(parent.data.tags["spec_hash"]) == 64
    child = children[0]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert "eed_pct/all/block_02" in child.data.metrics and "train/loss" in child.data.metrics
    assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "eed_pct/all/block_02")) == [
        0,
        1,
    ]
    assert child.data.params["dataset.n_train"] == "32" and child.data.params["seed"] in {"0", "1"}
    # the dataset as an MLflow input, its digest the spec hash and its source the spec
    (inp,) = client.get_run(child.info.run_id).inputs.dataset_inputs
    assert inp.dataset.name == "objects" and len(inp.dataset.digest) == 16
    assert json.loads(json.loads(inp.dataset.source)["tags"]["dataset_spec"])["n_train"] == 32
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"
    arts = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"spectra.npz", "result.json"} <= arts and "model" not in arts  # no weights by default
    parent_arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"first.yaml", "table.parquet", "verdicts.json", "report.html", "report.md"} <= parent_arts
    assert "u" in parent.data.tags["mlflow.note.content"]
    assert {"claim_0/effect", "claim_0/ci_low", "claim_0/ci_high"} <= set(parent.data.metrics)


def test_second_file_reuses_runs_from_the_store(study):
    root, out, first = study
    shutil.rmtree(out / "runs")  # only the tracking store has them now
    lines: list[str] = []
    second = run_study(
        load_hypothesis(root / "second.yaml"),
        root / "second.yaml",
        out,
        RunOptions(workers=1),
        log=lines.append,
    )
    assert second.trained == [] and sorted(second.reused) == sorted(first.trained)
    assert all(v.startswith("mlflow:") for v in second.reused_from.values())
    assert sum("reused objects/seed" in ln and "from MLflow run" in ln for ln in lines) == 2
    # the reused runs are linked from the new parent, not logged again as children
    runs = _runs(out, "second")
    assert [r.data.tags["study.role"] for r in runs] == ["study"]
    assert runs[0].data.tags["n_reused"] == "2"
    assert all(k in runs[0].data.tags["reused_runs"] for k in first.trained)
    assert (out / "studies" / "second" / "report.html").is_file()


def test_cached_rerun_trains_nothing_and_is_fast(study, capsys):
    root, out, first = study
    t0 = time.perf_counter()
    assert main(["run", str(root / "first.yaml"), "--out", str(out), "--workers", "1"]) == 0
    elapsed = time.perf_counter() - t0
    text = capsys.readouterr().out
    assert "2 reused, 0 to train" in text and "reused objects/seed0" in text and "report:" in text
    assert text.count("report:") == 1, text  # was printed twice: as the report was written, then at the end
    assert elapsed < 30, elapsed
    print(f"cached rerun: {elapsed:.1f}s")


def test_missing_or_corrupt_store_artifact_is_one_line(study, capsys):
    root, out, first = study
    children = [r for r in _runs(out, "first") if r.data.tags.get("study.role") == "training"]
    child = next(c for c in children if c.data.tags["seed"] == "0")
    art_dir = _client(out).get_run(child.info.run_id).info.artifact_uri.removeprefix("file://")
    spectra = f"{art_dir}/spectra.npz"
    original = open(spectra, "rb").read()
    try:
        shutil.rmtree(out / "runs")
        open(spectra, "wb").write(b"truncated")
        assert main(["run", str(root / "second.yaml"), "--out", str(out), "--workers", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "objects/seed0" in err and "spectra.npz is corrupt" in err
        assert child.data.tags["run_key"] in err and child.info.run_id in err

        import os

        os.remove(spectra)
        with pytest.raises(StudyError, match=r"objects/seed0 .*spectra.npz is missing"):
            run_study(
                load_hypothesis(root / "second.yaml"),
                root / "second.yaml",
                out,
                RunOptions(workers=1),
                log=lambda s: None,
            )
    finally:
        open(spectra, "wb").write(original)
    # the store is whole again: the same command reuses everything
    again = run_study(
        load_hypothesis(root / "second.yaml"),
        root / "second.yaml",
        out,
        RunOptions(workers=1),
        log=lambda s: None,
    )
    assert again.trained == []


def test_corrupt_local_spectra_is_one_line_and_run_retrains_it_alone(study):
    root, out, first = study
    key = first.trained[0]
    run_study(
        load_hypothesis(root / "first.yaml"),
        root / "first.yaml",
        out,
        RunOptions(workers=1),
        log=lambda s: None,
    )
    (out / "runs" / key / "spectra.npz").write_bytes(b"bad")
    hyp = load_hypothesis(root / "first.yaml")
    specs = plan_runs(hyp)
    # the table verb reads the folder as it is: one line naming the artifact and what `run` does about it
    with pytest.raises(StudyError, match=rf"key {key}\): artifact spectra.npz is missing or corrupt") as e:
        collect_table(specs, out / "runs", hyp.design.layers)
    assert "\n" not in str(e.value) and "--force" not in str(e.value)
    # without a store, `run` retrains that run alone (not everything, and no --force needed)
    lines: list[str] = []
    again = run_study(hyp, root / "first.yaml", out, RunOptions(workers=1, track=False), log=lines.append)
    assert again.trained == [key], lines
    assert any("damaged run folder" in x and "retraining this run only" in x for x in lines), lines
    shutil.rmtree(out / "runs" / key)


def test_force_retrains(study):
    root, out, first = study
    forced = run_study(
        load_hypothesis(root / "first.yaml"),
        root / "first.yaml",
        out,
        RunOptions(workers=1, force=True),
        log=lambda s: None,
    )
    assert sorted(forced.trained) == sorted(first.trained) and forced.reused == []
    children = [r for r in _runs(out, "first") if r.data.tags.get("study.role") == "training"]
    assert len(children) == 4  # two from the first invocation, two retrained


def test_log_model_is_opt_in(study, tmp_path):
    """Weight files in a run folder are logged under model/ only with log_model=True."""
    import pandas as pd

    from study.tracking.tracker import Tracker

    root, out, _ = study  # the module's store: creating a fresh sqlite store costs seconds
    spec = plan_runs(load_hypothesis(root / "first.yaml"))[0]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "epoch_002.pt").write_bytes(b"weights")  # as runners/train.py writes them
    result = {"status": "finished", "history": [{"epoch": 1, "loss": 1.0}]}
    rows = pd.DataFrame(
        [{"metric": "eed%", "layer": "block_01", "token_set": "all", "epoch": 1, "value": 5.0}]
    )
    ids = {}
    for flag in (False, True):
        with Tracker(out, "log_model_test", log_model=flag) as tracker:
            ids[flag] = tracker.log_training_run(spec, result, rows, run_dir=run_dir)
    client = _client(out)
    assert "model" not in {a.path for a in client.list_artifacts(ids[False])}
    assert [a.path for a in client.list_artifacts(ids[True], "model")] == ["model/epoch_002.pt"]
    assert client.get_run(ids[True]).data.tags["model_weights"] == "logged"
    assert "eed_/all/block_01" in client.get_run(ids[True]).data.metrics  # sanitised name


def test_a_store_with_the_old_metric_names_still_restores(study, tmp_path, monkeypatch):
    """A child run logged with the names of the previous version, ``{metric}/{layer}/{token_set}``
    (issue 27 turned them to ``{metric}/{token_set}/{layer}``), is restored from the store file for file,
    and ``doctor`` finds nothing wrong with it."""
    from study.doctor import check_store
    from study.tracking._write import sanitize_metric_name
    from study.tracking.reuse import StoredRuns
    from study.tracking.tracker import Tracker

    root, out, first = study
    # the module's earlier tests delete and retrain run folders of this study: bring them back first (a
    # rerun reuses them from the store; under pytest-xdist seed 0's folder was twice found missing here)
    run_study(
        load_hypothesis(root / "first.yaml"), root / "first.yaml", out, RunOptions(workers=1), log=print
    )
    spec = plan_runs(load_hypothesis(root / "first.yaml"))[0]
    folder = out / "runs" / spec.key
    result = json.loads((folder / "result.json").read_text())
    rows = collect_table([spec], out / "runs", load_hypothesis(root / "first.yaml").design.layers).table
    old = lambda metric, layer, token_set: sanitize_metric_name(f"{metric}/{layer}/{token_set}")  # noqa: E731
    monkeypatch.setattr("study.tracking._write.metric_name", old)
    with Tracker(out, "old_metric_names") as tracker:
        rid = tracker.log_training_run(spec, result, rows, run_dir=folder)
    monkeypatch.undo()
    client = _client(out)
    try:
        run = client.get_run(rid)
        assert "eed_pct/block_02/all" in run.data.metrics and "eed_pct/all/block_02" not in run.data.metrics
        StoredRuns(client, "store").fetch_run(run, spec, tmp_path / "restored")
        for name in ("result.json", "spectra.npz"):
            assert (tmp_path / "restored" / name).read_bytes() == (folder / name).read_bytes(), name
        kinds = {f.kind for f in check_store(out, client) if rid in f.what}
        assert kinds <= {"duplicate"}, kinds  # a second finished copy of its key, nothing about its names
    finally:
        client.delete_run(rid)  # the module's store as it was


def test_shipped_files_over_one_design_share_run_keys():
    """Shipped hypothesis files with the same design plan the same run keys, so the second one reuses
    the first one's runs (the store reuse itself is tested above on tiny designs)."""
    from pathlib import Path

    import yaml

    groups: dict[str, list[Path]] = {}
    for path in sorted((Path(__file__).parents[2] / "hypotheses").glob("*.yaml")):
        design = yaml.safe_load(path.read_text())["design"]
        groups.setdefault(json.dumps(design, sort_keys=True), []).append(path)
    shared = [paths for paths in groups.values() if len(paths) > 1]
    if not shared:
        pytest.skip("no two shipped hypothesis files share a design yet")
    for paths in shared:
        keys = [[s.key for s in plan_runs(load_hypothesis(p))] for p in paths]
        assert all(k == keys[0] for k in keys), [p.name for p in paths]


def _public(cls) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(getattr(cls, name))
        for name in dir(cls)
        if (not name.startswith("_") or name in ("__enter__", "__exit__")) and callable(getattr(cls, name))
    }


def _shape(sig: inspect.Signature) -> list[tuple]:
    """A signature's parameters as (name, kind, default): what a caller can pass."""
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_null_tracker_keeps_up_with_tracker():
    """Every public method of Tracker is in NullTracker and in TrackerProtocol, with the same parameters:
    a method added to Tracker alone fails here (``--no-mlflow`` would raise AttributeError)."""
    from study.tracking.tracker import NullTracker, Tracker, TrackerProtocol

    real, null, proto = _public(Tracker), _public(NullTracker), _public(TrackerProtocol)
    assert set(real) == set(null) == set(proto), (set(real) ^ set(null), set(real) ^ set(proto))
    for name, sig in real.items():
        assert _shape(sig) == _shape(null[name]) == _shape(proto[name]), name
    assert isinstance(NullTracker(), TrackerProtocol)
    assert not any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for s in null.values() for p in s.parameters.values()
    )


def test_only_the_tracking_modules_import_mlflow():
    """The MLflow boundary: study/tracking/ (and doctor, which inspects the store) import mlflow."""
    import ast
    from pathlib import Path

    root = Path(__file__).parents[2]
    found = set()
    for path in root.glob("*/**/*.py"):
        if path.parts[len(root.parts)] in ("tests", "bench") or ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                found.add(path.relative_to(root).as_posix())
    assert found and all(f.startswith("study/tracking") or f == "study/doctor.py" for f in found), found


def test_a_copied_store_is_refused_from_its_marker_before_the_store_opens(tmp_path, monkeypatch):
    """Before: refusing a copied folder scanned the store's experiments (42-57 s wall under load); now one
    marker file beside ``mlflow.db`` names the folder the store was made in. Its own folder skips the scan."""
    import shutil

    import study.tracking.tracker
    from study.tracking.store import HOME_MARKER, check_home
    from study.tracking.tracker import Tracker

    a, b = tmp_path / "a", tmp_path / "b"
    Tracker(a, "tiny")
    assert json.loads((a / HOME_MARKER).read_text()) == {"home": str(a.resolve()), "experiments": ["tiny"]}
    shutil.copytree(a, b)

    def never(*args, **kwargs):
        raise AssertionError("the store was opened or scanned")

    monkeypatch.setattr(study.tracking.tracker, "refuse_foreign_artifacts", never)
    Tracker(a, "tiny")  # its own folder: the marker says so, no scan
    monkeypatch.setattr("mlflow.tracking.MlflowClient", never)
    for experiment in ("tiny", "tiny_other"):  # a study new to the copy is refused the same way
        with pytest.raises(StudyError) as err:
            Tracker(b, experiment)
        msg = str(err.value)
        assert "copied or moved" in msg and str(a / "mlartifacts" / "tiny") in msg and "'tiny'" in msg, msg
    (b / "mlflow.db").rename(tmp_path / "aside.db")  # what the refusal says to do: a fresh store
    assert check_home(b, "tiny") is False


def test_the_parent_logs_the_design_and_the_children_their_architecture_and_preset(study):
    """Before: the parent held 5 params, ``objective`` a Python repr (``kind='supervised' preset=None``);
    a child said ``model.name = vit_small_patch16_224`` for a 16-wide, 3-deep model and no preset."""
    root, out, _ = study
    runs = _runs(out, "first")
    parent = next(r for r in runs if r.data.tags.get("study.role") == "study")
    params = parent.data.params
    assert json.loads(params["objective"]) == {"kind": "supervised", "preset": None}
    assert params["design.training.epochs"] == "1" and params["design.datasets.0.n_train"] == "32"
    assert params["design.model.preset"] == "vit_cpu12" and params["design.model.embed_dim"] == "16"
    assert params["design.probe.size"] == "8" and params["design.seeds"] == "[0, 1]"
    child = next(r for r in runs if r.data.tags.get("study.role") == "training")
    got = {k: v for k, v in child.data.params.items() if k.startswith(("architecture.", "model.preset"))}
    assert got == {
        "model.preset": "vit_cpu12",
        "architecture.patch_size": "4",
        "architecture.embed_dim": "16",
        "architecture.depth": "3",
        "architecture.num_heads": "2",
    }


def test_a_rerun_reusing_this_folder_s_runs_links_their_mlflow_children(study):
    """Before: runs reused from the output folder were tagged ``objects/seed0=<key>@local``, with no link
    to their child runs in the store (docs/tracking.md: ``label=key@mlflow_run_id``)."""
    root, out, first = study
    third = root / "third.yaml"
    third.write_text(FIRST.replace("name: first", "name: third"))
    again = run_study(load_hypothesis(third), third, out, RunOptions(workers=1), log=lambda s: None)
    assert again.trained == [] and all(v == "local" for v in again.reused_from.values())
    client = _client(out)
    (parent,) = _runs(out, "third")
    listed = dict(item.split("=", 1) for item in parent.data.tags["reused_runs"].split(", "))
    assert {v.split("@")[0] for v in listed.values()} == set(again.reused)
    for text in listed.values():  # each names a finished child of that run key in the store
        key, rid = text.split("@")
        child = client.get_run(rid)
        assert child.data.tags["run_key"] == key and child.info.status == "FINISHED"
        assert child.data.tags["study.role"] == "training"
    art = client.download_artifacts(parent.info.run_id, "reused_runs.json", str(root))
    ids = {r["key"]: r["mlflow_run_id"] for r in json.loads(open(art).read())}
    assert ids == {v.split("@")[0]: v.split("@")[1] for v in listed.values()}
