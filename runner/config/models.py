"""The typed configuration: what runner.yaml and goals/*.yaml may hold, as pydantic models with docstrings."""

from __future__ import annotations

import fnmatch
import posixpath
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..vocabulary import OUTCOMES
from .mcp import check_servers, check_tools, is_mcp_tool
from .values import DEFAULT_STORE, DEFAULT_STORE_TIMEOUT, check_store, parse_duration

BUILTIN_TOOLS = ("read_file", "write_file", "edit_file", "list_files", "search_files", "shell")
ALWAYS_PROTECTED = ("goals", "verifiers", "schedules", "runner.yaml", ".runner", ".env")

Duration = Annotated[float, BeforeValidator(parse_duration)]


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


StrList = Annotated[list[str], BeforeValidator(_as_list)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Price(Strict):
    """A model's price in US dollars per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class ModelConfig(Strict):
    """Which OpenAI-compatible endpoint and model to call."""

    name: str
    """The model id, or `script:PATH` to replay a scripted conversation offline."""
    base_url: str | None = None
    """Endpoint; default the OpenAI API (or OPENAI_BASE_URL)."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """Name of the environment variable holding the key; null for an endpoint that needs none."""
    temperature: float | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific request fields, sent as they are."""
    request_timeout: Duration = 120.0
    """One HTTP request, before it counts as a transient failure and is retried."""
    max_retries: int = Field(default=4, ge=0)
    """Retries of transient failures (429, 5xx, timeouts, resets), with backoff."""
    price: Price | None = None
    """US dollars per million tokens, for a model genai-prices does not know."""
    text_tool_calls: Literal["auto", "off"] = "auto"
    """A reply whose text plainly holds a call of one of the goal's tools: `auto` runs it as a call,
    `off` tells the model that nothing was executed."""


class Limits(Strict):
    """When the work loop stops by force."""

    max_steps: int = Field(default=20, ge=1)
    max_tokens: int = Field(default=200_000, ge=1)
    timeout: Duration = 600.0
    max_cost: float | None = Field(default=None, gt=0)
    """US dollars one attempt may spend before it stops like max_tokens (needs a known price)."""


class McpServer(Strict):
    """One MCP server of an `mcp:` block: a stdio server (`command`) or a streamable HTTP server (`url`)."""

    command: str | None = None
    """stdio: the executable, started once per run and stopped after it, with its whole process group."""
    args: list[str] = Field(default_factory=list)
    env: StrList = Field(default_factory=list)
    """stdio: names of environment variables passed through; the rest of the environment is scrubbed."""
    cwd: str | None = None
    """stdio: the folder it starts in, relative to the goal's workdir; default the workdir."""
    url: str | None = None
    """streamable HTTP: the endpoint, e.g. `https://docs.example.com/mcp`."""
    headers: dict[str, str] = Field(default_factory=dict)
    """streamable HTTP: headers sent with every request; `${VAR}` reads the environment."""
    tools: list[str] | None = None
    """Allow-list of the server's own tool names; default every tool it lists."""
    timeout: Duration = Field(default=60.0, gt=0)
    """One tool call, before its result is a timeout error the model reads."""
    start_timeout: Duration = Field(default=60.0, gt=0)
    """Starting, initializing and listing the tools, before the run ends `error`."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("an MCP server needs exactly one of `command` (stdio) or `url` (streamable HTTP)")
        stdio_only = [f for f in ("args", "env", "cwd") if f in self.model_fields_set]
        if self.url is not None and stdio_only:
            raise ValueError(f"{', '.join(stdio_only)}: only for a stdio server (`command`), not one with `url`")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url: expected an http:// or https:// address, got {self.url!r}")
        if self.command is not None and (self.headers or not self.command.strip()):
            raise ValueError("a stdio server needs a non-empty `command`; `headers` are for one with `url`")
        return self


McpServers = Annotated[dict[str, McpServer], AfterValidator(check_servers)]
"""An `mcp:` block: server name -> server."""


class ToolEntry(Strict):
    """A built-in tool by name, or a command tool: JSON arguments on stdin, stdout is the result."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    run: str | None = None
    timeout: Duration = 30.0

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _known(self) -> ToolEntry:
        if self.run is None and self.name not in BUILTIN_TOOLS and not is_mcp_tool(self.name):
            raise ValueError(
                f"unknown tool {self.name!r}: expected a built-in ({', '.join(BUILTIN_TOOLS)}), "
                "an MCP server's tool (SERVER__TOOL, or SERVER__* for all of them) or a command tool with `run:`"
            )
        if self.run is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.name):
            raise ValueError("a tool name is 1-64 letters, digits, _ or -")
        return self


class Check(Strict):
    """One acceptance check: exactly one of `run`, `judge`, `approve`."""

    name: str | None = None
    run: str | None = None
    """Shell command; exit code 0 passes."""
    judge: str | None = None
    """Rubric an evaluation model judges against the named files and the run checks' output."""
    approve: str | None = None
    """Question a person answers."""
    files: StrList = Field(default_factory=list)
    timeout: Duration = 60.0

    @model_validator(mode="after")
    def _one_kind(self) -> Check:
        kinds = [k for k in ("run", "judge", "approve") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a check needs exactly one of run, judge or approve")
        if not getattr(self, kinds[0]).strip():
            raise ValueError(f"{kinds[0]}: expected {_CHECK_TEXT[kinds[0]]}, got an empty string")
        if self.name is None:
            self.name = getattr(self, kinds[0]).strip().splitlines()[0][:60]
        return self

    @property
    def kind(self) -> str:
        return "run" if self.run is not None else "judge" if self.judge is not None else "approve"


_CHECK_TEXT = {"run": "a shell command", "judge": "a rubric for the judge", "approve": "a question for a person"}


class Verify(Strict):
    """The verify loop: checks decide whether the goal is met."""

    max_attempts: int = Field(default=3, ge=1)
    checks_first: bool = False
    fresh_context: bool = False
    before_retry: str | None = None
    stuck_after: int = Field(default=3, ge=2)
    protect_check_inputs: bool = True
    """Files and folders a check command names are protected like the check's script; false for a goal
    whose task is to write them."""
    nudge: bool = True
    """After feedback, a turn that calls no tool is answered once in the same attempt: use the tools."""
    checks: list[Check] = Field(default_factory=list)


class SandboxSettings(Strict):
    """`sandbox:` (runner.yaml or a goal): the bubblewrap jail of the agent's processes on Linux."""

    mode: Literal["auto", "bwrap", "off"] = "auto"
    """`auto`: bwrap where it works, else the fallback (process tracking, scrubbing); `bwrap`: refuse to
    run without it; `off`: no jail."""
    network: bool = True

    @model_validator(mode="before")
    @classmethod
    def _from_mode(cls, value: Any) -> Any:
        if value is False:  # `sandbox: off` as DESIGN writes it: YAML 1.1 reads a bare `off` as false
            return {"mode": "off"}
        if isinstance(value, dict) and value.get("mode") is False:
            return {**value, "mode": "off"}
        return {"mode": value} if isinstance(value, str) else value


class Budget(Strict):
    """What a goal or an entry may spend in one day (UTC); past it, the daemon skips its fires."""

    cost_per_day: float | None = Field(default=None, gt=0)
    tokens_per_day: int | None = Field(default=None, gt=0)


class NotifyTarget(Strict):
    """Where to send a notification: an Apprise URL, or a command receiving the message as JSON on stdin."""

    url: str | None = None
    command: str | None = None
    on: list[str] | None = None
    """Outcomes that notify; default every outcome but achieved and satisfied, plus awaiting_approval and
    an entry paused by its circuit breaker."""

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"url": value}
        if isinstance(value, dict) and True in value:  # YAML 1.1 reads a bare `on:` key as true
            value = {("on" if k is True else k): v for k, v in value.items()}
        return value

    @field_validator("on", mode="before")
    @classmethod
    def _known_events(cls, value: Any) -> Any:
        known = (*OUTCOMES, "paused", "budget")
        wrong = [v for v in _as_list(value) or [] if v not in known]
        if wrong:
            raise ValueError(f"unknown {', '.join(map(str, wrong))} (expected any of {', '.join(known)})")
        return _as_list(value)

    @model_validator(mode="after")
    def _one_target(self) -> NotifyTarget:
        if (self.url is None) == (self.command is None):
            raise ValueError("a notification target needs exactly one of url (Apprise) or command")
        return self


class Goal(Strict):
    """A task with the checks that decide when it is done."""

    name: str
    prompt: str
    system: str | None = None
    workdir: str = "."
    model: ModelConfig
    judge_model: ModelConfig | None = None
    mcp: McpServers = Field(default_factory=dict)
    """MCP servers whose tools the model may call as SERVER__TOOL, over runner.yaml's (same name: the goal's)."""
    tools: list[ToolEntry] | None = None
    limits: Limits = Field(default_factory=Limits)
    env: StrList = Field(default_factory=list)
    protect: StrList = Field(default_factory=list)
    verify: Verify = Field(default_factory=Verify)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    notify: list[NotifyTarget] = Field(default_factory=list)
    budget: Budget | None = None
    root: Path = Path(".")
    """The project root (set by the loader)."""
    source: str | None = None
    """The file this goal came from (set by the loader)."""
    _paths: tuple[Path, str, Path, Path] | None = PrivateAttr(default=None)

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, tools: list[ToolEntry] | None) -> list[ToolEntry] | None:
        names = [t.name for t in tools or []]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tool names must be unique: {', '.join(dupes)}")
        return tools

    @field_validator("tools")
    @classmethod
    def _mcp_tools(cls, tools: list[ToolEntry] | None, info: ValidationInfo) -> list[ToolEntry] | None:
        entries = tools or []
        referenced = [t.name for t in entries if t.run is None and is_mcp_tool(t.name)]
        check_tools(info.data.get("mcp", {}), referenced, [t.name for t in entries if t.run is not None])
        return tools

    @field_validator("workdir")
    @classmethod
    def _sane_workdir(cls, workdir: str) -> str:
        if any(ord(c) < 32 or ord(c) == 127 for c in workdir):
            raise ValueError("expected a folder path relative to the project root, without control characters")
        if len(workdir) > 4096 or any(len(part) > 255 for part in workdir.split("/")):
            raise ValueError("expected a folder path of at most 4096 characters, each name at most 255")
        return workdir

    @field_validator("protect")
    @classmethod
    def _protect_not_everything(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if covers_state(pattern):
                raise ValueError(
                    f"{pattern!r} covers the whole project or its state folder .runner/, which runner writes "
                    "during every run; name the files or folders to protect (e.g. secrets/**)"
                )
        return patterns

    @property
    def workpath(self) -> Path:
        """The workdir as an absolute path, symlinks resolved."""
        return self._resolved()[1]

    @property
    def rootpath(self) -> Path:
        """The project root as an absolute path, symlinks resolved."""
        return self._resolved()[0]

    def _resolved(self) -> tuple[Path, Path]:
        """Resolved once per goal object (a run asks a dozen times; each resolve is a syscall per folder of the
        path). Kept while root and workdir stay what they were: a copy with another root resolves again, a
        reload makes new goals. A symlink on the way that changes later is not followed: the run keeps the
        folder it started with."""
        paths = self._paths
        if paths is None or paths[0] != self.root or paths[1] != self.workdir:
            paths = self._paths = (self.root, self.workdir, self.root.resolve(), (self.root / self.workdir).resolve())
        return paths[2], paths[3]


def covers_state(pattern: str) -> bool:
    """Whether a `protect:` pattern reaches the whole project (`.`, `*`, `**`) or runner's state folder `.runner/`."""
    glob = posixpath.normpath(pattern.strip() or ".")  # `goals/../.runner` is `.runner`
    base = glob.removesuffix("/**")
    if base in ("", ".", "..", ".runner") or base.startswith(("../", ".runner/")):
        return True
    return any(fnmatch.fnmatchcase(state, glob) for state in _STATE_SAMPLES)


_STATE_SAMPLES = (".runner", ".runner/runs.db", ".runner/runs/RUN_ID/transcript.jsonl")


class WebhookSettings(Strict):
    """The webhook listener of the daemon."""

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    secret: str | None = None
    max_body: int = Field(default=1_048_576, ge=1)
    max_connections: int = Field(default=64, ge=1, le=10_000)
    """Connections served at once; more are closed at once, so slow clients cannot take the runs' descriptors."""
    request_timeout: Duration = Field(default=10.0, gt=0)
    """From a request's first byte to its last; a slower client is disconnected."""


class UiSettings(Strict):
    """The dashboard (`runner ui`, or `daemon.ui: true` inside the daemon)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8788, ge=0, le=65535)
    token: str | None = None
    """Required when bound to anything but loopback."""

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value


class DaemonSettings(Strict):
    """runner.yaml `daemon:`: how the schedule loop runs."""

    max_concurrent_runs: int = Field(default=4, ge=1)
    shutdown_grace: Duration = 30.0
    poll_interval: Duration = 0.5
    store_timeout: Duration = Field(default=DEFAULT_STORE_TIMEOUT, gt=0)
    """How long a write waits for a store another process holds locked; a fire that could not be
    recorded in that time is tried again at the next poll."""
    """How often the daemon reads commands (trigger, pause, resume) from the store."""
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    ui: UiSettings = Field(default_factory=lambda: UiSettings(enabled=False))
    """`ui: true` serves the dashboard inside the daemon."""


class Settings(Strict):
    """runner.yaml: defaults for every goal, and the daemon's settings."""

    model: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    verify: dict[str, Any] = Field(default_factory=dict)
    sandbox: dict[str, Any] | str | bool = Field(default_factory=dict)
    notify: list[Any] = Field(default_factory=list)
    mcp: McpServers = Field(default_factory=dict)
    """MCP servers every goal starts (a goal's own `mcp:` adds to them or replaces one by name)."""
    daemon: DaemonSettings = Field(default_factory=DaemonSettings)
    store: str = DEFAULT_STORE
    """The state: a folder relative to the root (SQLite), or a postgresql:// URL."""

    @field_validator("model", mode="before")
    @classmethod
    def _model_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        return check_store(value)
