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


class _Loader(yaml.SafeLoader):
    """SafeLoader whose bad dates are YAML errors with a line, not a bare ValueError from datetime."""

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except ValueError as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} looks like a date but is not one ({exc}); quote it if it is text",
                node.start_mark,
            ) from None


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_timestamp)


def read_yaml(path: Path, error_cls: type[UsageError]) -> tuple[Any, yaml.Node | None, str]:
    """Return (data, node tree, raw text); raise error_cls with file:line:col on syntax errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error_cls(f"{path}: file not found", hint="check the path") from None
    except IsADirectoryError:
        raise error_cls(f"{path}: is a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error_cls(f"{path}: cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=_Loader)
        if node is not None:
            _refuse_duplicate_keys(node, path, error_cls)
        # Loaded from the text again rather than from `node`: constructing flattens `<<` merges into
        # the node tree, and line_of() must see the keys as the user wrote them.
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error_cls(f"{where}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise error_cls(f"{path}: YAML error: {exc}") from None
    return data, node, text


_MERGE_TAG = "tag:yaml.org,2002:merge"


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
    # The walk is depth-first; the user reads top-down, so report the earliest repeat in the file.
    duplicates.sort(key=lambda d: (d[1].start_mark.line, d[1].start_mark.column))
    first_key, again, where = duplicates[0]
    more = len(duplicates) - 1
    message = _duplicate_message(path, where, first_key, again)
    if more:
        message += f" (and {more} more duplicate key{'s' if more > 1 else ''})"
    hint = (
        "merge several mappings with `<<: [*a, *b]`"
        if again.tag == _MERGE_TAG
        else "delete one of them: YAML would silently keep only the last"
    )
    raise error_cls(message, hint=hint)


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


def line_of(node: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """1-based line of the deepest YAML node on the path `loc` that exists."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = (key.start_mark.line if key is not None else match.start_mark.line) + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else None


def format_validation_error(path: Path, node: yaml.Node | None, exc: Any, model: type) -> str:
    """One line for the first pydantic error: file:line: field.path: what was expected."""
    errors = exc.errors(include_url=False)
    # A misspelt key also makes its intended field "missing": report the typo, it explains both.
    first = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    field = ".".join(str(p) for p in loc) or "(top level)"
    line = line_of(node, loc)
    where = f"{path}:{line}" if line else str(path)
    message = _describe(first, loc, model)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{where}: {field}: {message}{more}"


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
    return f"{msg[0].lower()}{msg[1:]}, got {got!r}" if isinstance(got, (str, int, float, bool)) else msg[0].lower() + msg[1:]
