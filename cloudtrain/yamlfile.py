"""Loading YAML files (recipes, config) with errors that name the file, line and field.

pydantic reports a field path; we map it back to the YAML node so the user gets `file:line`.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cloudtrain.errors import UsageError
from cloudtrain.readlimit import read_at_most


# Recipes and config travel between people and CI: bounded before any model sees them (issue 29).
MAX_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 100  # nesting of lists and mappings; PyYAML's composer recurses once per level
MAX_NODES = 100_000  # values after aliases are expanded (the "billion laughs" is ten lines)


class TooLarge(yaml.YAMLError):
    """A document past one of the bounds above; line is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Loader(yaml.SafeLoader):
    """SafeLoader whose bad dates are YAML errors with a line, not a bare ValueError from datetime,
    and which refuses alias expansion past MAX_NODES before constructing anything."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.alias_uses: list[tuple[yaml.Mark, str, yaml.Node]] = []  # where each alias is, in file order

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            self.alias_uses.append((event.start_mark, event.anchor, node))
            return node
        return super().compose_node(parent, index)

    def construct_document(self, node: yaml.Node) -> Any:
        if self.alias_uses:
            _refuse_expansion(node, self.alias_uses, self)
        return super().construct_document(node)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} looks like a date but is not one ({exc}); quote it if it is text",
                node.start_mark,
            ) from None

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """`<<` merges as the YAML spec has them: keys written in the mapping win, then a mapping
        earlier in `<<: [*a, *b]` wins over a later one.

        PyYAML 6.0.4 lets the *last* merged mapping win for keys of two or more characters (its
        merge-key DoS fix, yaml/pyyaml#937; the regression is yaml/pyyaml#953), so a recipe would
        load differently depending on the PyYAML a user has. Each key is kept once, so aliases that
        merge each other cannot blow the mapping up exponentially (the DoS that fix was for).
        """
        sources: list[yaml.MappingNode] = []
        written: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in merged:
                    if not isinstance(source, yaml.MappingNode):
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"expected a mapping or list of mappings for merging, but found {source.id}",
                            source.start_mark)
                    sources.append(source)
            else:
                if key_node.tag == "tag:yaml.org,2002:value":
                    key_node.tag = "tag:yaml.org,2002:str"
                written.append((key_node, value_node))
        if not sources:
            return
        seen = {_merge_identity(key) for key, _ in written}
        merged_pairs = []
        for source in sources:
            self.flatten_mapping(source)  # (a flattened mapping has no `<<` left: flattening it again is one pass)
            for key, value in source.value:
                identity = _merge_identity(key)
                if identity not in seen:
                    seen.add(identity)
                    merged_pairs.append((key, value))
        node.value = merged_pairs + written


def _merge_identity(key: yaml.Node) -> tuple:
    """How merged keys are told apart: a scalar by what it says, anything else by the node itself."""
    if isinstance(key, yaml.ScalarNode):
        return (key.tag, key.value)
    return ("node", id(key))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def _refuse_depth(text: str) -> None:
    """Raise TooLarge past MAX_DEPTH levels of nesting. PyYAML's parser keeps an explicit stack (its
    events cost no recursion), so this pass is safe where composing would hit RecursionError."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise TooLarge(event.start_mark.line + 1, f"nested more than {MAX_DEPTH} levels deep")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _refuse_expansion(root: yaml.Node, alias_uses: list[tuple[yaml.Mark, str, yaml.Node]], loader: _Loader) -> None:
    """Raise TooLarge, at the first alias that takes it there, if the document expands past MAX_NODES.

    Aliases share nodes, so composing stays small; what explodes is everything after (building the
    data, then validating it), which sees each alias expanded. Sizes are counted per distinct node
    with saturation at MAX_NODES + 1, so counting is linear in the file however big the expansion.
    `<<` merges are flattened first (each merged key counts once, as it will load). A node that
    contains itself counts as too large.
    """
    limit = MAX_NODES + 1
    order: list[yaml.Node] = []  # every distinct node, parents before children (document order)
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            loader.flatten_mapping(node)  # sources come earlier in the file: already flat, no deep recursion
        order.append(node)
        stack.extend(reversed(_children(node)))
    size: dict[int, int] = {}
    active: set[int] = set()
    for start in reversed(order):  # children first, mostly; the explicit walk below covers the rest
        work = [(start, False)]
        while work:
            node, expanded = work.pop()
            if id(node) in size:
                continue
            if expanded:
                active.discard(id(node))
                total = 1 + sum(size.get(id(c), limit) for c in _children(node))
                size[id(node)] = min(total, limit)
                continue
            if id(node) in active:
                size[id(node)] = limit  # a node that contains itself would expand forever
                continue
            active.add(id(node))
            work.append((node, True))
            work.extend((c, False) for c in _children(node) if id(c) not in size)
    if size[id(root)] < limit:
        return
    for mark, anchor, target in alias_uses:
        if size.get(id(target), limit) >= limit:
            raise TooLarge(mark.line + 1, f"alias *{anchor} expands the document past {MAX_NODES} values"
                                          " (or contains itself)")
    mark, anchor, _ = max(alias_uses, key=lambda use: size.get(id(use[2]), 0))
    raise TooLarge(mark.line + 1, f"aliases expand the document past {MAX_NODES} values (the largest is *{anchor})")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def read_yaml(path: Path, error_cls: type[UsageError]) -> tuple[Any, yaml.Node | None, str]:
    """Return (data, node tree, raw text); raise error_cls with file:line:col on syntax errors."""
    try:
        with path.open("rb") as handle:
            raw = read_at_most(handle, MAX_BYTES)
        if len(raw) > MAX_BYTES:
            raise error_cls(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not read as YAML")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise error_cls(f"{path}: file not found", hint="check the path") from None
    except IsADirectoryError:
        raise error_cls(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error_cls(f"{path}: cannot read: {exc}") from None
    try:
        _refuse_depth(text)
        node = yaml.compose(text, Loader=_Loader)
        if node is not None:
            _refuse_duplicate_keys(node, path, error_cls)
        # Loaded from the text again rather than from `node`: constructing flattens `<<` merges into
        # the node tree, and line_of() must see the keys as the user wrote them.
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except TooLarge as exc:
        raise error_cls(f"{path}:{exc.line}: refused: {exc.message}",
                        hint="aliases and nesting are bounded so a hostile file cannot exhaust memory") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error_cls(f"{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise error_cls(f"{path}: YAML error: {exc}") from None
    return data, node, text


_MERGE_TAG = "tag:yaml.org,2002:merge"
# How many problems of one file an error shows, each on its own line with file:line.
MAX_PROBLEMS = 5


def _refuse_duplicate_keys(root: yaml.Node, path: Path, error_cls: type[UsageError]) -> None:
    """Raise error_cls naming the first key (in file order) that repeats within one mapping, at any depth.

    PyYAML keeps the last of two equal keys without a word, so a second `run:` silently replaces
    the first. Keys are compared by the value they load as (`1` and `0x1` are the same key), the
    way the loaded dict would collide them. Keys that arrive through a `<<` merge are not
    compared: overriding a merged key is what merges are for.
    """
    key_loader = _Loader("")  # only its constructor is used, to resolve scalar keys to values
    duplicates: list[tuple[yaml.Node, yaml.Node, str]] = []  # (first, again, field path of the mapping)
    try:
        seen: set[int] = set()  # an anchored node appears once per alias; check it once
        stack: list[tuple[yaml.Node, str]] = [(root, "")]
        while stack:
            node, where = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                first: dict[Any, yaml.Node] = {}
                for key, value in node.value:
                    identity = _key_identity(key, key_loader)
                    if identity is not None and identity in first:
                        duplicates.append((first[identity], key, where))
                    elif identity is not None:
                        first[identity] = key
                    stack.append((value, _join(where, key.value if isinstance(key, yaml.ScalarNode) else "?")))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend((item, _join(where, str(i))) for i, item in enumerate(node.value))
    finally:
        key_loader.dispose()
    if not duplicates:
        return
    # The walk is depth-first; the user reads top-down, so report the repeats in file order.
    duplicates.sort(key=lambda d: (d[1].start_mark.line, d[1].start_mark.column))
    lines = [_duplicate_message(path, where, first_key, again) for first_key, again, where in duplicates[:MAX_PROBLEMS]]
    more = len(duplicates) - MAX_PROBLEMS
    if more > 0:
        lines[-1] += f" (and {more} more duplicate key{'s' if more > 1 else ''})"
    hint = (
        "merge several mappings with `<<: [*a, *b]`"
        if any(again.tag == _MERGE_TAG for _, again, _ in duplicates)
        else "delete one of them: YAML would silently keep only the last"
    )
    raise error_cls("\n".join(lines), hint=hint)


def _key_identity(key: yaml.Node, loader: _Loader) -> Any:
    """What a key loads as, or None for keys the duplicate check leaves to the loader."""
    if not isinstance(key, yaml.ScalarNode):
        # A list or mapping as a key cannot load at all (unhashable); safe_load reports that itself.
        return None
    if key.tag == _MERGE_TAG:
        return ("<<",)  # a tuple cannot collide with any scalar value
    try:
        value = loader.construct_object(key, deep=True)
    except yaml.constructor.ConstructorError:
        # A key the safe loader refuses (e.g. a !!python tag): safe_load raises the proper error next.
        return None
    # By value, as the dict the loader builds sees them: `true`, `1` and `1.0` are all the key True.
    return value


def _duplicate_message(path: Path, where: str, first: yaml.Node, again: yaml.Node) -> str:
    line, first_line = again.start_mark.line + 1, first.start_mark.line + 1
    spelled = "" if first.value == again.value else f" as {first.value!r}"
    field = f"{where}: " if where else ""
    return f"{path}:{line}: {field}duplicate key {again.value!r} (first at line {first_line}{spelled})"


def _join(where: str, part: str) -> str:
    return f"{where}.{part}" if where else part


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) of `part` under `node`, looking into `<<` merges too; (None, None) if absent."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if getattr(key, "value", None) == part and key.tag != _MERGE_TAG:
                return key, value
        for key, value in node.value:
            if key.tag == _MERGE_TAG:
                merged = value.value if isinstance(value, yaml.SequenceNode) else [value]
                for source in merged:
                    _, found = _child(source, part)
                    if found is not None:
                        return None, found
        return None, None
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return None, node.value[part]
    return None, None


def _depth_found(node: yaml.Node | None, loc: Sequence[str | int]) -> int:
    """How many leading parts of `loc` exist in the YAML tree."""
    for depth, part in enumerate(loc):
        _, node = _child(node, part)
        if node is None:
            return depth
    return len(loc)


def line_of(node: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """1-based line of the deepest YAML node on the path `loc` that exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        key, child = _child(node, part)
        if child is None:
            break
        line = ((key or child).start_mark.line) + 1
        node = child
    return line


def did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def format_validation_error(path: Path, node: yaml.Node | None, exc: Any, model: type) -> str:
    """One line per problem (up to MAX_PROBLEMS, in file order): `file:line: field.path: what was expected`."""
    problems = validation_problems(path, node, exc, model)
    lines = [text for _, text in problems[:MAX_PROBLEMS]]
    more = len(problems) - MAX_PROBLEMS
    if more > 0:
        lines[-1] += f" (and {more} more problem{'s' if more > 1 else ''})"
    return "\n".join(lines)


def validation_problems(path: Path, node: yaml.Node | None, exc: Any, model: type) -> list[tuple[int, str]]:
    """(line, message) for every distinct problem pydantic found, sorted by line.

    A value that fails every member of a union (`str | int | float | bool`) is one problem, not one
    per member; a required field reported missing only because its key is misspelt is left out
    (the typo, with its did-you-mean, explains both).
    """
    errors = exc.errors(include_url=False)
    located: list[tuple[tuple[str | int, ...], dict[str, Any]]] = []
    for error in errors:
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if error["type"] not in ("missing", "extra_forbidden") and node is not None:
            loc = loc[:max(_depth_found(node, loc), 1 if loc else 0)]  # drop union-member tags ('str', 'int')
        located.append((loc, error))
    typos = set()
    for loc, error in located:
        if error["type"] == "extra_forbidden" and loc:
            close = difflib.get_close_matches(str(loc[-1]), _fields_at(model, loc), n=1, cutoff=0.6)
            if close:
                typos.add((*loc[:-1], close[0]))
    # Type errors at one place are the members of a union refusing one value: merged. Anything
    # else (two validators objecting to one mapping, say) stays a problem of its own.
    grouped: dict[tuple[Any, ...], tuple[tuple[str | int, ...], list[dict[str, Any]]]] = {}
    for index, (loc, error) in enumerate(located):
        if error["type"] == "missing" and loc in typos:
            continue
        merge = error["type"].endswith(("_type", "_parsing"))
        grouped.setdefault((loc, "type") if merge else (loc, index), (loc, []))[1].append(error)
    problems = []
    for order, (loc, group) in enumerate(grouped.values()):
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = line_of(node, loc)
        where = f"{path}:{line}" if line else str(path)
        message = _describe(group[0], loc, model) if len(group) == 1 else _describe_union(group)
        text = f"{where}: {message}" if message.startswith((field + " ", field + ".")) else f"{where}: {field}: {message}"
        problems.append((line or 0, order, text))
    problems.sort(key=lambda p: (p[0], p[1]))
    return [(line, text) for line, _, text in problems]


def _describe_union(group: list[dict[str, Any]]) -> str:
    """Several failures for one value (every member of a union refused it): one message."""
    wanted = []
    for error in group:
        msg = error["msg"]
        wanted.append(msg.removeprefix("Input should be ") if msg.startswith("Input should be ") else msg[0].lower() + msg[1:])
    unique = list(dict.fromkeys(wanted))
    expected = ", ".join(unique[:-1]) + f" or {unique[-1]}" if len(unique) > 1 else unique[0]
    got = group[0].get("input")
    shown = f"{got!r}" if isinstance(got, (str, int, float, bool)) else type(got).__name__
    return f"input should be {expected}, got {shown}"


def _fields_at(model: type, loc: Sequence[str | int]) -> list[str]:
    """Field names of the model that owns the last element of loc (for did-you-mean)."""
    from pydantic import BaseModel

    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = _inner_model(current.model_fields[part].annotation)
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _describe(error: dict[str, Any], loc: Sequence[str | int], model: type) -> str:
    kind = error["type"]
    got = error.get("input")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else "?"
        fields = _fields_at(model, loc)
        hint = did_you_mean(name, fields)
        expected = f"expected one of: {', '.join(fields)}" if fields else "unknown key"
        return f"unknown key {name!r}; " + (hint or expected)
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        hint = did_you_mean(str(got), [e.strip(" '") for e in expected.replace(" or ", ", ").split(",")])
        return f"expected one of {expected}, got {got!r}" + (f"; {hint}" if hint else "")
    if kind == "missing":
        return "required field is missing"
    msg = error["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in ("value_error", "assertion_error"):
        return msg
    msg = msg[0].lower() + msg[1:]
    if not isinstance(got, (str, int, float, bool)):
        return msg
    # pydantic sometimes says what it got already ("got a number with a fractional part"): no second "got".
    return f"{msg} ({got!r})" if " got " in f" {msg}" else f"{msg}, got {got!r}"
