"""Bad input met at the command line is one line naming it, exit 2, and nothing written: image sizes the
model's patches do not tile, damaged logs and run folders, impossible output paths (issue 31)."""

from __future__ import annotations

import pytest

from study.cli import main
from tests.conftest import TINY_HYPOTHESIS

TINY_MODEL = "preset: vit_cpu12, embed_dim: 16, depth: 3, num_heads: 2"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "model, size, patch",
    [
        (TINY_MODEL, 15, 4),  # the preset's patch 4
        # a timm name that does not carry its patch size: timm's own (16), not "no patch, no check"
        ("preset: null, name: flexivit_small, embed_dim: 16, depth: 3, num_heads: 2", 24, 16),
    ],
)
def test_image_size_not_a_multiple_of_the_patch_is_refused(tmp_path, capsys, model, size, patch):
    path = tmp_path / "h.yaml"
    path.write_text(
        TINY_HYPOTHESIS.replace(TINY_MODEL, model).replace("image_size: 8", f"image_size: {size}")
    )
    assert main(["validate", str(path)]) == 2
    err = _one_line(capsys)
    assert "design.datasets[0].image_size" in err and f"patch size {patch}" in err and f"got {size}" in err
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    assert f"patch size {patch}" in _one_line(capsys) and not out.exists()


@pytest.mark.parametrize("where", ["a file", "under a file", "a 300-character name"])
def test_out_that_cannot_be_a_folder_is_one_line(tmp_path, tiny_yaml, capsys, where):
    (tmp_path / "afile").write_text("")
    out = {
        "a file": tmp_path / "afile",
        "under a file": tmp_path / "afile" / "sub",
        "a 300-character name": tmp_path / ("x" * 300) / "out",
    }[where]
    before = sorted(tmp_path.iterdir())
    assert main(["run", str(tiny_yaml), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"error: {out}: --out: ")
    assert ("is a file" if "file" in where else "longer than the file system's limit") in err
    assert sorted(tmp_path.iterdir()) == before


def test_a_300_character_study_name_is_refused_by_validate(tmp_path, capsys):
    path = tmp_path / "h.yaml"
    path.write_text(TINY_HYPOTHESIS.replace("name: tiny", "name: " + "n" * 300, 1))
    assert main(["validate", str(path)]) == 2
    assert f"{path}: name: String should have at most 128 characters" in _one_line(capsys)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    _one_line(capsys)
    assert not out.exists()


def test_doctor_on_a_corrupt_store_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mlflow.db").write_bytes(b"SQLite format 3\x00" + b"\x13" * 4096)
    assert main(["doctor", "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert f"{out / 'mlflow.db'}: cannot read the tracking store (DatabaseError" in err and "[SQL" not in err


def _damage(out, name: str) -> str:
    """Damage ``name`` in the first run folder of ``write_runs``; the run folder's key."""
    import numpy as np

    run = sorted(p for p in (out / "runs").iterdir())[0]
    if name == "scalars.json":
        text = (run / name).read_text()
        (run / name).write_text(text[: len(text) // 2])
    else:  # spectra.npz holding strings (np.savez writes them without pickling; they load)
        with np.load(run / name) as f:
            np.savez(run / name, **{k: np.array(["a", "b"]) for k in f.files})
    return run.name


@pytest.mark.parametrize(
    "name, says", [("scalars.json", "JSONDecodeError"), ("spectra.npz", "holds <U1 values")]
)
def test_table_on_a_damaged_run_folder_is_one_line(tmp_path, capsys, name, says):
    """`table` names the run and the artifact; `run` sees the folder as damaged (RunFolder.damage) and
    restores or retrains that run, as for a truncated spectra.npz."""
    from tests.conftest import write_runs
    from vitstudy_core.runfolder import RunFolder

    hyp, out = write_runs(tmp_path)
    key = _damage(out, name)
    assert main(["table", str(hyp), "--out", str(out)]) == 2
    err = _one_line(capsys)
    assert (
        f"{out / 'runs' / key / name}: run objects/seed" in err and f"artifact {name}" in err and says in err
    )
    assert RunFolder(out / "runs" / key).damage().startswith(f"{name}: ")


def test_table_to_a_folder_is_one_line(tmp_path, capsys):
    from tests.conftest import write_runs

    hyp, out = write_runs(tmp_path)
    to = tmp_path / "folder"
    to.mkdir()
    assert main(["table", str(hyp), "--out", str(out), "--to", str(to)]) == 2
    assert f"{to}: is a folder; expected the table's file path" in _one_line(capsys)
    assert list(to.iterdir()) == [] and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_string_layer_index_is_blamed_on_the_table(tmp_path, tiny_yaml, capsys):
    import pandas as pd

    rows = [
        {"dataset": "objects", "seed": s, "epoch": 2, "layer": layer, "layer_index": name, "token_set": "all",
         "metric": "eed_pct", "value": v + 0.1 * s}
        for s in (0, 1, 2)
        for layer, name, v in (("block_01", "one", 50.0), ("block_02", "two", 30.0), ("block_03", "three", 50.0))
    ]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / "t.csv", index=False)
    assert main(["analyze", str(tiny_yaml), "--table", str(tmp_path / "t.csv")]) == 2
    assert _one_line(capsys) == f"error: {tmp_path / 't.csv'}: layer_index: expected integers in every row"


def test_torchscript_and_legacy_checkpoints_load_without_warnings(tmp_path):
    """A TorchScript archive is refused in one line (torch would warn, then refuse it under weights_only);
    a pre-zip (legacy) .pt loads; neither lets a warning through."""
    import warnings

    import torch

    from runners.checkpoints.files import load_checkpoint
    from vitstudy_core.errors import StudyError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's own deprecation notices while writing the fixture
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pt")
    torch.save({"model": {"w": torch.ones(2)}}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mmap in (True, False):
            with pytest.raises(
                StudyError, match=r"a TorchScript archive \(torch.jit.save\), not a state dict"
            ):
                load_checkpoint(tmp_path / "scripted.pt", mmap=mmap)
            assert torch.equal(
                load_checkpoint(tmp_path / "legacy.pt", mmap=mmap)["model"]["w"], torch.ones(2)
            )


def test_a_refused_run_with_a_new_registration_writes_nothing(tmp_path, capsys):
    """``--new-registration`` starts the new registration only once the inputs are checked: a refused run
    leaves no registration.json (nor any other file) behind."""
    path = tmp_path / "h.yaml"
    path.write_text(TINY_HYPOTHESIS.replace("image_size: 8", "image_size: 15"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--new-registration", "regions revised"]) == 2
    assert "patch size 4" in _one_line(capsys) and not out.exists()
