"""On-disk loaders, each on a tiny fixture written here in the dataset's exact published layout."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from runners.datasets import dataset_fingerprint, load_disk_split
from study.runspecs import plan_runs
from study.schema import parse_hypothesis, with_data_roots
from vitstudy_core.errors import StudyError

N_CLASSES, PER_CLASS = 3, 4  # 12 train and 12 held-out images: enough for an 8-image probe


def _rgb(rng: np.random.Generator, size: int, cls: int) -> np.ndarray:
    """A noisy image whose mean colour encodes the class, so labels can be checked after resizing."""
    base = np.zeros((size, size, 3)) + 40
    base[..., cls % 3] = 200
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


def _py2_pickle(d: dict) -> bytes:
    """Pickle ``d`` as Python 2's cPickle (protocol 2) does: ``str`` keys as BINSTRING opcodes, numpy arrays
    through ``numpy.core.multiarray._reconstruct`` with the raw bytes as a BINSTRING (as in the official
    CIFAR-100 files). Values: uint8 arrays, lists of ints, lists of ``bytes``."""

    def s(b: bytes) -> bytes:
        return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<i", len(b)) + b)

    def i(n: int) -> bytes:
        return b"J" + struct.pack("<i", n)

    def value(v) -> bytes:
        if isinstance(v, np.ndarray):
            dt = b"cnumpy\ndtype\n" + s(b"u1") + i(0) + i(1) + b"\x87R(" + i(3) + s(b"|") + b"NNN"
            dt += i(-1) + i(-1) + i(0) + b"tb"
            shape = b"(" + b"".join(i(n) for n in v.shape) + b"t"
            head = b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + i(0) + b"\x85" + s(b"b")
            return head + b"\x87R(" + i(1) + shape + dt + b"\x89" + s(v.astype(np.uint8).tobytes()) + b"tb"
        return b"](" + b"".join(s(x) if isinstance(x, bytes) else i(int(x)) for x in v) + b"e"

    return b"\x80\x02}(" + b"".join(s(k.encode()) + value(v) for k, v in d.items()) + b"u."


def write_cifar100(root: Path) -> Path:
    """train/test/meta pickled by Python 2 as the official python version: str keys, (N, 3072) channel-major."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split in ("train", "test"):
        labels = [c for c in range(N_CLASSES) for _ in range(PER_CLASS)]
        data = np.stack([_rgb(rng, 32, c).transpose(2, 0, 1).reshape(-1) for c in labels])
        d = {"data": data, "fine_labels": labels, "coarse_labels": [c % 2 for c in labels], "filenames": []}
        (root / split).write_bytes(_py2_pickle(d))
    meta = {
        "fine_label_names": [f"fine{i}".encode() for i in range(100)],
        "coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    }
    (root / "meta").write_bytes(_py2_pickle(meta))
    return root


def write_tiny_imagenet(root: Path) -> Path:
    """train/<wnid>/images/<wnid>_<i>.JPEG (+ boxes file), val/images + val_annotations.txt, wnids.txt."""
    rng = np.random.default_rng(1)
    wnids = [f"n0{i}000000" for i in range(N_CLASSES)]
    (root / "val" / "images").mkdir(parents=True)
    ann = []
    for c, w in enumerate(wnids):
        d = root / "train" / w / "images"
        d.mkdir(parents=True)
        for i in range(PER_CLASS):
            img = Image.fromarray(_rgb(rng, 64, c))
            if c == 0 and i == 0:  # a few Tiny ImageNet images are greyscale JPEGs (mode L)
                img = img.convert("L")
            img.save(d / f"{w}_{i}.JPEG", quality=95)
            fn = f"val_{c * PER_CLASS + i}.JPEG"
            Image.fromarray(_rgb(rng, 64, c)).save(root / "val" / "images" / fn, quality=95)
            ann.append(f"{fn}\t{w}\t0\t0\t63\t63")
        (root / "train" / w / f"{w}_boxes.txt").write_text("")
    (root / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    return root


def write_ucmerced(root: Path) -> Path:
    """Images/<class>/<class>NN.tif (the archive's own layout); some are 40 x 38 (the archive has 256 x 247)."""
    rng = np.random.default_rng(2)
    for c, name in enumerate(["agricultural", "airplane", "beach"][:N_CLASSES]):
        d = root / "Images" / name
        d.mkdir(parents=True)
        for i in range(2 * PER_CLASS):
            img = _rgb(rng, 40, c)
            Image.fromarray(img[:38] if i % 3 == 0 else img).save(d / f"{name}{i:02d}.tif")
    return root


def write_imagefolder(root: Path) -> Path:
    """train/<class>/*.JPEG and val/<class>/*.JPEG (ImageNet-100 style), non-square images."""
    rng = np.random.default_rng(3)
    for split in ("train", "val"):
        for c in range(N_CLASSES + 1):  # one class more than the class list keeps
            d = root / split / f"n1{c}"
            d.mkdir(parents=True)
            for i in range(PER_CLASS):
                Image.fromarray(_rgb(rng, 48, c)[:, :36]).save(d / f"img{i}.JPEG")
    return root


WRITERS = {
    "cifar100": write_cifar100,
    "tiny_imagenet": write_tiny_imagenet,
    "ucmerced": write_ucmerced,
    "imagefolder": write_imagefolder,
}
EXTRA = {"imagefolder": {"classes": ["n10", "n11", "n12"]}, "ucmerced": {"test_fraction": 0.5}}


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("datasets")
    return {kind: write(base / kind) for kind, write in WRITERS.items()}


def _spec(kind: str, path: Path, **kw) -> dict:
    return {"name": kind, "kind": kind, "path": str(path), "image_size": 8, **EXTRA.get(kind, {}), **kw}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_loader_reads_fixture(kind, roots, tmp_path):
    spec = _spec(kind, roots[kind])
    xtr, ytr = load_disk_split(spec, "train", tmp_path)
    xte, yte = load_disk_split(spec, "test", tmp_path)
    assert xtr.shape[1:] == (8, 8, 3) and xtr.dtype == np.uint8 and ytr.dtype == np.int64
    assert set(ytr.tolist()) == set(yte.tolist()) == set(range(N_CLASSES))
    assert len(xtr) + len(xte) == (2 * N_CLASSES * PER_CLASS)
    # labels survive decoding and resizing: each class's dominant channel is its class index mod 3
    for x, y in ((xtr, ytr), (xte, yte)):
        assert (x.reshape(len(x), -1, 3).mean(1).argmax(1) == y % 3).all()
    probe, _ = load_disk_split(spec, "probe", tmp_path, probe_size=8, probe_seed=5)
    assert probe.shape == (8, 8, 8, 3)
    assert all(any((p == t).all() for t in xte) for p in probe)  # drawn from the held-out split
    np.testing.assert_array_equal(load_disk_split(spec, "probe", tmp_path, 8, 5)[0], probe)  # cache


def test_subsets_are_seeded(roots, tmp_path):
    spec = _spec("cifar100", roots["cifar100"], n_train=5)
    full, _ = load_disk_split({**spec, "n_train": None}, "train", tmp_path)
    a, _ = load_disk_split(spec, "train", tmp_path / "a")
    b, _ = load_disk_split(spec, "train", tmp_path / "b")
    c, _ = load_disk_split({**spec, "subset_seed": 3}, "train", tmp_path / "c")
    assert len(full) == 12 and len(a) == 5
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_ucmerced_split_is_seeded_stratified_and_disjoint(roots, tmp_path):
    spec = {**_spec("ucmerced", roots["ucmerced"]), "test_fraction": 0.25}
    xtr, ytr = load_disk_split(spec, "train", tmp_path)
    xte, yte = load_disk_split(spec, "test", tmp_path)
    assert np.bincount(yte).tolist() == [2] * N_CLASSES and np.bincount(ytr).tolist() == [6] * N_CLASSES
    assert not any((t == x).all() for t in xte for x in xtr)
    other, _ = load_disk_split({**spec, "split_seed": 1}, "test", tmp_path / "b")
    assert not np.array_equal(other, xte)


def test_cifar_coarse_labels(roots, tmp_path):
    _, y = load_disk_split(_spec("cifar100", roots["cifar100"], label="coarse"), "train", tmp_path)
    assert set(y.tolist()) == {0, 1}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_missing_folder_is_one_line_error(kind, tmp_path):
    with pytest.raises(StudyError) as err:
        load_disk_split(_spec(kind, tmp_path / "nowhere"), "train", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and "expected" in msg and kind in msg


def test_malformed_layouts_name_what_is_wrong(roots, tmp_path):
    bad = tmp_path / "tiny"
    shutil.copytree(roots["tiny_imagenet"], bad)
    (bad / "val" / "val_annotations.txt").unlink()
    with pytest.raises(StudyError, match="val_annotations.txt"):
        load_disk_split(_spec("tiny_imagenet", bad), "train", tmp_path)
    cifar = tmp_path / "cifar"
    shutil.copytree(roots["cifar100"], cifar)
    (cifar / "train").write_bytes(b"not a pickle")
    with pytest.raises(StudyError, match="unreadable pickle"):
        load_disk_split(_spec("cifar100", cifar), "train", tmp_path)
    with pytest.raises(StudyError, match="n99"):
        load_disk_split(_spec("imagefolder", roots["imagefolder"], classes=["n10", "n99"]), "train", tmp_path)


def test_env_path_resolution_and_unset_variable(roots, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDY_TEST_UCM", str(roots["ucmerced"]))
    x, _ = load_disk_split(_spec("ucmerced", "${STUDY_TEST_UCM}"), "train", tmp_path)
    assert len(x) > 0
    monkeypatch.delenv("STUDY_TEST_UCM")
    with pytest.raises(StudyError, match="STUDY_TEST_UCM is not set"):
        load_disk_split(_spec("ucmerced", "${STUDY_TEST_UCM}"), "train", tmp_path)


HYP = """\
name: disk
design:
  datasets:
    - {name: ucm, kind: ucmerced, path: "${STUDY_TEST_DATA}", image_size: 8, test_fraction: 0.5}
  model: {preset: vit_cpu12, embed_dim: 16, depth: 2, num_heads: 2}
  training: {epochs: 1, batch_size: 8, max_steps_per_epoch: 2}
  seeds: [0]
  probe: {size: 8}
claims:
  - {name: u, kind: u_shape, metric: eed_pct, subset: {dataset: ucm},
     regions: {early: [block_01], bottleneck: [block_02], late: [norm]}}
"""


def test_run_key_uses_content_not_path(roots, tmp_path, monkeypatch):
    hyp = parse_hypothesis(yaml.safe_load(HYP))
    monkeypatch.delenv("STUDY_TEST_DATA", raising=False)
    assert plan_runs(hyp)[0].dataset["fingerprint"] is None  # plans without the data present
    monkeypatch.setenv("STUDY_TEST_DATA", str(roots["ucmerced"]))
    key = plan_runs(hyp)[0].key
    copy = tmp_path / "elsewhere"
    shutil.copytree(roots["ucmerced"], copy)
    moved = with_data_roots(hyp, {"ucm": str(copy)})
    assert plan_runs(moved)[0].dataset["path"] == str(copy) and plan_runs(moved)[0].key == key
    next((copy / "Images" / "beach").iterdir()).unlink()
    assert plan_runs(moved)[0].key != key
    assert dataset_fingerprint({"path": str(tmp_path / "absent")}) is None
    with pytest.raises(StudyError, match="--data-root"):
        with_data_roots(hyp, {"nope": "/x"})


@pytest.mark.parametrize("objective", ["supervised", "dino"])
@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_tiny_training_on_each_format(kind, objective, roots, tmp_path, monkeypatch):
    """A depth-2 ViT trains 2 steps with each objective on each format and yields spectra."""
    from runners.train import train_run

    monkeypatch.setenv("STUDY_TEST_DATA", str(roots[kind]))
    data = yaml.safe_load(HYP)
    data["design"]["datasets"] = [
        {"name": "ds", "kind": kind, "path": "${STUDY_TEST_DATA}", **EXTRA.get(kind, {})}
    ]
    data["design"]["datasets"][0]["image_size"] = 8
    data["claims"][0]["subset"]["dataset"] = "ds"
    if objective == "dino":
        data["design"]["objective"] = {"kind": "dino", "preset": "dino_small", "out_dim": 32, "hidden_dim": 16,
                                       "bottleneck_dim": 8, "n_local_crops": 2}  # fmt: skip
    spec = plan_runs(parse_hypothesis(data))[0].model_dump()
    result = train_run(spec, tmp_path / "run", tmp_path / "data")
    assert result["status"] == "finished", result.get("error")
    assert np.isfinite(result["history"][0]["loss"])
    assert ("knn_acc" if objective == "dino" else "test_acc") in result["history"][0]
    with np.load(tmp_path / "run" / "spectra.npz") as f:
        assert "1/block_02/all" in f.files and (f["1/block_02/all"] >= 0).all()


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parent.parent / "hypotheses" / "paper").glob("*.yaml"))
)
def test_paper_hypotheses_validate_and_plan_without_data(path, monkeypatch):
    from study.schema import load_hypothesis

    for var in ("CIFAR100_DIR", "TINY_IMAGENET_DIR", "UCMERCED_DIR", "IMAGENET100_DIR", "TGO_I_LOG"):
        monkeypatch.delenv(var, raising=False)
    hyp = load_hypothesis(path)
    runs = plan_runs(hyp)
    if hyp.design.source is not None:  # an imported log: one run per seed, fingerprinted once it is there
        assert len(runs) == len(hyp.design.seeds) and all(r.imported["fingerprint"] is None for r in runs)
        return
    assert len(runs) == len(hyp.design.datasets) * len(hyp.design.seeds) >= 5
    assert all(r.model["name"] == "vit_small_patch16_224" and r.dataset["image_size"] == 224 for r in runs)
    assert {r.objective["kind"] for r in runs} <= {"supervised", "dino"}


def test_run_with_missing_data_folder_writes_nothing(tmp_path, capsys, monkeypatch):
    """An unset ${VAR} or a missing folder stops `run` with one line (exit 2) before anything is written."""
    from study.cli import main
    from tests.conftest import TINY_HYPOTHESIS

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


# ---- ImageNet-100 as researchers build it: links into an ImageNet tree, notebook litter, nested folders ----
def _linked_imagefolder(root: Path, source: Path, classes: list[str]) -> Path:
    """``ln -s source/<split>/<class> root/<split>/`` for each class: how ImageNet-100 is usually built."""
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        for c in classes:
            (root / split / c).symlink_to(source / split / c, target_is_directory=True)
    return root


def test_symlinked_class_folders_are_fingerprinted_and_read(roots, tmp_path):
    """Two folders of links to different classes: different fingerprints, caches and images."""
    src = roots["imagefolder"]
    a = _linked_imagefolder(tmp_path / "in_a", src, ["n10", "n11", "n12"])
    b = _linked_imagefolder(tmp_path / "in_b", src, ["n11", "n12", "n13"])
    empty = tmp_path / "empty"
    for split in ("train", "val"):
        for c in ("n10", "n11", "n12"):
            (empty / split / c).mkdir(parents=True)
    fps = {dataset_fingerprint({"path": str(p)}) for p in (a, b, empty)}
    assert len(fps) == 3
    xa, ya = load_disk_split(_spec("imagefolder", a, classes=None), "train", tmp_path / "cache")
    xb, yb = load_disk_split(_spec("imagefolder", b, classes=None), "train", tmp_path / "cache")
    assert len(xa) == len(xb) == N_CLASSES * PER_CLASS
    assert not np.array_equal(xa, xb)  # b is not served a's cache
    fresh, _ = load_disk_split(_spec("imagefolder", b, classes=None), "train", tmp_path / "fresh")
    np.testing.assert_array_equal(xb, fresh)
    # class i of b is source class n1(i+1): its dominant channel is (i + 1) mod 3
    assert (xb.reshape(len(xb), -1, 3).mean(1).argmax(1) == (yb + 1) % 3).all()


def test_hidden_folders_and_files_are_skipped(roots, tmp_path):
    """A ``.ipynb_checkpoints`` folder is no class and macOS ``._*`` files are not images."""
    from runners.datasets import disk_num_classes

    root = tmp_path / "in100"
    shutil.copytree(roots["imagefolder"], root)
    for split in ("train", "val"):
        (root / split / ".ipynb_checkpoints").mkdir()
        Image.fromarray(_rgb(np.random.default_rng(9), 48, 1)).save(
            root / split / ".ipynb_checkpoints" / "x.jpg"
        )
        (root / split / "n10" / "._img0.JPEG").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
        (root / split / "n10" / ".cache").mkdir()
        Image.fromarray(_rgb(np.random.default_rng(9), 48, 1)).save(root / split / "n10" / ".cache" / "y.jpg")
    spec = _spec("imagefolder", root, classes=None)
    assert disk_num_classes(spec) == N_CLASSES + 1  # the fixture's 4 class folders, not 5
    for split in ("train", "test"):
        x, y = load_disk_split(spec, split, tmp_path / "cache")
        assert len(x) == (N_CLASSES + 1) * PER_CLASS
        assert (x.reshape(len(x), -1, 3).mean(1).argmax(1) == y % 3).all()  # labels not shifted


def test_nested_folders_inside_a_class_are_read(roots, tmp_path):
    root = tmp_path / "nested"
    shutil.copytree(roots["imagefolder"], root)
    sub = root / "train" / "n10" / "extra" / "deeper"
    sub.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(_rgb(np.random.default_rng(i), 48, 0)).save(sub / f"more{i}.png")
    x, y = load_disk_split(_spec("imagefolder", root), "train", tmp_path / "cache")
    assert np.bincount(y).tolist() == [PER_CLASS + 3, PER_CLASS, PER_CLASS]


def test_image_folder_listing_matches_torchvision(roots, tmp_path):
    """Our listing of class folders is torchvision's ``make_dataset`` (links followed, nested folders read)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    from runners.datasets import list_image_folder

    root = _linked_imagefolder(tmp_path / "in", roots["imagefolder"], ["n10", "n11"]) / "train"
    shutil.copytree(roots["imagefolder"] / "train" / "n12", root / "n12")
    (root / "n12" / "a-b").mkdir()  # '-' sorts before '/': the order of sorted(os.walk(...)) is kept
    (root / "n12" / "a").mkdir()
    for d in ("a-b", "a"):
        Image.fromarray(_rgb(np.random.default_rng(0), 8, 0)).save(root / "n12" / d / "z.png")
    (root / "n12" / "notes.txt").write_text("not an image")
    classes, class_to_idx = find_classes(root)
    ours = list_image_folder(root, classes)
    assert [(str(p), y) for p, y in ours] == make_dataset(root, class_to_idx, IMG_EXTENSIONS)


def test_split_is_a_memory_map_written_atomically(roots, tmp_path, monkeypatch, capsys):
    """The decoded split is a read-only-on-disk .npy map; an interrupted decode leaves no cache behind."""
    import runners.datasets as datasets

    spec = _spec("imagefolder", roots["imagefolder"])
    real, calls = datasets._square, []

    def failing(img, size):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(img, size)

    monkeypatch.setattr(datasets, "_square", failing)
    with pytest.raises(KeyboardInterrupt):
        load_disk_split(spec, "train", tmp_path / "cache")
    assert list((tmp_path / "cache").glob("*")) == []
    monkeypatch.setattr(datasets, "_square", real)
    x, y = load_disk_split(spec, "train", tmp_path / "cache")
    assert isinstance(x, np.memmap) and x.shape == (N_CLASSES * PER_CLASS, 8, 8, 3)
    assert "decoding" in capsys.readouterr().out  # the cache size is printed before decoding
    again, y2 = load_disk_split(spec, "train", tmp_path / "cache")
    assert isinstance(again, np.memmap)
    np.testing.assert_array_equal(again, x)
    np.testing.assert_array_equal(y2, y)


def test_refuses_when_the_disk_cannot_hold_the_cache(roots, tmp_path, monkeypatch):
    import runners.datasets as datasets

    monkeypatch.setattr(datasets.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 100))
    with pytest.raises(StudyError) as err:
        load_disk_split(_spec("cifar100", roots["cifar100"], image_size=64), "train", tmp_path / "cache")
    msg = str(err.value)
    assert "\n" not in msg and "free" in msg and "cifar100" in msg
    assert not list((tmp_path / "cache").glob("*.npy"))


def test_run_key_does_not_depend_on_the_data_being_present(roots, tmp_path, monkeypatch):
    """The fingerprint is recorded in the data folder when runs are planned for training and reused."""
    hyp = parse_hypothesis(yaml.safe_load(HYP))
    data = tmp_path / "ucm"
    shutil.copytree(roots["ucmerced"], data)
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    (trained,) = plan_runs(hyp, tmp_path / "out" / "data", record=True)
    assert trained.dataset["fingerprint"] == dataset_fingerprint(trained.dataset)
    monkeypatch.delenv("STUDY_TEST_DATA")
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == trained.key  # variable unset
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    shutil.rmtree(data)
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == trained.key  # folder gone
    assert plan_runs(hyp, tmp_path / "elsewhere")[0].dataset["fingerprint"] is None  # nothing recorded
    # data present again but changed: `run` keys it by its content and records the change
    shutil.copytree(roots["ucmerced"], data)
    next((data / "Images" / "beach").iterdir()).unlink()
    (changed,) = plan_runs(hyp, tmp_path / "out" / "data", record=True)
    assert changed.key != trained.key
    assert plan_runs(hyp, tmp_path / "out" / "data")[0].key == changed.key
    book = json.loads((tmp_path / "out" / "data" / "fingerprints.json").read_text())
    assert book["ucmerced:ucm"]["history"] == [trained.dataset["fingerprint"]]


def test_table_finds_runs_on_a_host_without_the_data(roots, tmp_path, monkeypatch, capsys):
    """Train on a fixture folder, delete the folder: `table` still finds the runs by their recorded keys."""
    from study.cli import main

    data = tmp_path / "in100"
    shutil.copytree(roots["imagefolder"], data)
    text = HYP.replace(
        '{name: ucm, kind: ucmerced, path: "${STUDY_TEST_DATA}", image_size: 8, test_fraction: 0.5}',
        '{name: ucm, kind: imagefolder, path: "${STUDY_TEST_DATA}", image_size: 8}',
    )
    hyp = tmp_path / "h.yaml"
    hyp.write_text(text)
    monkeypatch.setenv("STUDY_TEST_DATA", str(data))
    out = tmp_path / "out"
    assert main(["run", str(hyp), "--out", str(out), "--no-mlflow", "--no-report", "--workers", "1"]) == 0
    shutil.rmtree(data)
    monkeypatch.delenv("STUDY_TEST_DATA")
    capsys.readouterr()
    assert main(["table", str(hyp), "--out", str(out)]) == 0
    assert "1 run(s)" in capsys.readouterr().out
    assert main(["table", str(hyp), "--out", str(tmp_path / "other")]) == 2  # nothing recorded there
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fingerprint" in err and "ucm" in err
