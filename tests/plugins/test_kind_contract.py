"""The shipped contract (``vitstudy.testing.kinds``) over every registered claim kind, built-in or plug-in."""

from __future__ import annotations

from vitstudy.testing import parametrize_with_checks


@parametrize_with_checks("kinds")
def test_kind_contract(name, check):
    check(name)
