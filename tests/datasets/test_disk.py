"""What every on-disk layout shares: seeded subsets, the probe draw, ``${VAR}`` paths, the early folder check."""

from __future__ import annotations

import numpy as np
import pytest

from runners.datasets import load_split
from tests.conftest import TINY_HYPOTHESIS
from tests.datasets.conftest import disk_spec
from vitstudy_core.errors import StudyError


def test_subsets_are_seeded(roots, tmp_path):
    spec = disk_spec("cifar100", roots, n_train=5)
    full, _ = load_split({**spec, "n_train": None}, "train", tmp_path)
    a, _ = load_split(spec, "train", tmp_path / "a")
    b, _ = load_split(spec, "train", tmp_path / "b")
    c, _ = load_split({**spec, "subset_seed": 3}, "train", tmp_path / "c")
    assert len(full) == 12 and len(a) == 5
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_probe_larger_than_the_held_out_split_is_one_line(roots, tmp_path):
    with pytest.raises(StudyError, match="probe size 99 exceeds the 12 held-out images") as err:
        load_split(disk_spec("imagefolder", roots), "probe", tmp_path, 99, 0)
    assert "design.probe.size" in str(err.value)


def test_env_path_resolution_and_unset_variable(roots, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDY_TEST_UCM", str(roots["ucmerced"][0]))
    x, _ = load_split(disk_spec("ucmerced", roots, "${STUDY_TEST_UCM}"), "train", tmp_path)
    assert len(x) > 0
    monkeypatch.delenv("STUDY_TEST_UCM")
    with pytest.raises(StudyError, match="STUDY_TEST_UCM is not set"):
        load_split(disk_spec("ucmerced", roots, "${STUDY_TEST_UCM}"), "train", tmp_path)


def test_run_with_missing_data_folder_writes_nothing(tmp_path, capsys, monkeypatch):
    """An unset ${VAR} or a missing folder stops `run` with one line (exit 2) before anything is written."""
    from study.cli import main

    text = TINY_HYPOTHESIS.replace(
        "datasets: [{name: objects, variant: objects, n_train: 64, n_test: 32, image_size: 8}]",
        'datasets: [{name: objects, kind: cifar100, path: "${STUDY_TEST_CIFAR}", image_size: 8}]',
    )
    hyp = tmp_path / "disk.yaml"
    hyp.write_text(text)
    out = tmp_path / "out"
    monkeypatch.delenv("STUDY_TEST_CIFAR", raising=False)
    assert main(["run", str(hyp), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "STUDY_TEST_CIFAR is not set" in err
    monkeypatch.setenv("STUDY_TEST_CIFAR", str(tmp_path / "nowhere"))
    assert main(["run", str(hyp), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "folder not found" in err and "cifar100 layout" in err
    assert not out.exists()
