"""YAML with line numbers: load a file, expand ${VAR}, and turn validation errors into `file:line: field: ...`."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import yaml

from ..errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

Loc = tuple[Any, ...]
Elsewhere = Callable[[Loc], "tuple[Document, Loc] | None"]
"""Where a value at a place of a merged document was written, when not in this file at that place."""
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class Document:
    """One parsed YAML file: its data and the line of every key and list item."""

    path: Path
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)
    shown: str = ""

    def line(self, loc: Loc) -> int:
        """The line of the longest known prefix of `loc` (1 when nothing matches)."""
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return 1

    def problem(self, loc: Loc, message: str, elsewhere: Elsewhere | None = None) -> str:
        """`file:line: field: message`, in the file and at the place `elsewhere` names when the value came from
        another (a goal's field inherited from runner.yaml, a judge's from the model)."""
        source, at = (elsewhere(loc) if elsewhere else None) or (self, loc)
        return f"{source.shown}:{source.line(at)}: {dotted(at) or '(file)'}: {message}"

    def validate(
        self,
        model: type[BaseModel],
        data: Any = None,
        prefix: Loc = (),
        elsewhere: Elsewhere | None = None,
    ) -> Any:
        """Validate into `model`; every error becomes one `file:line: field: message` line.

        `prefix` is where `data` sits in the file, for an item of a list; `elsewhere` as in `problem`.
        """
        from pydantic import ValidationError  # here, not at the top: reading a file needs no pydantic

        try:
            return model.model_validate(self.data if data is None else data)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                problems.append(self.problem((*prefix, *error["loc"]), explain(error, model), elsewhere))
            raise ConfigError("invalid", problems) from None


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def explain(error: Any, model: type[BaseModel] | None = None) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return unknown_field(error["loc"], model)
    if kind == "missing":
        return "required field is missing"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if (
        "input" in error
        and kind not in ("value_error", "assertion_error")
        and not isinstance(error["input"], (dict, list))
    ):
        message += f" (got {error['input']!r})"
    return message


LOADER_FIELDS = {"root", "source", "id"}
"""Fields the loader sets; never suggested to a user."""


def unknown_field(loc: Loc, model: type[BaseModel] | None) -> str:
    """`unknown field; did you mean `max_attempts`?`, or the valid names when none is close."""
    names = sorted(set(_fields_at(model, loc[:-1])) - LOADER_FIELDS) if model else []
    if not names or not isinstance(loc[-1], str):
        return "unknown field"
    close = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean `{close[0]}`?"
    return f"unknown field (expected one of: {', '.join(names)})"


def _fields_at(model: Any, loc: Loc) -> list[str]:
    """The field names of the pydantic model found at `loc` inside `model` (none when it is not a model)."""
    for part in loc:
        if isinstance(part, str):
            field = getattr(model, "model_fields", {}).get(part)
            if field is None:
                return []
            model = _model_in(field.annotation)
    return list(getattr(model, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds: `X`, `X | None`, `list[X]`, `dict[str, X]`, `Annotated[...]`."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


YAML_HINTS = (
    ("mapping values are not allowed", "a value holding `: ` needs quotes, or this line is indented too far"),
    ("cannot start any token", "indent with spaces, not tabs; quote a value starting with @ or `"),
    ("expected <block end>", "this line's indentation does not match the lines above"),
    ("could not find expected ':'", "a key needs `key: value`; a value over several lines needs `|`"),
    ("did not find expected key", "this line's indentation does not match the lines above"),
    ("did not find expected '-'", "items of one list need the same indentation"),
    ("end of stream", "a quote, bracket or brace is not closed"),
    ("but got", "a bracket or brace is not closed, or an item lacks a comma"),
    ("undefined alias", "a value starting with * needs quotes"),
)


def yaml_problem(shown: str, exc: yaml.YAMLError) -> str:
    """PyYAML's error as one line: `file:line: invalid YAML: what (hint)`."""
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark else 1
    reason = (getattr(exc, "problem", None) or str(exc)).strip().splitlines()[0]
    hint = next((h for key, h in YAML_HINTS if key in reason), "check the indentation and quoting of this line")
    return f"{shown}:{line}: invalid YAML: {reason} (hint: {hint})"


def read_yaml(path: Path, root: Path | None = None, environ: dict[str, str] | None = None) -> Document:
    """Read and parse a YAML file, expanding ${VAR} and ${VAR:-default} in every string."""
    shown = _shown(path, root)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: not UTF-8 text") from None
    screen_yaml(text, shown)
    try:  # the screen stops at a syntax error; a control character after it is refused here
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise ConfigError(_control_character(shown, text, exc)) from None
    try:
        node = loader.get_single_node()
        data = _construct(loader, node, shown)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(shown, exc)) from None
    finally:
        loader.dispose()
    doc = Document(path=path, data=data, shown=shown)
    if node is not None:
        _index(node, (), doc.lines)
    doc.data = _expand(doc, data, (), os.environ if environ is None else environ)
    return doc


MAX_BYTES = 256 * 1024
"""A goal, schedule or runner.yaml file larger than this is refused before parsing (PyYAML reads ~50 KB/s of
the worst text; a prompt this long would be ~60k tokens)."""
MAX_DEPTH = 100
"""Nesting deeper than this is refused (PyYAML and the validators recurse; configs need a handful of levels)."""
MAX_NODES = 100_000
"""Values in a document once its aliases are expanded: bounds an alias bomb before anything is built."""
_LONG_INTEGER = re.compile(r"[-+]?[0-9][0-9_:]{999,}")


def screen_yaml(text: str, shown: str) -> None:
    """Refuse, before anything is built, what would hang or exhaust the loader: a huge file, control
    characters, nesting beyond MAX_DEPTH, recursive aliases, an alias bomb, an integer too long to convert.

    One pass over the parser's events (libyaml's where installed; PyYAML's parser is iterative, its composer
    and constructor recurse).
    A syntax error is left to the loader, which reports it with its line.
    """
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{shown}: the file is larger than {MAX_BYTES:,} bytes; a configuration file is small")
    _screen_brackets(text, shown)
    sizes: dict[str, int] = {}
    open_nodes: list[list[Any]] = []  # [anchor, values so far] of each collection being read
    total = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            line = event.start_mark.line + 1 if event.start_mark else 1
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                open_nodes.append([event.anchor, 1])
                if len(open_nodes) > MAX_DEPTH:
                    raise ConfigError(f"{shown}:{line}: nested deeper than {MAX_DEPTH} levels")
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, count = open_nodes.pop()
                if anchor is not None:
                    sizes[anchor] = count
            elif isinstance(event, yaml.AliasEvent):
                if any(anchor == event.anchor for anchor, _ in open_nodes):
                    raise ConfigError(f"{shown}:{line}: the alias *{event.anchor} refers to itself (a recursive alias)")
                count = sizes.get(event.anchor, 1)
                total += count
            elif isinstance(event, yaml.ScalarEvent):
                if event.style is None and _LONG_INTEGER.fullmatch(event.value):
                    raise ConfigError(f"{shown}:{line}: an integer of {len(event.value):,} digits is too long")
                count = 1
                total += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            else:
                continue
            if total > MAX_NODES:
                raise ConfigError(f"{shown}:{line}: more than {MAX_NODES:,} values once aliases are expanded")
            if open_nodes:
                open_nodes[-1][1] += count
    except yaml.reader.ReaderError as exc:
        raise ConfigError(_control_character(shown, text, exc)) from None
    except yaml.YAMLError:
        return


def _control_character(shown: str, text: str, exc: yaml.reader.ReaderError) -> str:
    line = text.count("\n", 0, exc.position) + 1
    return (
        f"{shown}:{line}: the control character U+{exc.character:04X} is not allowed in YAML "
        "(inside double quotes, write it as an escape such as \\t)"
    )


_BRACKETS = re.compile(r"[\[\]{}\n]")


def _screen_brackets(text: str, shown: str) -> None:
    """Refuse flow nesting (`[[[[...`, `{{{{...`) deeper than MAX_DEPTH before PyYAML's scanner sees it: the
    scanner's look-ahead over open flow levels takes quadratic time (1,200 brackets take seconds).

    Brackets inside quotes and comments count too: no configuration holds a hundred unclosed ones.
    """
    depth, line = 0, 1
    for match in _BRACKETS.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"{shown}:{line}: nested deeper than {MAX_DEPTH} levels")
        else:
            depth = max(depth - 1, 0)


def _construct(loader: yaml.SafeLoader, node: yaml.Node | None, shown: str) -> Any:
    """The Python data of a node; a value PyYAML cannot convert (a date like 2024-13-45) is bad input at
    its line, not a traceback."""
    if node is None:
        return None
    try:
        return loader.construct_document(node)
    except (ValueError, OverflowError, TypeError) as exc:
        raise ConfigError(f"{shown}:{_unreadable_line(loader, node)}: a value cannot be read: {exc}") from None


def _unreadable_line(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    """The line of the first scalar that PyYAML's constructors fail on (the document is screened: bounded)."""
    pending, seen = [node], set()
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, yaml.ScalarNode):
            try:
                loader.construct_object(item)
            except (ValueError, OverflowError, TypeError):
                return item.start_mark.line + 1
        elif isinstance(item, yaml.SequenceNode):
            pending.extend(reversed(item.value))
        elif isinstance(item, yaml.MappingNode):
            pending.extend(v for pair in reversed(item.value) for v in reversed(pair))
    return node.start_mark.line + 1


def _shown(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(path.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(path)


def _index(node: yaml.Node, loc: Loc, lines: dict[Loc, int]) -> None:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                lines[(*loc, key.value)] = key.start_mark.line + 1
                _index(value, (*loc, key.value), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(item, (*loc, i), lines)


def _expand(doc: Document, value: Any, loc: Loc, environ: Any) -> Any:
    if isinstance(value, str):
        return _expand_string(doc, value, loc, environ)
    if isinstance(value, dict):
        return {k: _expand(doc, v, (*loc, k), environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(doc, v, (*loc, i), environ) for i, v in enumerate(value)]
    return value


def _expand_string(doc: Document, text: str, loc: Loc, environ: Any) -> str:
    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(doc.problem(loc, f"environment variable {name} is not set (use ${{{name}:-default}})"))

    return _VAR.sub(substitute, text) if "${" in text else text
