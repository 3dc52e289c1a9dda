"""runner as an MCP server over stdio: another agent hands runner a goal and gets back a verified outcome.

    list_goals   run_goal (a goal by name, or an inline prompt + checks; wait, or take the run id)
    get_run      list_runs      approve      reject      trigger

Every tool returns structured content. A run started here lives in this process: it goes on after
`run_goal` returns the run id (wait=false, or when it waits for a person), and is cancelled when the
client closes the server. Nothing here prints: stdout is the protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field

from . import verify
from .config import Catalog, Check, build_goal, goal_from_file, load_goal, load_project
from .errors import ConfigError, RunnerError
from .store import RUN_FIELDS, Store, open_store
from .vocabulary import Event

INSTRUCTIONS = (
    "runner runs a goal (a task with acceptance checks) with its own agent, checks the result, feeds failures "
    "back and retries, and reports a verified outcome. Use run_goal with a goal name from list_goals, or with "
    "an inline prompt and shell checks (exit code 0 passes); get_run reads a run back."
)


class GoalInfo(BaseModel):
    name: str
    file: str
    prompt: str = ""
    checks: list[str] = Field(default_factory=list)
    max_attempts: int | None = None
    error: str | None = None
    """Why the goal file is invalid; such a goal cannot run until it is fixed."""


class Goals(BaseModel):
    goals: list[GoalInfo]


class Run(BaseModel):
    run_id: str
    goal: str
    outcome: str
    """running, achieved, satisfied, not_achieved, stuck, tampered, error, cancelled, interrupted,
    awaiting_approval or rejected."""
    trigger: str | None = None
    started: str | None = None
    ended: str | None = None
    attempts: int = 0
    steps: int = 0
    tokens: int = 0
    stop_reason: str | None = None
    error: str | None = None
    final_message: str | None = None
    pending: str | None = None
    """The `approve` check a run awaiting approval waits on: answer it with approve or reject."""
    checks: list[dict[str, Any]] = Field(default_factory=list)
    """The last attempt's checks: name, passed, exit_code, output, reason."""


class Runs(BaseModel):
    runs: list[Run]


class Answer(BaseModel):
    run_id: str
    outcome: str
    message: str


class Triggered(BaseModel):
    goal: str
    daemon_running: bool
    message: str


def build(root: Path | None = None) -> Any:
    """The MCP server for the project at (or above) `root`; the project is read afresh by every call."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("runner", instructions=INSTRUCTIONS, log_level="WARNING")
    background: set[asyncio.Task[Any]] = set()

    def failing(exc: RunnerError) -> ToolError:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        return ToolError("; ".join(problems))

    @server.tool()
    def list_goals() -> Goals:
        """The goals of the project: name, prompt, the names of their checks, max attempts."""
        project = load_project(root)
        return Goals(goals=[_goal_info(project, path) for path in project.goal_files()])

    @server.tool()
    async def run_goal(
        name: str | None = None,
        prompt: str | None = None,
        checks: list[str] | None = None,
        max_attempts: Annotated[int | None, Field(ge=1)] = None,
        wait: bool = True,
    ) -> Run:
        """Run a goal: work, then its acceptance checks, retrying with the failures as feedback.

        Give `name` (a goal of list_goals) or an inline `prompt` with `checks` (shell commands run in the
        project folder; exit code 0 passes). wait=true returns the verified outcome; wait=false returns at
        once with the run id (read it with get_run). A run waiting on a person's approval returns
        `awaiting_approval`: answer it with approve or reject.
        """
        try:
            goal = _goal(root, name, prompt, checks or [], max_attempts)
            store = open_store(load_project(root))
        except RunnerError as exc:
            raise failing(exc) from None
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asking = asyncio.Event()
        approver = _Signalling(verify.StoreApprover(store), asking)

        def observe(kind: str, data: dict[str, Any]) -> None:
            if kind == Event.RUN and not started.done():
                started.set_result(data["run_id"])

        task = asyncio.create_task(verify.run_goal(goal, store, trigger="mcp", observe=observe, approver=approver))
        background.add(task)
        task.add_done_callback(lambda done: (background.discard(done), store.close()))
        await _first(task, started)
        if not started.done():  # the run could not even be recorded
            try:
                task.result()
            except RunnerError as exc:
                raise failing(exc) from None
        if wait:
            await _first(task, asyncio.ensure_future(asking.wait()))
        with _store(root) as reader:  # the run's own store closes with the run
            return _run(reader.run(started.result()))

    @server.tool()
    def get_run(run_id: str) -> Run:
        """One run: its outcome, attempts, steps, tokens, error, final message and its last attempt's checks."""
        try:
            with _store(root) as store:
                return _run(store.run(run_id))
        except RunnerError as exc:
            raise failing(exc) from None

    @server.tool()
    def list_runs(goal: str | None = None, limit: Annotated[int, Field(ge=1)] = 20) -> Runs:
        """The latest runs, oldest first; `goal` keeps only that goal's."""
        with _store(root) as store:
            rows = store.runs(goal, limit)
        return Runs(runs=[Run(**{k: row[k] for k in RUN_FIELDS}) for row in rows])

    @server.tool()
    async def approve(run_id: str) -> Answer:
        """Approve the `approve` check a run is waiting on (outcome awaiting_approval)."""
        return await _answer(root, run_id, "approve", None, failing)

    @server.tool()
    async def reject(run_id: str, reason: str | None = None) -> Answer:
        """Reject the `approve` check a run is waiting on; its outcome becomes rejected."""
        return await _answer(root, run_id, "reject", reason, failing)

    @server.tool()
    def trigger(name: str) -> Triggered:
        """Ask the running daemon (`runner daemon`) to run a goal now, queued like any trigger."""
        from .schedule.daemon import daemon_pid

        try:
            catalog = Catalog.load(root)
        except RunnerError as exc:
            raise failing(exc) from None
        if name not in catalog.goals:
            raise ToolError(f"no goal named {name!r} (goals: {', '.join(sorted(catalog.goals)) or 'none'})")
        with _store(root) as store:
            store.send_command("trigger", name)
        running = bool(daemon_pid(catalog.project))
        message = (
            "the daemon runs it as soon as the goal is free"
            if running
            else ("no daemon is running now; it runs when `runner daemon` starts")
        )
        return Triggered(goal=name, daemon_running=running, message=message)

    return server


def serve(root: Path | None = None) -> None:
    """Serve runner over stdio until the client closes the connection."""
    build(root).run()


@contextlib.contextmanager
def _store(root: Path | None) -> Iterator[Store]:
    store = open_store(load_project(root))
    try:
        yield store
    finally:
        store.close()


async def _first(task: asyncio.Future[Any], other: asyncio.Future[Any]) -> None:
    """Wait until `task` ends or `other` is done; `other` is cancelled if it is still waiting then."""
    await asyncio.wait({task, other}, return_when=asyncio.FIRST_COMPLETED)
    if not other.done():
        other.cancel()


class _Signalling:
    """An approver that says when a run starts waiting on a person, so a waiting `run_goal` can return."""

    def __init__(self, approver: verify.StoreApprover, asking: asyncio.Event) -> None:
        self.approver, self.asking = approver, asking

    async def __call__(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        self.asking.set()
        return await self.approver(run_id, check)


def _goal(root: Path | None, name: str | None, prompt: str | None, checks: list[str], max_attempts: int | None):
    if (name is None) == (prompt is None):
        raise ConfigError("give a goal `name` or an inline `prompt`, not both and not neither")
    project = load_project(root)
    overrides = {"verify": {"max_attempts": max_attempts}} if max_attempts else {}
    if name is not None:
        if checks:
            raise ConfigError("`checks` go with an inline `prompt`; a named goal has its own")
        return load_goal(project, name, overrides)
    data = {"prompt": prompt, "verify": {"checks": [{"name": c, "run": c} for c in checks]}}
    return build_goal(project, data, default_name="inline", source="<mcp>", overrides=overrides)


def _goal_info(project: Any, path: Path) -> GoalInfo:
    shown = str(path.relative_to(project.root))
    try:
        goal = goal_from_file(project, path)
    except RunnerError as exc:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        return GoalInfo(name=path.stem, file=shown, error="; ".join(problems))
    return GoalInfo(
        name=goal.name,
        file=shown,
        prompt=goal.prompt,
        checks=[c.name or "" for c in goal.verify.checks],
        max_attempts=goal.verify.max_attempts,
    )


def _run(row: dict[str, Any]) -> Run:
    last = max((c["attempt"] for c in row.get("checks", [])), default=None)
    checks = [
        {k: c[k] for k in ("name", "passed", "exit_code", "output", "reason")} | {"passed": bool(c["passed"])}
        for c in row.get("checks", [])
        if c["attempt"] == last
    ]
    fields = {k: row.get(k) for k in Run.model_fields if k != "checks"}
    return Run(**json.loads(json.dumps({**fields, "checks": checks}, default=str)))


async def _answer(root: Path | None, run_id: str, decision: str, reason: str | None, failing: Any) -> Answer:
    try:
        message = await verify.answer(load_project(root), run_id, decision, reason)
        with _store(root) as store:
            run = store.run(run_id)
    except RunnerError as exc:
        raise failing(exc) from None
    return Answer(run_id=run["id"], outcome=run["outcome"], message=message)
