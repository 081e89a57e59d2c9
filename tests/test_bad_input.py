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
