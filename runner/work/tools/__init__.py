"""The agent's tools: the six built-ins and command tools from YAML, behind one `Toolbox`.

`Toolbox.call` never raises for anything the model caused: bad JSON, an unknown tool, arguments that
fail the schema, a timeout or an exception all come back as the tool's result text.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ...config import BUILTIN_TOOLS, Goal, ToolEntry
from ...config.mcp import is_mcp_tool
from . import files
from .mcp import open_servers
from .paths import PathGuard, ToolError
from .process import cap, run_process, scrub_env
from .sandbox import Jail

SHELL_TIMEOUT = 120.0
SHELL_MAX_TIMEOUT = 600.0
READ_ONLY = ("read_file", "list_files", "search_files")
"""The built-ins that change nothing: every other tool (the shell, command tools, MCP tools) may write."""


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[..., Awaitable[str]]
    _validator: Any = None
    writes: bool = True
    """False only for the read-only built-ins."""

    @property
    def schema(self) -> dict[str, Any]:
        return _schema(self.name, self.description, self.parameters)

    def validate(self, arguments: Any) -> str | None:
        """The first schema violation, in words, or None."""
        if self._validator is None:
            import jsonschema

            self._validator = jsonschema.Draft202012Validator(self.parameters)
        error = next(iter(self._validator.iter_errors(arguments)), None)
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message


class Toolbox:
    """The tools one goal may use, confined to its workdir."""

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema for t in tools]
        self.parameters = {t.name: list((t.parameters.get("properties") or {}).keys()) for t in tools}
        """Each tool's parameter names in the order its schema lists them."""

    @classmethod
    def for_goal(cls, goal: Goal, env: dict[str, str] | None = None, jail: Jail | None = None) -> Toolbox:
        box = PathGuard.for_goal(goal)
        environ = scrub_env(goal.env, env)
        jail = jail or Jail.for_goal(goal)
        return cls([_build(entry, box, environ, jail) for entry in _local(goal)])

    @staticmethod
    def schemas_of(goal: Goal) -> list[dict[str, Any]] | None:
        """The schemas the goal's opened toolbox will show the model, known before it opens (nothing started,
        nothing jailed); None when the goal has MCP servers, whose tools are known once they run."""
        if goal.mcp:
            return None
        return [_schema(entry.name, *_spec(entry)) for entry in _local(goal)]

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, goal: Goal) -> AsyncIterator[Toolbox]:
        """The goal's tools for one run; whatever they started for it is stopped when the run leaves.

        The goal's MCP servers start here, all at once (`McpError` naming the one that cannot), and their
        tools join the built-ins as SERVER__TOOL; they are closed, process groups and all, on the way out.
        """
        chosen = None if goal.tools is None else [entry.name for entry in goal.tools]
        jail = Jail.for_goal(goal)
        async with open_servers(goal.mcp, chosen, goal.workpath, jail.prefix if goal.mcp else ()) as remote:
            local = cls.for_goal(goal, jail=jail).tools.values()
            yield cls([*local, *(Tool(t.name, t.description, t.parameters, t.run, t.validator()) for t in remote)])

    def writes(self, name: str) -> bool:
        """Whether calling `name` may change a file (an unknown name is refused without running)."""
        tool = self.tools.get(name)
        return tool is not None and tool.writes

    async def call(self, name: str, raw_arguments: str) -> str:
        tool = self.tools.get(name)
        if tool is None:
            return f"error: unknown tool {name!r}; available tools: {', '.join(self.tools)}"
        try:
            arguments = json.loads(raw_arguments or "{}")
        except ValueError as exc:
            return (
                f"error: the arguments of {name} are not valid JSON ({exc.msg} at position {exc.pos}); "
                "send a JSON object"
            )
        problem = tool.validate(arguments)
        if problem is not None:
            return f"error: invalid arguments for {name}: {problem}"
        try:
            return await tool.run(**arguments)
        except ToolError as exc:
            return f"error: {exc}"
        except Exception as exc:
            return f"error: {name} failed: {type(exc).__name__}: {exc}"


def _local(goal: Goal) -> list[ToolEntry]:
    """The goal's built-in and command tools, in the order it lists them (all six built-ins by default)."""
    entries = goal.tools if goal.tools is not None else [ToolEntry(name=n) for n in BUILTIN_TOOLS]
    return [entry for entry in entries if not is_mcp_tool(entry.name)]


def describe_call(name: str, raw_arguments: str) -> str:
    """A one-line summary of a call for people: `shell: pytest -q`, `write_file: haiku.txt`."""
    try:
        args = json.loads(raw_arguments or "{}")
    except ValueError:
        return f"{name}: (invalid JSON)"
    if not isinstance(args, dict):
        return name
    main = args.get("command") or args.get("path") or args.get("pattern")
    if main is None and args:
        main = json.dumps(args, ensure_ascii=False)
    text = str(main or "").splitlines()[0] if main else ""
    return f"{name}: {text[:80]}" if text else name


def _build(entry: ToolEntry, box: PathGuard, environ: dict[str, str], jail: Jail) -> Tool:
    description, parameters = _spec(entry)
    if entry.run is not None:
        return Tool(entry.name, description, parameters, partial(_run_command, entry, box, environ, jail))
    if entry.name == "shell":
        return Tool("shell", description, parameters, partial(_run_shell, box, environ, jail))
    sync = getattr(files, entry.name)

    async def run(**arguments: Any) -> str:
        return await files.off_loop(sync, box, **arguments)

    return Tool(entry.name, description, parameters, run, writes=entry.name not in READ_ONLY)


SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "a /bin/sh command, run in the working directory"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "seconds; default 120"},
    },
    "required": ["command"],
}


def _schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _spec(entry: ToolEntry) -> tuple[str, dict[str, Any]]:
    """A local tool's description and parameters, as the model sees them."""
    if entry.run is not None:
        return entry.description or entry.name, entry.parameters
    if entry.name == "shell":
        return "Run a shell command in the working directory; returns its exit code and output.", SHELL_PARAMETERS
    description, properties, required = files.SCHEMAS[entry.name]
    return description, {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


async def _run_shell(
    box: PathGuard, environ: dict[str, str], jail: Jail, command: str, timeout: float = SHELL_TIMEOUT
) -> str:
    timeout = min(timeout, SHELL_MAX_TIMEOUT)
    result = await run_process(command, cwd=box.workdir, env=environ, timeout=timeout, jail=jail.prefix)
    return result.describe(timeout)


async def _run_command(entry: ToolEntry, box: PathGuard, environ: dict[str, str], jail: Jail, **arguments: Any) -> str:
    payload = json.dumps(arguments).encode()
    result = await run_process(
        entry.run or "", cwd=box.workdir, env=environ, timeout=entry.timeout, stdin=payload, jail=jail.prefix
    )
    if result.timed_out or result.exit_code != 0:
        return f"error: {entry.name} {result.describe(entry.timeout)}"
    return cap(result.output)
