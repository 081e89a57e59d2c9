"""Contract checks of the parts that make runs: dataset kinds (:data:`runners.datasets.DATASETS`), run
sources (:data:`runners.sources.SOURCES`) and executors (:data:`runners.executors.local.EXECUTORS`).

These are the checks that need nothing but the entry: its model and example, validated through the real
hypothesis schema, and (executors) five jobs through ``map_jobs``. What needs data on disk (a dataset's
fixture folder, a source's files to import) stays with the part's own tests; an executor that needs a
cluster is checked on the cluster named by ``VITSTUDY_<NAME>_ADDRESS`` and skipped without it.
"""

from __future__ import annotations

import copy
import os
import tempfile
import unittest
from pathlib import Path
from typing import Any

from runners.datasets import DATASETS, DEFAULT_KIND
from runners.datasets.base import DatasetSettings, ImageDatasetSettings
from runners.executors.local import EXECUTORS, ExecutorOptions
from runners.sources import DEFAULT_SOURCE, SOURCES, ImportedSettings
from vitstudy_core.settings import Strict

# the design a source's example is validated in: one tiny procedural dataset, one seed
DESIGN: dict[str, Any] = {
    "datasets": [{"name": "objects", "n_train": 32, "n_test": 16, "image_size": 8}],
    "model": {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2},
    "training": {"epochs": 1, "batch_size": 16},
    "seeds": [0],
    "probe": {"size": 16},
}
CLAIM = {
    "name": "c",
    "kind": "compare",
    "metric": "effective_rank",
    "subset": {"dataset": "objects"},
    "a": {"layers": ["block_01"]},
    "b": {"layers": ["block_02"]},
}


def _literal(model: type, field: str = "kind") -> object:
    info = model.model_fields.get(field)  # type: ignore[attr-defined]
    return getattr(info.annotation, "__args__", None) if info is not None else None


def _dataset_doc(entry: dict) -> dict:
    """A hypothesis with one dataset ``entry`` (a kind without images: its runs come from a table)."""
    design: dict = {"datasets": [entry], "seeds": [0, 1, 2], "model": {"depth": 3}}
    if DATASETS[entry.get("kind", DEFAULT_KIND)].load is None:
        design["source"] = {"kind": "table", "path": "log_{seed}.csv"}
    regions = {"early": ["block_01"], "bottleneck": ["block_02"], "late": ["block_03"]}
    claim = {"name": "u", "kind": "u_shape", "metric": "eed_pct", "subset": {"dataset": entry["name"]}}
    return {"name": "t", "design": design, "claims": [{**claim, "regions": regions}]}


def check_dataset_model(kind: str) -> None:
    """Registered under its ``kind`` literal, a ``DatasetSettings`` model (``ImageDatasetSettings`` for a
    kind with images, with an int ``image_size``), an example of its kind, a loader with a class count (or
    neither), and an on-disk kind's layout, reader and check together."""
    entry = DATASETS[kind]
    assert entry.name == kind and issubclass(entry.model, DatasetSettings), (
        f"{kind}: its settings model {entry.model.__name__} does not subclass "
        "runners.datasets.base.DatasetSettings"
    )
    assert _literal(entry.model) == (kind,), f"{kind}: kind literal"
    assert "name" in entry.model.model_fields
    assert entry.example and entry.example.get("kind", DEFAULT_KIND) == kind
    assert (entry.load is None) == (entry.num_classes is None), f"{kind}: load and num_classes go together"
    assert (entry.layout is None) == (entry.read is None) == (entry.check is None), f"{kind}: on-disk parts"
    if entry.load is not None:  # the core reads image_size, n_train and n_test (the model, validate, plan)
        assert issubclass(entry.model, ImageDatasetSettings), (
            f"{kind}: its settings model {entry.model.__name__} does not subclass "
            "runners.datasets.base.ImageDatasetSettings (a kind with images declares image_size, n_train "
            "and n_test there: the model, memory and probe checks read them)"
        )
        size = entry.model.model_fields["image_size"]
        assert size.annotation is int, f"{kind}: image_size is {size.annotation}; expected int"


def check_dataset_example_validates(kind: str) -> None:
    """Its example validates through the schema into its model, round-trips, and an unknown key is one line."""
    from study.schema import parse_hypothesis
    from vitstudy_core.errors import StudyError

    hyp = parse_hypothesis(_dataset_doc(DATASETS[kind].example))
    ds: Any = hyp.design.datasets[0]
    assert len(hyp.design.datasets) == 1
    assert type(ds) is DATASETS[kind].model and getattr(ds, "kind", None) == kind
    assert type(ds).model_validate(ds.model_dump()) == ds
    try:
        parse_hypothesis(_dataset_doc({**DATASETS[kind].example, "bogus": 1}))
    except StudyError as err:
        assert str(err) == "<hypothesis>: design.datasets[0].bogus: unknown key (not part of the schema)", err
    else:
        raise AssertionError(f"{kind}: an unknown key was accepted")


def check_dataset_split(kind: str, spec: dict, images: Any, labels: Any) -> None:
    """One split as a loader must return it: ``images`` uint8 ``(N, S, S, 3)`` (channels last, ``S`` the
    spec's ``image_size``) and ``labels`` int64 ``(N,)`` in ``0 .. num_classes(spec) - 1``."""
    import numpy as np

    size = spec["image_size"]
    n_classes = DATASETS[kind].num_classes(spec)  # type: ignore[misc]
    shape = getattr(images, "shape", None)
    assert isinstance(images, np.ndarray) and images.ndim == 4 and shape[1:] == (size, size, 3), (  # type: ignore[index]
        f"{kind}: the loader's images have shape {shape}; expected (N, {size}, {size}, 3) (channels last, "
        f"image_size {size})"
    )
    assert images.dtype == np.uint8, (
        f"{kind}: the loader's images are {images.dtype}; expected uint8 (0..255)"
    )
    assert isinstance(labels, np.ndarray) and labels.shape == (len(images),), (
        f"{kind}: labels of shape {getattr(labels, 'shape', None)}; expected ({len(images)},)"
    )
    assert labels.dtype == np.int64, f"{kind}: labels are {labels.dtype}; expected int64"
    if len(labels):
        low, high = int(labels.min()), int(labels.max())
        assert 0 <= low and high < n_classes, (
            f"{kind}: labels span {low}..{high}; expected 0..{n_classes - 1} (num_classes {n_classes})"
        )


def check_dataset_reads(kind: str, spec: dict, cache_dir: str | Path) -> None:
    """The kind's loader on ``spec`` (a validated entry's ``model_dump()``; an on-disk kind: pointing at
    a fixture folder its package writes): every split passes :func:`check_dataset_split`, and the probe is
    the same when read again and when drawn afresh in another cache (seeded)."""
    import numpy as np

    from runners.datasets import load_split

    for split in ("train", "test"):
        check_dataset_split(kind, spec, *load_split(spec, split, cache_dir))
    probe, labels = load_split(spec, "probe", cache_dir, 8, 5)
    check_dataset_split(kind, spec, probe, labels)
    assert len(probe) == 8, f"{kind}: asked for 8 probe images, got {len(probe)}"
    again = load_split(spec, "probe", Path(cache_dir) / "fresh", 8, 5)[0]
    assert np.array_equal(again, probe), f"{kind}: the probe differs when drawn again with the same seed"


def check_dataset_loads(kind: str) -> None:
    """A generated kind (``DatasetKind.generated``) loads its example (:func:`check_dataset_reads`); a
    kind without images has nothing to load. An on-disk kind needs a fixture folder: its package calls
    :func:`check_dataset_reads` on one (skipped here)."""
    entry = DATASETS[kind]
    if entry.load is None:
        return
    if not entry.generated:
        raise unittest.SkipTest(f"{kind}: reads a folder; test it with check_dataset_reads on a fixture")
    spec = entry.model.model_validate(entry.example).model_dump()
    with tempfile.TemporaryDirectory() as tmp:
        check_dataset_reads(kind, spec, tmp)


def check_source_entry(name: str) -> None:
    """Registered under its name; an imported source's settings are a ``Strict`` ``ImportedSettings``
    with its ``kind`` literal, its example selects it, and its tag fields are strings."""
    entry = SOURCES[name]
    assert entry.name == name and SOURCES.names().count(name) == 1
    assert isinstance(entry.measures_spectra, bool)
    if entry.settings is None:
        assert name == DEFAULT_SOURCE, f"{name}: only the default source has no settings"
        return
    assert issubclass(entry.settings, ImportedSettings) and issubclass(entry.settings, Strict)
    assert _literal(entry.settings) == (name,), f"{name}: kind literal"
    assert entry.example["source"]["kind"] == name
    assert all(isinstance(f, str) for f in entry.tag_fields)


def check_source_example_validates(name: str) -> None:
    """Its example validates through the schema with this source filling the runs, and the measured
    epochs are the example's or the source's default."""
    from study.schema import parse_hypothesis

    entry: Any = SOURCES[name]
    doc: dict = {
        "name": "contract",
        "design": {**copy.deepcopy(DESIGN), **copy.deepcopy(entry.example)},
        "claims": [getattr(entry, "example_claim", None) or CLAIM],
    }
    design: Any = parse_hypothesis(doc, "contract.yaml").design
    assert design.run_source is entry
    assert (design.source is None) if entry.settings is None else (type(design.source) is entry.settings)
    given = entry.example.get("checkpoints")
    expected = sorted(set(given)) if given else entry.default_epochs(DESIGN["training"]["epochs"])
    assert design.checkpoint_epochs == expected


def check_source_fills(name: str, run: dict, run_dir: str | Path, data_dir: str | Path) -> dict:
    """Fill ``run`` (a planned run's ``model_dump()`` naming this source; a package gives it the files
    its fixture wrote) into ``run_dir`` as a worker does (``check``, ``prepare``, ``fill``): the folder is
    a finished run folder whose ``result.json`` is what ``fill`` returned, holding spectra at the run's
    checkpoint epochs or, for a source without spectra, metric rows in the tidy table's columns.

    Returns:
        the result ``fill`` returned.
    """
    import json

    from analysis.table import COLUMNS
    from vitstudy_core.runfolder import RunFolder, parse_spectrum_key

    entry = SOURCES.get(name)
    entry.check(run)
    entry.prepare(run, Path(data_dir))
    result = entry.fill(run, Path(run_dir), Path(data_dir))
    assert isinstance(result, dict), (
        f"{name}: fill returned {type(result).__name__}; expected the result dict"
    )
    folder = RunFolder(run_dir)
    assert result.get("status") == "finished", (
        f"{name}: fill returned status {result.get('status')!r}: {result}"
    )
    assert folder.is_finished(), (
        f"{name}: fill returned finished but {run_dir} is not a finished run folder (expected result.json "
        "saying finished and spectra.npz or rows.parquet)"
    )
    assert folder.read_result() == json.loads(json.dumps(result)), (
        f"{name}: result.json is not what fill returned"
    )
    if entry.measures_spectra:
        epochs = {parse_spectrum_key(k)[0] for k in folder.read_spectra()}
        assert epochs == set(run["checkpoints"]), (
            f"{name}: spectra at epochs {sorted(epochs)}; expected {run['checkpoints']}"
        )
    else:
        rows = folder.read_rows()
        assert list(rows.columns) == list(COLUMNS) and len(rows), f"{name}: rows.parquet holds no tidy rows"
    return result


def check_executor_entry(name: str) -> None:
    """Documented (a one-line summary) and built by a callable."""
    kind = EXECUTORS[name]
    assert kind.summary and "\n" not in kind.summary and callable(kind.make), name
    assert isinstance(kind.needs_cluster, bool)


def square_or_fail(x: int) -> int:
    """The contract's job: ``x * x``, and a ``ValueError`` for job 3."""
    if x == 3:
        raise ValueError("job 3 fails")
    return x * x


def check_executor_maps_jobs(name: str) -> None:
    """With 1 and 2 workers: every job's result by its index, a failing job's error reported for that job
    only. An executor that needs a cluster runs on ``VITSTUDY_<NAME>_ADDRESS`` (skipped without it)."""
    kind = EXECUTORS[name]
    address = "auto"
    if kind.needs_cluster:
        address = os.environ.get(f"VITSTUDY_{name.upper()}_ADDRESS", "")
        if not address:
            raise unittest.SkipTest(f"executor {name!r} needs a cluster: set VITSTUDY_{name.upper()}_ADDRESS")
    for workers in (1, 2):
        executor = kind.make(
            ExecutorOptions(workers=workers, n_jobs=5, cuda=False, address=address, cpus_per_run=1)
        )
        seen = {i: (res, exc) for i, res, exc in executor.map_jobs(square_or_fail, [(i,) for i in range(5)])}
        assert sorted(seen) == list(range(5)), f"{name}: jobs lost or repeated: {sorted(seen)}"
        for i in (0, 1, 2, 4):
            assert seen[i] == (i * i, None), f"{name}: job {i} gave {seen[i]}"
        assert seen[3][0] is None and isinstance(seen[3][1], ValueError), f"{name}: job 3 gave {seen[3]}"


CHECKS = {
    "datasets": [check_dataset_model, check_dataset_example_validates, check_dataset_loads],
    "sources": [check_source_entry, check_source_example_validates],
    "executors": [check_executor_entry, check_executor_maps_jobs],
}
