"""Real training checkpoints import by their real names and contents: facebookresearch/dino's
``checkpointNNNN.pth`` / ``checkpoint.pth`` (written as ``main_dino.py``'s ``save_dict``) and timm's
``checkpoint-N.pth.tar`` / ``last.pth.tar`` / ``model_best.pth.tar`` (written by timm's own
``CheckpointSaver``), both holding ``args: argparse.Namespace``; a payload in a checkpoint is still refused
before it runs, and a refused file's error names its cause."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from runners.checkpoints.files import checkpoint_files, checkpoint_format, load_checkpoint
from runners.checkpoints.importer import read_state_dict
from runners.models import build_model
from runners.sources import SOURCES, imported_record
from study.runspecs import plan_runs
from study.schema import parse_hypothesis
from vitstudy_core.errors import StudyError
from vitstudy_core.runfolder import RunFolder

# DINO's DINOHead uses torch.nn.utils.weight_norm; the fixture does as DINO does
pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")
MODEL = {"preset": "vit_cpu12", "embed_dim": 16, "depth": 3, "num_heads": 2}
IMAGE = 8


def _vit(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model(
        {"name": "vit_small_patch16_224", "patch_size": 4, "embed_dim": 16, "depth": 3, "num_heads": 2},
        IMAGE,
        0,
    )
    return model


class _Head(nn.Module):
    """DINO's DINOHead: an MLP, then a weight-normalised last layer (its state dict has weight_g / weight_v)."""

    def __init__(self, dim: int, out_dim: int = 32):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, 24), nn.GELU(), nn.Linear(24, 8))
        self.last_layer = nn.utils.weight_norm(nn.Linear(8, out_dim, bias=False))


class _MultiCrop(nn.Module):
    """DINO's MultiCropWrapper: ``backbone`` (the ViT) and ``head``."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone, self.head = backbone, _Head(16)


class _DDP(nn.Module):
    """What DistributedDataParallel adds to a state dict: the ``module.`` prefix."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module


class _DINOLoss(nn.Module):
    def __init__(self, out_dim: int = 32):
        super().__init__()
        self.register_buffer("center", torch.zeros(1, out_dim))


def _dino_args() -> argparse.Namespace:
    """A real argparse.Namespace with (a few of) main_dino.py's arguments, as DINO stores it."""
    p = argparse.ArgumentParser("DINO")
    p.add_argument("--arch", default="vit_small")
    p.add_argument("--patch_size", default=16, type=int)
    p.add_argument("--out_dim", default=65536, type=int)
    p.add_argument("--norm_last_layer", default=True, type=bool)
    p.add_argument("--use_fp16", default=True, type=bool)
    p.add_argument("--global_crops_scale", type=float, nargs="+", default=(0.4, 1.0))
    p.add_argument("--lr", default=0.0005, type=float)
    p.add_argument("--output_dir", default=".", type=str)
    p.add_argument("--saveckp_freq", default=20, type=int)
    args = p.parse_args([])
    args.gpu, args.rank, args.world_size, args.dist_url = 0, 0, 1, "env://"
    return args


def _dino_folder(folder: Path, epochs: int, saveckp_freq: int) -> dict[int, nn.Module]:
    """Train-free DINO output: per epoch, main_dino.py's save_dict to checkpoint.pth, and to
    checkpoint{epoch:04}.pth every saveckp_freq epochs. Returns epochs trained -> the teacher's backbone."""
    folder.mkdir(parents=True)
    student, teacher = _DDP(_MultiCrop(_vit(0))), _MultiCrop(_vit(1))
    optimizer = torch.optim.AdamW(student.parameters())
    dino_loss, scaler, args = _DINOLoss(), torch.amp.GradScaler("cpu"), _dino_args()
    teachers = {}
    for epoch in range(epochs):
        for p in student.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
        with torch.no_grad():  # the EMA teacher: a different network from the student
            for ps, pt in zip(student.module.parameters(), teacher.parameters(), strict=True):
                pt.mul_(0.9).add_(0.1 * ps)
        save_dict = {
            "student": student.state_dict(),
            "teacher": teacher.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch + 1,
            "args": args,
            "dino_loss": dino_loss.state_dict(),
        }
        save_dict["fp16_scaler"] = scaler.state_dict()
        torch.save(save_dict, folder / "checkpoint.pth")
        if saveckp_freq and epoch % saveckp_freq == 0:
            torch.save(save_dict, folder / f"checkpoint{epoch:04}.pth")
        teachers[epoch + 1] = {k: v.clone() for k, v in teacher.backbone.state_dict().items()}
    return teachers


def _timm_folder(folder: Path, epochs: int, max_history: int = 10, ema: bool = False) -> dict[int, dict]:
    """Checkpoints written by timm's own CheckpointSaver (args a parsed Namespace, a metric per epoch).
    Returns epochs trained -> the model's state dict."""
    from timm.utils import CheckpointSaver, ModelEmaV3

    folder.mkdir(parents=True)
    model = _vit(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    p = argparse.ArgumentParser("timm")
    p.add_argument("--model", default="vit_small_patch16_224")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=epochs)
    model_ema = ModelEmaV3(model, decay=0.5) if ema else None
    saver = CheckpointSaver(
        model,
        optimizer,
        args=p.parse_args([]),
        model_ema=model_ema,
        checkpoint_dir=str(folder),
        recovery_dir=str(folder),
        max_history=max_history,
    )
    weights = {}
    for epoch in range(epochs):
        for q in model.parameters():
            q.grad = torch.randn_like(q)
        optimizer.step()
        if model_ema is not None:
            model_ema.update(model)
        saver.save_checkpoint(epoch, metric=float(epoch % 2))  # best: the odd epochs
        weights[epoch + 1] = {k: v.clone() for k, v in model.state_dict().items()}
    return weights


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------------------------------
# facebookresearch/dino
# --------------------------------------------------------------------------------------------------
def test_dino_names_hold_the_epochs_trained(tmp_path):
    teachers = _dino_folder(tmp_path / "dino", epochs=5, saveckp_freq=2)
    names = sorted(p.name for p in (tmp_path / "dino").iterdir())
    assert names == ["checkpoint.pth", "checkpoint0000.pth", "checkpoint0002.pth", "checkpoint0004.pth"]
    files = checkpoint_files(tmp_path / "dino", [1, 3, 5])
    assert {e: p.name for e, p in files.items()} == {
        1: "checkpoint0000.pth",  # saved after epoch index 0: one epoch trained (its 'epoch' field is 1)
        3: "checkpoint0002.pth",
        5: "checkpoint0004.pth",  # the numbered file wins over checkpoint.pth, which holds the same epoch
    }
    for epoch, path in files.items():
        sd, key, prefix = read_state_dict(path)
        assert (key, prefix) == ("teacher", "backbone.")  # the teacher is measured, as the README says
        assert _same(sd, teachers[epoch])
        assert load_checkpoint(path)["epoch"] == epoch


def test_dino_latest_checkpoint_gives_its_epoch_from_the_file(tmp_path):
    teachers = _dino_folder(tmp_path / "dino", epochs=4, saveckp_freq=0)  # only checkpoint.pth
    ((epoch, path),) = checkpoint_files(tmp_path / "dino", [4]).items()
    assert epoch == 4 and path.name == "checkpoint.pth" and _same(read_state_dict(path)[0], teachers[4])
    with pytest.raises(StudyError, match=r"no checkpoint for epoch 3 .*found epochs \[4\].*epoch N \+ 1"):
        checkpoint_files(tmp_path / "dino", [3])


def test_dino_folder_imports_through_the_checkpoints_source(tmp_path):
    teachers = _dino_folder(tmp_path / "seed0", epochs=3, saveckp_freq=1)
    doc = {
        "name": "dino_import",
        "design": {
            "datasets": [{"name": "objects", "n_train": 32, "n_test": 16, "image_size": IMAGE}],
            "model": MODEL,
            "seeds": [0],
            "checkpoints": [1, 3],
            "probe": {"size": 16},
            "source": {"kind": "checkpoints", "path": str(tmp_path / "seed{seed}")},
        },
        "claims": [
            {
                "name": "c",
                "kind": "compare",
                "metric": "effective_rank",
                "subset": {"dataset": "objects"},
                "a": {"layers": ["block_01"]},
                "b": {"layers": ["block_02"]},
            }
        ],
    }
    (spec,) = plan_runs(parse_hypothesis(doc, "dino.yaml"))
    run, source = spec.model_dump(), SOURCES["checkpoints"]
    assert run["imported"]["fingerprint"] is not None
    source.check(run)
    result = source.fill(run, tmp_path / "run", tmp_path / "data")
    assert result["status"] == "finished" and RunFolder(tmp_path / "run").is_finished()
    assert result["source"]["format"] == "pth" and result["source"]["state_dict_key"] == "teacher"
    assert result["source"]["files"]["1"]["file"] == "checkpoint0000.pth"
    # the same teacher weights saved bare as epoch_NNN.pt (a path the import already trusted) measure the same
    bare = tmp_path / "bare"
    bare.mkdir()
    for epoch in (1, 3):
        torch.save(teachers[epoch], bare / f"epoch_{epoch:03d}.pt")
    doc["design"]["source"]["path"] = str(bare)
    (spec2,) = plan_runs(parse_hypothesis(doc, "dino.yaml"))
    source.fill(spec2.model_dump(), tmp_path / "run2", tmp_path / "data")
    mine, theirs = RunFolder(tmp_path / "run").read_spectra(), RunFolder(tmp_path / "run2").read_spectra()
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)


# --------------------------------------------------------------------------------------------------
# timm
# --------------------------------------------------------------------------------------------------
def test_timm_names_hold_the_epochs_trained(tmp_path):
    weights = _timm_folder(tmp_path / "timm", epochs=4, ema=True)
    names = sorted(p.name for p in (tmp_path / "timm").iterdir())
    assert names == [f"checkpoint-{i}.pth.tar" for i in range(4)] + ["last.pth.tar", "model_best.pth.tar"]
    files = checkpoint_files(tmp_path / "timm", [1, 2, 3, 4])
    assert {e: p.name for e, p in files.items()} == {e: f"checkpoint-{e - 1}.pth.tar" for e in (1, 2, 3, 4)}
    for epoch, path in files.items():
        obj = load_checkpoint(path)
        assert (
            isinstance(obj["args"], argparse.Namespace) and obj["version"] == 2 and obj["epoch"] == epoch - 1
        )
        sd, key, _ = read_state_dict(path)
        assert key == "state_dict" and _same(sd, weights[epoch])  # the weights trained, not state_dict_ema
    assert checkpoint_format(files[1]) == "pth.tar"


def test_timm_last_and_best_give_their_epoch_from_the_file(tmp_path):
    weights = _timm_folder(tmp_path / "timm", epochs=5, max_history=1)
    # max_history 1 keeps one numbered file (the best by metric: epoch index 1); last.pth.tar is epoch 5
    assert sorted(p.name for p in (tmp_path / "timm").iterdir()) == [
        "checkpoint-1.pth.tar",
        "last.pth.tar",
        "model_best.pth.tar",
    ]
    files = checkpoint_files(tmp_path / "timm", [2, 5])
    assert {e: p.name for e, p in files.items()} == {2: "checkpoint-1.pth.tar", 5: "last.pth.tar"}
    assert _same(read_state_dict(files[5])[0], weights[5])
    record = imported_record(
        {"kind": "checkpoints", "path": str(tmp_path / "timm"), "paths": None}, "objects", 0, [2, 5]
    )
    assert record["fingerprint"] is not None and len(record["fingerprint"]) == 16


# --------------------------------------------------------------------------------------------------
# What stays refused
# --------------------------------------------------------------------------------------------------
class _Payload:
    """Runs code when unpickled (writes the canary file)."""

    def __init__(self, canary: Path):
        self.canary = canary

    def __reduce__(self):
        return (exec, (f"open({str(self.canary)!r}, 'w').write('ran')",))


class _Custom:
    """A class of the user's own: not in the allow-list, so never built."""

    def __init__(self):
        self.x = 1


@pytest.mark.parametrize("where", ["args", "top"])
def test_a_payload_is_refused_before_it_runs_and_the_error_names_it(tmp_path, where):
    canary = tmp_path / "canary"
    folder = tmp_path / "dino"
    _dino_folder(folder, epochs=1, saveckp_freq=1)
    obj = load_checkpoint(folder / "checkpoint0000.pth")
    if where == "args":  # inside a real DINO checkpoint, next to the allowed Namespace
        obj["args"].payload = _Payload(canary)
    else:
        obj = _Payload(canary)
    torch.save(obj, folder / "checkpoint0000.pth")
    with pytest.raises(StudyError) as err:
        read_state_dict(folder / "checkpoint0000.pth")
    msg = str(err.value)
    assert not canary.exists()  # nothing ran
    assert "\n" not in msg and "builtins.exec" in msg and "nothing in the file was run" in msg
    assert msg.startswith(str(folder / "checkpoint0000.pth"))


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("mmap", [False, True])
def test_a_legacy_file_with_a_payload_is_one_line_without_torch_s_warnings(tmp_path, protocol, mmap):
    """A pre-zip ``torch.save`` file: refused before anything runs, and torch's "Detected pickle protocol 4
    in the checkpoint" UserWarning is not printed above our line."""
    import warnings

    canary, path = tmp_path / "canary", tmp_path / "epoch_001.pt"
    torch.save(
        {"w": torch.zeros(1), "x": _Payload(canary)},
        path,
        _use_new_zipfile_serialization=False,
        pickle_protocol=protocol,
    )
    with warnings.catch_warnings(record=True) as seen, pytest.raises(StudyError) as err:
        warnings.simplefilter("always")
        load_checkpoint(path, mmap=mmap)
    assert not canary.exists() and "\n" not in str(err.value)
    assert [str(w.message) for w in seen] == []


def test_a_class_outside_the_allow_list_is_named(tmp_path):
    path = tmp_path / "epoch_001.pt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "extra": _Custom()}, path)
    with pytest.raises(StudyError) as err:
        read_state_dict(path)
    assert "test_checkpoint_files._Custom" in str(err.value)  # the cause, not cut off after 300 characters


def test_a_truncated_file_names_its_reader_error(tmp_path):
    path = tmp_path / "epoch_001.pt"
    torch.save({"model": {"w": torch.zeros(4)}}, path)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(StudyError, match=r"cannot load a state dict \(RuntimeError: .*zip"):
        read_state_dict(path)


def test_our_own_checkpoints_keep_their_names_and_record(tmp_path):
    folder = tmp_path / "ours"
    folder.mkdir()
    for e in (0, 2):
        torch.save({"model": {"w": torch.zeros(1)}, "run": {"seed": 0}}, folder / f"epoch_{e:03d}.pt")
    (folder / "last.pth").write_bytes(b"ignored: no number, not a training checkpoint name")
    assert {e: p.name for e, p in checkpoint_files(folder, [0, 2]).items()} == {
        0: "epoch_000.pt",
        2: "epoch_002.pt",
    }
    assert json.dumps(sorted(checkpoint_format(p) for p in folder.iterdir())) == '["pt", "pt", "pth"]'
