"""vitstudy_core.registry: the one registry shape every plug-in uses, and vitstudy_core.io's clean-up."""

from __future__ import annotations

import pytest

from vitstudy_core.errors import StudyError
from vitstudy_core.io import atomic_path, remove_temporaries
from vitstudy_core.registry import Registry


def test_register_get_names_and_mapping_reads():
    reg: Registry[int] = Registry("widget")
    reg.register("a", 1)

    @reg.register("b")
    def b() -> int:
        return 2

    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2
    assert reg.get("a") == 1 and reg["b"] is b and "a" in reg and "z" not in reg
    assert reg.get("z", None) is None


def test_unknown_name_is_one_line_listing_the_registered_ones():
    reg: Registry[int] = Registry("widget")
    reg.register("alpha", 1)
    with pytest.raises(StudyError) as err:
        reg.get("beta")
    assert str(err.value) == "unknown widget 'beta'; expected one of ['alpha']"
    with pytest.raises(KeyError):  # the Mapping contract: indexing an unknown name is a KeyError
        reg["beta"]


def test_twice_or_refused_by_the_check_is_a_programming_error():
    def even(name: str, value: int) -> None:
        if value % 2:
            raise ValueError(f"{name} must be even")

    reg: Registry[int] = Registry("widget", check=even)
    reg.register("two", 2)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("two", 4)
    with pytest.raises(ValueError, match="must be even"):
        reg.register("three", 3)
    assert reg.names() == ["two"]


def test_remove_temporaries_removes_only_interrupted_writes(tmp_path):
    (tmp_path / "sub").mkdir()
    keep = tmp_path / "sub" / "result.json"
    keep.write_text("{}")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "sub" / "spectra.npz", suffix=".tmp.npz") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError  # atomic_path removes its own temporary on an exception ...
    left = tmp_path / "sub" / ".spectra.npz.abc123.tmp.npz"  # ... a kill -9 does not
    left.write_bytes(b"half")
    assert remove_temporaries(tmp_path) == [left]
    assert keep.exists() and not left.exists()
    assert remove_temporaries(tmp_path / "absent") == []
