"""Every executor's own command-line flags, as the executors declare them (``ExecutorKind.flags``,
``ExecutorKind.submit``): nothing here names an executor.

    add_executor_flags(parser)              # run, sweep: the flags of every registered executor
    add_executor_flags(parser, submit=True) # submit: those of the executors a driver is submitted to
    executor_flags(args)                    # {option: value} of the flags given, for --executor's choice

The installed plug-ins are loaded first (reading the registry loads them), so a plug-in executor's flags
and its name are on the command line as the built-ins' are.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from vitstudy_core.errors import StudyError


def _flag_modules(submit: bool = False) -> dict[str, ModuleType]:
    """``{executor name: its flags module}`` (with ``submit``: of the executors one can submit to)."""
    from runners.executors.local import EXECUTORS

    return {
        name: importlib.import_module(kind.flags)
        for name, kind in EXECUTORS.items()
        if kind.flags is not None and (kind.submit is not None or not submit)
    }


def submit_targets() -> list[str]:
    """The executors ``submit`` can start a driver on, in registration order."""
    from runners.executors.local import EXECUTORS

    return [name for name, kind in EXECUTORS.items() if kind.submit is not None]


def add_executor_flags(p: argparse.ArgumentParser, submit: bool = False) -> None:
    """Add every executor's own flags to ``p`` (``submit``: only those of :func:`submit_targets`)."""
    for module in _flag_modules(submit).values():
        module.add_flags(p)


def executor_flags(args: argparse.Namespace, submit: bool = False) -> dict[str, str]:
    """The executor options of the flags given on the command line; flags of an executor other than
    ``args.executor`` are that executor's one line (its ``MISPLACED``)."""
    options: dict[str, str] = {}
    for name, module in _flag_modules(submit).items():
        given = module.read_flags(args)
        if given and args.executor != name:
            raise StudyError(module.MISPLACED.format(name=name))
        options.update(given)
    return options


def submit_driver(args: argparse.Namespace, opts: object) -> str:
    """Start the driver of ``args.hypothesis`` on ``args.executor``'s cluster (its ``submit``); returns
    the lines to print."""
    from runners.executors.local import EXECUTORS

    module, _, attr = str(EXECUTORS.get(args.executor).submit).partition(":")
    submit = getattr(importlib.import_module(module), attr)
    return submit(args.hypothesis, args.out, opts, executor_flags(args, submit=True), args.address)
