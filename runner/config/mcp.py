"""The naming rules of MCP tools: which servers a run starts, which of their tools it offers, under what name.

(The `mcp:` blocks themselves are `McpServer` in `models`.) A server's tools reach the model as
`SERVER__TOOL`. Those names must be valid for every OpenAI-compatible provider (letters, digits, `_`
and `-`, at most 64 characters), and the part before the first `__` must name the server, so a server
name is letters, digits and `-`, joined by single `_`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

SEPARATOR = "__"
MAX_TOOL_NAME = 64
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SERVER_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")
EVERY_TOOL = "*"


def tool_name(server: str, tool: str) -> str:
    """The name the model sees: `SERVER__TOOL`."""
    return f"{server}{SEPARATOR}{tool}"


def name_problem(name: str) -> str | None:
    """Why `name` cannot be offered to a model, or None."""
    if len(name) > MAX_TOOL_NAME:
        return f"{name!r} is {len(name)} characters; a tool name is at most {MAX_TOOL_NAME}"
    if not TOOL_NAME.fullmatch(name):
        return f"{name!r} holds characters other than letters, digits, _ and -"
    return None


def check_servers(servers: dict[str, Any]) -> dict[str, Any]:
    """An `mcp:` block's server names, and its allow-lists as the names the model would see."""
    problems = []
    for name, server in servers.items():
        if not SERVER_NAME.fullmatch(name):
            problems.append(
                f"server name {name!r}: expected letters, digits and -, joined by single _ "
                f"(the model sees its tools as {name}{SEPARATOR}TOOL)"
            )
            continue
        for tool in server.tools or ():
            problem = name_problem(tool_name(name, tool))
            if problem:
                problems.append(f"{name}.tools: {problem}")
    if problems:
        raise ValueError("; ".join(problems))
    return servers


def is_mcp_tool(name: str) -> bool:
    """A `tools:` entry that names an MCP tool (`github__search_issues`) or a whole server (`github__*`)."""
    return SEPARATOR in name


def split(name: str) -> tuple[str, str]:
    """`github__search_issues` -> (`github`, `search_issues`)."""
    server, _, tool = name.partition(SEPARATOR)
    return server, tool


def check_tools(servers: Mapping[str, Any], referenced: Iterable[str], commands: Iterable[str]) -> None:
    """A goal's `tools:` against its servers: every `SERVER__TOOL` or `SERVER__*` names a declared server and
    is a valid name, and no command tool takes a name that one of the servers' tools would have.

    Raises ValueError with every problem, for the goal's validator.
    """
    problems = []
    for name in referenced:
        server, tool = split(name)
        if server not in servers:
            declared = f"servers: {', '.join(servers)}" if servers else "none does"
            problems.append(f"{name!r} names MCP server {server!r}, which no `mcp:` block declares ({declared})")
        elif tool != EVERY_TOOL and (problem := name_problem(name)):
            problems.append(problem)
        elif tool != EVERY_TOOL and servers[server].tools is not None and tool not in servers[server].tools:
            problems.append(f"{name!r}: {tool!r} is not in the `tools` allow-list of MCP server {server!r}")
    for name in commands:
        if is_mcp_tool(name) and split(name)[0] in servers:
            problems.append(
                f"command tool {name!r} clashes with the tools of MCP server {split(name)[0]!r} "
                f"(they are named {split(name)[0]}{SEPARATOR}TOOL); rename it"
            )
    if problems:
        raise ValueError("; ".join(problems))


def selection(servers: Mapping[str, Any], names: Iterable[str] | None) -> dict[str, set[str] | None]:
    """Which servers a goal starts and which of their tools it offers: server -> tool names (None: all allowed).

    `names` is the goal's `tools:` (None when it has none: every server, every allowed tool).
    """
    if names is None:
        return {server: None for server in servers}
    chosen: dict[str, set[str] | None] = {}
    for name in names:
        if not is_mcp_tool(name):
            continue
        server, tool = split(name)
        current = chosen.get(server, set())
        chosen[server] = None if tool == EVERY_TOOL or current is None else current | {tool}
    return chosen
