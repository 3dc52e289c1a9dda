"""Tools from MCP servers, on the official `mcp` SDK: started once per run, closed after it.

    open_servers(goal) -> start every chosen server (stdio or streamable HTTP), initialize, list its tools
                       -> McpTool per offered tool (`SERVER__TOOL`, the server's own schema)
                       -> on exit: close the sessions, kill each stdio server's process group

A server that cannot start, initialize or list its tools raises `McpError` naming it and the reason,
before any model call. Once started, nothing a server does raises: a call that fails, times out or
reaches a server that died is the tool's result text, capped like every other tool's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config.mcp import name_problem, selection, tool_name
from ...config.models import McpServer
from ...errors import McpError
from .process import announce, cap, scrub_env, start_gated

EXIT_GRACE = 1.0
"""Seconds a stdio server has to exit once its stdin is closed, before its process group is killed."""
STDERR_TAIL = 2_000
"""Bytes of a stdio server's stderr kept to explain why it failed."""
MAX_PAGES = 100
"""tools/list pages read from one server, so a server that paginates forever cannot hang a run."""


@dataclass
class McpTool:
    """One tool a server offers, under the name the model sees."""

    name: str
    description: str
    parameters: dict[str, Any]
    server: McpConnection
    remote_name: str

    async def run(self, **arguments: Any) -> str:
        return await self.server.call(self.remote_name, arguments)

    def validator(self) -> Any:
        """A validator of the arguments against the server's schema; a schema jsonschema cannot use is left
        to the server to enforce rather than failing every call."""
        import jsonschema

        try:
            jsonschema.Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError:
            return jsonschema.Draft202012Validator({})
        return jsonschema.Draft202012Validator(self.parameters)


@asynccontextmanager
async def open_servers(
    servers: Mapping[str, McpServer], tool_names: list[str] | None, workdir: Path, jail: Sequence[str] = ()
) -> AsyncIterator[list[McpTool]]:
    """Start the servers a goal uses, all at once; yield their tools; close them all when done.

    `tool_names` is the goal's `tools:` (None: every server, every allowed tool); `jail` is the argv
    prefix of the goal's sandbox, under which stdio servers run.
    """
    async with _running(servers, tool_names, workdir, jail) as offered:
        yield [tool for _, tools in offered for tool in tools]


async def survey(
    servers: Mapping[str, McpServer], tool_names: list[str] | None, workdir: Path, jail: Sequence[str] = ()
) -> list[tuple[McpConnection, list[McpTool]]]:
    """Start the servers, see what each offers the model (and `left_out()`), close them: `runner mcp list`."""
    async with _running(servers, tool_names, workdir, jail) as offered:
        return offered


@asynccontextmanager
async def _running(
    servers: Mapping[str, McpServer], tool_names: list[str] | None, workdir: Path, jail: Sequence[str] = ()
) -> AsyncIterator[list[tuple[McpConnection, list[McpTool]]]]:
    """Every chosen server started at once, with the tools it offers; the first failure, in the order of the
    config, is the one raised. All of them are closed on the way out."""
    chosen = selection(servers, tool_names)
    connections = [McpConnection(name, servers[name], workdir, jail) for name in chosen]
    try:
        listings = await asyncio.gather(*(c.start() for c in connections), return_exceptions=True)
        failures = [result for result in listings if isinstance(result, BaseException)]
        if failures:
            raise failures[0]
        yield [(c, c.offered(chosen[c.name])) for c in connections]
    finally:
        await asyncio.gather(*(c.close() for c in connections))


class McpConnection:
    """One started server for one run: its session lives in a task of its own (the SDK's task groups
    must be entered and left by one task), which ends when the run closes it."""

    def __init__(self, name: str, config: McpServer, workdir: Path, jail: Sequence[str] = ()) -> None:
        self.name, self.config, self.workdir, self.jail = name, config, workdir, jail
        self.tools: list[Any] = []
        self.client: Any = None
        self.process: Any = None
        self.stderr = bytearray()
        self.stopping = False
        """Set once the run closes the server: its exit from then on is no failure of its own."""
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> list[Any]:
        """Start, initialize and list the tools; McpError with the reason if any of it fails."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(ready), name=f"mcp:{self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.config.start_timeout)
        except asyncio.TimeoutError:
            ready.cancel()  # whatever the session ends with now, nobody waits for it
            raise McpError(self._failed(f"did not start within {self.config.start_timeout:g}s")) from None
        except Exception as exc:
            raise McpError(self._failed(self._reason(exc))) from None
        return self.tools

    def offered(self, chosen: set[str] | None) -> list[McpTool]:
        """The tools the goal offers the model: the allow-list, the goal's choice, names every provider takes."""
        allowed = self.config.tools
        listed = {tool.name: tool for tool in self.tools}
        wanted = [*(chosen or ()), *(allowed or ())]
        missing = sorted({name for name in wanted if name not in listed})
        if missing:
            raise McpError(
                self._failed(f"lists no tool {', '.join(missing)} (it lists: {', '.join(listed) or 'none'})")
            )
        offered = []
        for tool in self.tools:
            if (allowed is not None and tool.name not in allowed) or (chosen is not None and tool.name not in chosen):
                continue
            name = tool_name(self.name, tool.name)
            problem = name_problem(name)
            if problem and chosen is not None:
                raise McpError(self._failed(f"its tool cannot be offered to a model: {problem}"))
            if not problem:
                description = tool.description or tool.title or f"{tool.name} (MCP server {self.name})"
                offered.append(McpTool(name, description, tool.input_schema, self, tool.name))
        return offered

    def left_out(self) -> list[str]:
        """The allowed tools no model can be offered, and why (for `runner mcp list`)."""
        allowed = self.config.tools
        names = [tool_name(self.name, t.name) for t in self.tools if allowed is None or t.name in allowed]
        return [problem for problem in map(name_problem, names) if problem]

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """The tool's result as text for the model; every failure is described, never raised."""
        shown = tool_name(self.name, tool)
        if self.client is None or self.exited:
            return f"error: {shown} was not called: the MCP server {self.name} {self._gone()}"
        timeout = self.config.timeout
        try:
            result = await asyncio.wait_for(
                self.client.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout + 5
            )
        except asyncio.TimeoutError:
            return f"error: {shown} timed out after {timeout:g}s"
        except Exception as exc:
            return await self._call_failed(shown, exc)
        return describe(result)

    async def _call_failed(self, shown: str, exc: Exception) -> str:
        from mcp_types import REQUEST_TIMEOUT

        await self._reaped()
        if self.exited:
            return f"error: {shown} failed: the MCP server {self.name} {self._gone()}"
        leaf = _leaf(exc)
        if getattr(getattr(leaf, "error", None), "code", None) == REQUEST_TIMEOUT:
            return f"error: {shown} timed out after {self.config.timeout:g}s"
        return f"error: {shown} failed: {str(leaf).strip() or type(leaf).__name__}"

    async def close(self) -> None:
        """End the session and stop the server; one that never got ready is not waited for."""
        self.stopping = True
        self._stop.set()
        task = self._task
        if task is None:
            return
        if self.client is None:
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=EXIT_GRACE + 5)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=5)
        self._kill_group()

    @property
    def exited(self) -> bool:
        """The stdio server's process ended on its own."""
        return self.process is not None and self.process.returncode is not None and not self.stopping

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        from mcp import Client

        try:
            async with Client(self._transport()) as client:
                self.tools = await _list_tools(client)
                self.client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # the SDK may raise groups; start() explains the leaf
            if not ready.done() and isinstance(exc, Exception):
                ready.set_exception(exc)
            elif not ready.done():
                ready.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.client = None

    def _transport(self) -> Any:
        if self.config.url is not None:
            return _http(self.config)
        return self._stdio()

    @asynccontextmanager
    async def _stdio(self) -> AsyncIterator[Any]:
        """The stdio transport of the SDK's sessions, under runner's process rules: the scrubbed environment
        plus the server's `env` names, the goal's jail, its own process group (killed at the end with all it
        started), every process recorded for the run, and its stderr kept to explain a failure."""
        import anyio

        config = self.config
        cwd = (self.workdir / config.cwd).resolve() if config.cwd else self.workdir
        if not cwd.is_dir():
            raise McpError(f"could not start: its cwd {cwd} is not a folder")
        env = scrub_env(config.env)
        command = config.command or ""
        if shutil.which(command, path=env.get("PATH")) is None and shutil.which(str(cwd / command)) is None:
            raise McpError(f"could not start: {command}: command not found")
        argv = [command, *config.args]
        if self.jail and cwd != self.workdir:  # the jail starts in the workdir
            argv = ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', str(cwd), *argv]
        self.process = await start_gated(
            [*self.jail, *argv], cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        reading, read_stream = anyio.create_memory_object_stream[Any](0)
        write_stream, writing = anyio.create_memory_object_stream[Any](0)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_read_messages, self.process.stdout, reading)
                tasks.start_soon(_write_messages, self.process.stdin, writing)
                tasks.start_soon(self._keep_stderr)
                try:
                    yield read_stream, write_stream
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop_process()
                    tasks.cancel_scope.cancel()
        finally:
            announce(self.process.pid, False)

    async def _keep_stderr(self) -> None:
        with contextlib.suppress(Exception):
            while chunk := await self.process.stderr.read(4096):
                self.stderr += chunk
                del self.stderr[:-STDERR_TAIL]

    async def _stop_process(self) -> None:
        """Close its stdin (the MCP way to ask a stdio server to leave), give it a moment, kill the group."""
        import anyio

        with contextlib.suppress(Exception):
            self.process.stdin.close()
        with anyio.move_on_after(EXIT_GRACE):
            while self.process.returncode is None:
                await anyio.sleep(0.01)
        self._kill_group()
        with anyio.move_on_after(2):  # its pipes closed too, so the loop is left with nothing of it
            await self.process.wait()

    def _kill_group(self) -> None:
        """Kill the server's process group: whatever it started goes with it, even after it exited itself."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    @property
    def where(self) -> str:
        """The server as its config names it: the URL, or the command line."""
        return self.config.url or " ".join([self.config.command or "", *self.config.args])

    def _failed(self, reason: str) -> str:
        return f"MCP server {self.name} ({self.where}) {reason}"

    def _reason(self, exc: BaseException) -> str:
        from mcp_types import CONNECTION_CLOSED

        leaf = _leaf(exc)
        if isinstance(leaf, McpError):
            return str(leaf)
        if self.exited or getattr(getattr(leaf, "error", None), "code", None) == CONNECTION_CLOSED:
            return self._gone()
        if isinstance(leaf, OSError) and self.process is None and self.config.command:
            return f"could not start: {leaf}"
        return f"could not initialize: {str(leaf).strip() or type(leaf).__name__}"

    async def _reaped(self) -> None:
        """A server whose connection broke is usually exiting: give it a moment to say with which code."""
        for _ in range(50):
            if self.process is None or self.process.returncode is not None:
                return
            await asyncio.sleep(0.01)

    def _gone(self) -> str:
        """How a server ended: `exited with code 1; its stderr ends: ...`."""
        code = self.process.returncode if self.process is not None else None
        status = f"exited with code {code}" if code is not None else "closed the connection"
        lines = [" ".join(line.split()) for line in bytes(self.stderr).decode("utf-8", "replace").splitlines()]
        tail = [line for line in lines if line][-3:]
        return status + (f"; its stderr ends: {' | '.join(tail)}" if tail else "")


def describe(result: Any) -> str:
    """A tool result as the text the model reads: text as it is, anything else described, never dropped."""
    parts = [_describe_block(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts) if parts else "(no output)"
    return cap(f"error: {text}" if result.is_error else text)


def _describe_block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind} {block.mime_type}, {_decoded_size(block.data)} bytes, not shown]"
    if kind == "resource_link":
        return f"[resource link {block.uri}" + (f" ({block.mime_type})" if block.mime_type else "") + "]"
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "text", None) is not None:
            return f"[resource {resource.uri}]\n{resource.text}"
        mime = f" {resource.mime_type}" if resource.mime_type else ""
        return f"[resource {resource.uri}{mime}, {_decoded_size(resource.blob)} bytes of binary, not shown]"
    return f"[{kind or type(block).__name__} content, not shown]"


def _decoded_size(data: str) -> int:
    return len(data) * 3 // 4 - data[-2:].count("=")


async def _list_tools(client: Any) -> list[Any]:
    tools, cursor = [], None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


@asynccontextmanager
async def _http(config: McpServer) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(config.start_timeout, read=max(config.timeout, 300.0))
    async with (
        httpx2.AsyncClient(headers=config.headers, timeout=timeout) as http,
        streamable_http_client(config.url or "", http_client=http) as streams,
    ):
        yield streams


async def _read_messages(stdout: asyncio.StreamReader, reading: Any) -> None:
    """Server stdout -> session: one JSON-RPC message a line; a line that is not one reaches the session
    as an exception, as the SDK's own transport does."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    buffer = b""
    async with reading:
        with contextlib.suppress(Exception):
            while chunk := await stdout.read(65536):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        message: Any = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line))
                    except ValueError as exc:
                        message = exc
                    await reading.send(message)


async def _write_messages(stdin: asyncio.StreamWriter, writing: Any) -> None:
    """Session -> server stdin, one message a line."""
    async with writing:
        with contextlib.suppress(Exception):
            async for message in writing:
                stdin.write(message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")
                await stdin.drain()


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return exc
