"""The hardened YAML loader of hypothesis files: ``yaml.SafeLoader`` with limits on file size, nesting
depth and expanded alias size, and refusing duplicate keys; any problem is one line naming the file.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from vitstudy_core.errors import StudyError

MAX_FILE_BYTES = 1 << 20  # a hypothesis file is a page of YAML; 1 MiB leaves room for long claim lists
MAX_DEPTH = 64  # the schema nests about 6 levels; deeper input is junk (and would exhaust the stack)
MAX_NODES = 200_000  # nodes after expanding aliases: stops "billion laughs" anchor bombs


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no tag executes code or builds an object) that also refuses duplicate
    mapping keys, nesting deeper than :data:`MAX_DEPTH` and alias expansions over :data:`MAX_NODES`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *base' merges; keys written next to it override on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "expected a plain mapping key", key_node.start_mark
                ) from None
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node, memo: dict[int, int]) -> int:
    """Nodes in ``node`` with every alias expanded (shared sub-trees counted each time they appear)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a node reached again while being counted (a recursive alias) counts once
    n = 1
    if isinstance(node, yaml.SequenceNode):
        n += sum(_expanded_size(v, memo) for v in node.value)
    elif isinstance(node, yaml.MappingNode):
        n += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = n
    return n


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What yaml expected, in words: the indentation it wanted rather than its parser's token names
    (``expected <block end>, but found '<block mapping start>'``)."""
    problem = str(getattr(exc, "problem", None) or exc)
    mark, start = getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)
    col = f"column {mark.column + 1}" if mark is not None else "this line"
    if problem.startswith("expected <block end>") and start is not None:
        return (
            f"bad indentation: the line at {col} does not continue the block that starts on line "
            f"{start.line + 1} (yaml expected another line of that block at column {start.column + 1}, or a "
            "line further left to end it; indent with spaces)"
        )
    if problem == "mapping values are not allowed here":
        return (
            f"a 'key:' at {col} where yaml expected a value: the line is indented deeper than the keys "
            "beside it, or a plain value holds ': ' (quote the value)"
        )
    if "'\\t'" in problem:
        return f"a tab at {col}: YAML indents with spaces"
    context = getattr(exc, "context", None)
    if context and start is not None:
        return f"{problem} at {col} ({context} from line {start.line + 1})"
    return f"{problem} at {col}" if mark is not None else problem


def _read_yaml(path: Path) -> object:
    """Parse a YAML file with :class:`StrictLoader`; one-line StudyError on any problem."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise StudyError(
            f"file is {path.stat().st_size} bytes; expected a hypothesis file under 1 MiB", str(path)
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise StudyError("expected a UTF-8 text file", str(path)) from None
    loader = None
    try:
        loader = StrictLoader(text)  # its reader already refuses control characters
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise StudyError(f"expands to over {MAX_NODES} YAML nodes through its aliases", str(path))
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        raise StudyError(f"invalid YAML: {yaml_problem(exc)}", str(path), where) from None
    except RecursionError:  # a recursive alias through a merge key
        raise StudyError(f"invalid YAML: nested deeper than {MAX_DEPTH} levels", str(path)) from None
    finally:
        if loader is not None:
            loader.dispose()
