"""Every image decodes to its true colours or is refused by name, and bad data stop ``run`` before it
writes anything: 16-bit, CMYK, palettes and alpha; decompression bombs, link loops, broken links, truncated
JPEGs and empty class folders; a data folder whose name holds ``$``."""

from __future__ import annotations

import os
import shutil
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from runners.datasets import cache, check_dataset_folder, load_split
from tests.datasets.conftest import DISK_HYPOTHESIS, disk_spec
from vitstudy_core.errors import StudyError

GREY16 = np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000 + 500  # 500 .. 63500: 16-bit values


def _decode(path: Path) -> np.ndarray:
    """``decode_file`` at the image's own size, any warning an error (a warning is a line the user sees)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return cache.decode_file(path, 8)


def _palette(path: Path, **save) -> np.ndarray:
    """An 8 x 8 palette image (index 0 red, 1 green; pixel (0, 0) green) saved with ``save``; its RGB."""
    img = Image.new("P", (8, 8))
    img.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    img.putpixel((0, 0), 1)
    img.save(path, **save)
    want = np.zeros((8, 8, 3), np.uint8)
    want[..., 0] = 255
    want[0, 0] = (0, 255, 0)
    return want


def test_16_bit_greyscale_is_scaled_not_saturated(tmp_path):
    """PIL's convert('RGB') clips 16-bit values at 255 (a white image); they are scaled to 8 bits."""
    want = np.repeat(np.rint(GREY16 / 257.0).astype(np.uint8)[..., None], 3, axis=2)
    for name in ("g16.png", "g16.tif", "g16.pgm"):  # open as I;16 (PNG, TIFF) and I (PGM)
        Image.fromarray(GREY16).save(tmp_path / name)
        got = _decode(tmp_path / name)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert (got == 255).mean() == 0


def test_cmyk_palette_alpha_and_bilevel_decode_to_rgb(tmp_path):
    red = np.zeros((8, 8, 3), np.uint8)
    red[..., 0] = 255
    for name in ("cmyk.jpg", "cmyk.tif"):
        Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / name)
        assert np.abs(_decode(tmp_path / name).astype(int) - red).max() <= 2, name  # JPEG: lossy
    for name, save in {
        "p.png": {},
        "p_index.png": {"transparency": 0},  # one transparent index
        "p_bytes.png": {"transparency": bytes([0, 128])},  # alpha per index (PIL warns on convert('RGB'))
    }.items():
        want = _palette(tmp_path / name, **save)
        assert Image.open(tmp_path / name).mode == "P"
        np.testing.assert_array_equal(_decode(tmp_path / name), want, err_msg=name)
    Image.new("LA", (8, 8), (100, 50)).save(tmp_path / "la.png")
    np.testing.assert_array_equal(_decode(tmp_path / "la.png"), np.full((8, 8, 3), 100, np.uint8))
    bits = Image.new("1", (8, 8), 0)
    bits.putpixel((3, 2), 1)
    bits.save(tmp_path / "bits.png")
    want = np.zeros((8, 8, 3), np.uint8)
    want[2, 3] = 255
    np.testing.assert_array_equal(_decode(tmp_path / "bits.png"), want)


def test_float_and_32_bit_pixels_are_refused_by_name(tmp_path):
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(tmp_path / "f.tif")
    Image.fromarray(np.full((8, 8), 70000, np.int32)).save(tmp_path / "i32.tif")
    assert "mode F" in cache.check_image(tmp_path / "f.tif")
    for name, what in (("f.tif", "mode F"), ("i32.tif", "0..65535")):
        with pytest.raises(cache.UnreadableImage, match=what) as err:
            cache.decode_file(tmp_path / name, 8)
        assert err.value.path == str(tmp_path / name)


def _png_bomb(path: Path) -> None:
    """A valid 30000 x 30000 PNG header (900 M pixels, over PIL's bomb limit) in a few hundred bytes."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 100)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty_class(root: Path) -> Path:
    for f in (root / "train" / "n12").iterdir():
        f.unlink()
    return root / "train" / "n12"


# each breaks the copy of the imagefolder fixture: (what it does, the path the one line must name, reason)
BAD = {
    "bomb": (lambda r: _png_bomb(r / "train/n10/bomb.png"), "train/n10/bomb.png", "decompression bomb"),
    "loop": (lambda r: os.symlink("me.png", r / "train/n11/me.png"), "train/n11/me.png", "symbolic links"),
    "dangling": (lambda r: os.symlink("gone.png", r / "val/n10/x.png"), "val/n10/x.png", "No such file"),
    "truncated": (lambda r: _truncate(r / "val/n12/img2.JPEG"), "val/n12/img2.JPEG", "runcated"),
    "empty class": (_empty_class, "", "class folder train/n12 holds no image"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_stop_run_before_anything_is_written(case, roots, tmp_path, capsys):
    """One line naming the file, exit 2, and no --out folder at all (no store, registration, fingerprints
    or cache), through ``--data-root`` to a folder whose name holds ``$`` (not expanded as a variable)."""
    from study.cli import main

    root = tmp_path / "in$HOME${X}" / "in100"
    shutil.copytree(roots["imagefolder"][0], root)
    make, named, why = BAD[case]
    make(root)
    hyp = tmp_path / "h.yaml"
    hyp.write_text(
        DISK_HYPOTHESIS.replace("kind: ucmerced", "kind: imagefolder, classes: [n10, n11, n12]").replace(
            ", test_fraction: 0.5", ""
        )
    )
    out = tmp_path / "out"
    rc = main(["run", str(hyp), "--out", str(out), "--workers", "1", "--data-root", f"ucm={root}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{root}/{named}".rstrip("/") in err and why in err and "dataset ucm" in err, err
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))


def test_a_folder_named_with_a_dollar_loads(roots, tmp_path, monkeypatch):
    monkeypatch.delenv("b", raising=False)
    root = tmp_path / "a$b"
    shutil.copytree(roots["ucmerced"][0], root)
    x, _ = load_split(disk_spec("ucmerced", roots, root), "train", tmp_path / "cache")
    assert len(x) > 0


def test_an_empty_tiny_imagenet_class_is_refused(roots, tmp_path):
    root = tmp_path / "tiny"
    shutil.copytree(roots["tiny_imagenet"][0], root)
    for f in (root / "train" / "n01000000" / "images").iterdir():
        f.unlink()
    with pytest.raises(StudyError, match="train/n01000000/images holds no image") as err:
        check_dataset_folder(disk_spec("tiny_imagenet", roots, root))
    assert "\n" not in str(err.value)


def test_a_bad_image_the_check_cannot_see_is_named_when_decoded(roots, tmp_path):
    """A truncated TIFF passes the header check; its decode error names the file."""
    root = tmp_path / "ucm"
    shutil.copytree(roots["ucmerced"][0], root)
    bad = next((root / "Images" / "beach").iterdir())
    _truncate(bad)
    spec = disk_spec("ucmerced", roots, root, test_fraction=0.5)
    with pytest.raises(StudyError) as err:
        for split in ("train", "test"):
            load_split(spec, split, tmp_path / "cache")
    assert str(err.value).startswith(f"{bad}: dataset ucmerced: unreadable image (")
