"""YAML with line numbers: load a file, expand ${VAR}, and turn validation errors into `file:line: field: ...`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import ConfigError

Loc = tuple[Any, ...]
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

    def problem(self, loc: Loc, message: str) -> str:
        return f"{self.shown}:{self.line(loc)}: {dotted(loc) or '(file)'}: {message}"

    def validate(self, model: type[BaseModel], data: Any = None, prefix: Loc = ()) -> Any:
        """Validate into `model`; every error becomes one `file:line: field: message` line.

        `prefix` is where `data` sits in the file, for an item of a list.
        """
        try:
            return model.model_validate(self.data if data is None else data)
        except ValidationError as exc:
            problems = [self.problem((*prefix, *e["loc"]), explain(e)) for e in exc.errors()]
            raise ConfigError("invalid", problems) from None


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def explain(error: Any) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        return "unknown field"
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


def read_yaml(path: Path, root: Path | None = None, environ: dict[str, str] | None = None) -> Document:
    """Read and parse a YAML file, expanding ${VAR} and ${VAR:-default} in every string."""
    shown = _shown(path, root)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{shown}: not UTF-8 text") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        reason = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{shown}:{line}: invalid YAML: {reason}") from None
    finally:
        loader.dispose()
    doc = Document(path=path, data=data, shown=shown)
    if node is not None:
        _index(node, (), doc.lines)
    doc.data = _expand(doc, data, (), os.environ if environ is None else environ)
    return doc


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
