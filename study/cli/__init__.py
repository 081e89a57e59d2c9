"""The command line: ``python -m study VERB`` and the ``study`` script.

Public: :func:`main` (the console script's entry point) and the module ``verbs`` (what each verb does).
Private: ``_parser`` (every verb's options).
"""

from __future__ import annotations

from study.cli.verbs import main

__all__ = ["main"]
