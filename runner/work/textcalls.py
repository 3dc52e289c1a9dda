"""Tool calls a model wrote as text instead of through the protocol's `tool_calls`.

Small open models (and sometimes strong ones) put a call in their message content: a `<tool_call>`
block, a fenced ```json block, or a bare object, often with single quotes, Python's True/None or a
trailing comma that a JSON parser refuses. `find_calls` recognises what is plainly a call of one of
the goal's tools: an object with a known `name` and an `arguments` (or `parameters`) object, or a
list of such objects, or (given the tools' parameter names) a tagged or fenced block of nothing but
Python-style calls, `write_file("total.txt", "41")`. Anything else, an unknown tool name above all, is
not a call; `unknown_calls` names the invented tools of such a reply, so the model can be told they do
not exist.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_CALL_TAGS = re.compile(r"<(tool_call|tool_response|tool_code|function_call)>\s*(.*?)\s*(?:</\1>|$)", re.S)
"""Tags small models put around calls written as code."""
_FENCED = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*?)(?:\n```|$)", re.S)
_OPENING = re.compile(r"[\[{](?=\s*[\"'{])")
"""Where a bare object (or list of objects) may start: a bracket before a quoted key or an object."""
_PY_NAMES = {"true": "True", "false": "False", "null": "None"}


MAX_CONTENT = 200_000
"""Longer replies are not searched for calls."""
MAX_BARE = 50
"""Bare objects of one reply tried as calls, in order."""


@dataclass
class TextCall:
    """One call found in the text: a known tool name and its arguments, encoded as JSON."""

    name: str
    arguments: str


def find_calls(content: str | None, names: Collection[str]) -> list[TextCall]:
    """The tool calls written in `content`, if it holds any call of a tool in `names`; else [].

    `names` may map each tool to its parameter names in order: then a block (tagged or fenced) that is
    nothing but Python-style calls, `write_file("total.txt", "41")`, is read as calls too.
    """
    if not content or len(content) > MAX_CONTENT or not any(name in content for name in names):
        return []
    for candidate in _candidates(content):
        calls = _as_calls(_loads(candidate), names)
        if calls:
            return calls
    if isinstance(names, Mapping):
        blocks = [body for _tag, body in _CALL_TAGS.findall(content)] + _FENCED.findall(content) + [content]
        for block in blocks:
            calls = _python_calls(block, names)
            if calls:
                return calls
    return []


def _python_calls(block: str, parameters: Mapping[str, Any]) -> list[TextCall]:
    """`name(arg, key=arg)` lines of known tools with literal arguments; [] unless the block is only that."""
    try:
        tree = ast.parse(block.strip(), mode="exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    calls: list[TextCall] = []
    for statement in tree.body:
        node = statement.value if isinstance(statement, ast.Expr) else None
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in parameters):
            return []
        order = list(parameters[node.func.id] or [])
        if len(node.args) > len(order) or any(k.arg is None for k in node.keywords):
            return []
        try:
            arguments = {order[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
            arguments.update({str(k.arg): ast.literal_eval(k.value) for k in node.keywords})
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return []
        calls.append(TextCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return calls


def unknown_calls(content: str | None, names: Collection[str]) -> list[str]:
    """The tool names of what is plainly a call written as text (`name` and an `arguments` object) of a tool
    that is not in `names`: a model that invented a tool. [] when there is none."""
    if not content or len(content) > MAX_CONTENT or '"name"' not in content.replace("'", '"'):
        return []
    for candidate in _candidates(content):
        value = _loads(candidate)
        items = value if isinstance(value, list) else [value]
        invented = [name for item in items if (name := _called_name(item)) is not None and name not in names]
        if invented:
            return list(dict.fromkeys(invented))
    return []


def _called_name(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict) and "name" not in item:
        item = item["function"]
    name, arguments = item.get("name"), item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or not isinstance(arguments, dict):
        return None
    return name


def _candidates(content: str) -> Iterator[str]:
    """Tagged blocks first, then fenced blocks, then every balanced {...} or [...] in the text."""
    tagged = _TAGGED.findall(content)
    if tagged:
        yield _joined(tagged)
    fenced = _FENCED.findall(content)
    if fenced:
        yield _joined(fenced)
    starts = {m.start() for m in _OPENING.finditer(content)}
    bare = [(start, end) for start, end in _bracketed(content) if start in starts]
    for start, end in sorted(bare)[:MAX_BARE]:
        yield content[start:end]


def _joined(blocks: list[str]) -> str:
    """Several blocks of one reply: one object each -> one list of them."""
    return blocks[0] if len(blocks) == 1 else "[" + ",".join(blocks) + "]"


def _bracketed(text: str) -> list[tuple[int, int]]:
    """(start, end) of every balanced {...} and [...] in one pass; quotes of either kind count inside brackets."""
    spans: list[tuple[int, int]] = []
    opened: list[int] = []
    quote, escaped = "", False
    for i, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'" and opened:
            quote = char
        elif char in "{[":
            opened.append(i)
        elif char in "}]" and opened:
            spans.append((opened.pop(), i + 1))
    return spans


def _loads(text: str) -> Any:
    """JSON, else a Python literal (single quotes, True/None, trailing commas, true/false/null); None if neither."""
    text = text.strip()
    try:
        return json.JSONDecoder(strict=False).decode(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(_python_names(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, tokenize.TokenError):
        return None


def _python_names(text: str) -> str:
    """`true`/`false`/`null` outside strings -> True/False/None, so ast.literal_eval reads JSON-ish text."""
    tokens = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string in _PY_NAMES:
            token = token._replace(string=_PY_NAMES[token.string])
        tokens.append(token)
    return tokenize.untokenize(tokens)


def _as_calls(value: Any, names: Collection[str]) -> list[TextCall]:
    """One call object or a list of them; [] unless every item is a call of a known tool."""
    items = value if isinstance(value, list) else [value]
    calls = [_as_call(item, names) for item in items]
    if not calls or any(call is None for call in calls):
        return []
    return [call for call in calls if call is not None]


def _as_call(item: Any, names: Collection[str]) -> TextCall | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict) and "name" not in item:  # {"type": "function", "function": {...}}
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        arguments = _loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return TextCall(name, json.dumps(arguments, ensure_ascii=False))
