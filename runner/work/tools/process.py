"""Subprocesses for the shell tool, command tools and checks: scrubbed environment, process groups, caps.

Every process starts behind a gate: `/bin/sh` waits for one line on its stdin before it execs the
command, and runner writes that line only after the store has recorded the process. A runner killed
in between closes the pipe and the gate exits without running anything, so no process of a run can
be orphaned unrecorded. Processes started inside `sandbox.contained()` are killed, however they
detached, when it ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...config.project import dotenv_names

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
spawned: contextvars.ContextVar[Callable[[int, bool], None] | None] = contextvars.ContextVar("spawned", default=None)
"""Told of every process group started (pid, True) and ended (pid, False), so that a run's processes
can be found and killed after its runner process was killed itself."""
run_env: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("run_env", default=None)
"""Variables every process of the current run gets (RUNNER_TRIGGER_FILE), set by the verify loop."""

OUTPUT_CAP = 12_000
"""Characters of a tool's output that reach the model: the head and the tail, with a marker between."""

SCOPE_VAR = "RUNNER_SCOPE"
"""Carried by every process runner starts: the scope (an attempt, a round of checks) it belongs to."""
GATE = ["/bin/sh", "-c", 'read -r _ && exec "$@"', "runner-gate"]
"""Waits for runner's go-ahead (one line on stdin), then becomes the command."""
HIDDEN_NAMES: set[str] = set()
"""More names never passed to processes unless a goal's `env` names them (the provider's key variables)."""

known_children: set[int] = set()
"""Processes runner started itself (still tracked); anything else that is its child was adopted."""


def scrub_env(passed: Iterable[str] = (), extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without secrets: no name holding KEY, TOKEN, SECRET or PASSWORD, nothing loaded from
    .env and no provider key variable, unless `passed` names it."""
    allowed = set(passed)
    hidden = dotenv_names() | HIDDEN_NAMES
    env = {k: v for k, v in os.environ.items() if k in allowed or not (SECRET_NAME.search(k) or k in hidden)}
    env.update(run_env.get() or {})
    env.update(extra or {})
    scope = current_scope.get()
    env[SCOPE_VAR] = scope.token if scope is not None else "none"
    return env


def cap(text: str, limit: int = OUTPUT_CAP) -> str:
    """Keep the head and the tail of a long text, saying how much was cut between them."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def decode(data: bytes) -> str:
    """Text from any output: invalid UTF-8 and NUL bytes become U+FFFD."""
    return data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")


@dataclass
class Scope:
    """Processes started for one attempt or one round of checks: the group leaders, and a token in their
    environment, so that `sandbox.contained` finds them however they detached."""

    token: str
    started: float
    leaders: set[int]


current_scope: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("current_scope", default=None)


def announce(pid: int, alive: bool) -> None:
    """A process group runner started (alive) or saw end: known as runner's own, and told to the store."""
    if alive:
        known_children.add(pid)
        scope = current_scope.get()
        if scope is not None:
            scope.leaders.add(pid)
    else:
        known_children.discard(pid)
    tell = spawned.get()
    if tell is not None:
        tell(pid, alive)


async def start_gated(argv: Sequence[str], **options: object) -> asyncio.subprocess.Process:
    """Start `argv` in a new session behind the gate; announce it; only then let it run.

    stdin is a pipe (its first line is the go-ahead); the caller writes any input after it.
    """
    scope = current_scope.get()
    if scope is not None and isinstance(options.get("env"), dict):
        options["env"] = {**options["env"], SCOPE_VAR: scope.token}  # type: ignore[dict-item]
    proc = await asyncio.create_subprocess_exec(
        *GATE,
        *argv,
        stdin=asyncio.subprocess.PIPE,
        start_new_session=True,
        **options,  # type: ignore[arg-type]
    )
    try:
        announce(proc.pid, True)
    except BaseException:
        _kill_group(proc)
        raise
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    return proc


@dataclass
class ProcessResult:
    exit_code: int | None
    """None when the process was killed at its timeout."""
    output: str
    duration: float
    timed_out: bool = False

    def describe(self, timeout: float) -> str:
        status = f"timed out after {timeout:g}s and was killed" if self.timed_out else f"exit code {self.exit_code}"
        return f"{status}\n{self.output}" if self.output else status


async def run_process(
    command: str,
    *,
    cwd: os.PathLike[str] | str,
    env: Mapping[str, str],
    timeout: float,
    stdin: bytes | None = None,
    cap_bytes: int = OUTPUT_CAP,
    jail: Sequence[str] = (),
) -> ProcessResult:
    """Run `command` with /bin/sh -c (inside `jail`, an argv prefix, if given) in its own process group;
    stdout and stderr together, head and tail kept.

    On timeout or cancellation the whole group is killed, grandchildren included.
    """
    started = time.monotonic()
    proc = await start_gated(
        [*jail, "/bin/sh", "-c", command],
        cwd=cwd,
        env=dict(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    collector = _Collector(cap_bytes)
    timed_out = False
    try:
        await asyncio.wait_for(_communicate(proc, stdin, collector), timeout)
    except asyncio.TimeoutError:
        timed_out = True
        _kill_group(proc)
        await _drain_after_kill(proc, collector)
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        announce(proc.pid, False)
    return ProcessResult(
        None if timed_out else proc.returncode, collector.text(), time.monotonic() - started, timed_out
    )


async def _communicate(proc: asyncio.subprocess.Process, stdin: bytes | None, collector: _Collector) -> None:
    if proc.stdin is not None:
        try:
            proc.stdin.write(stdin or b"")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        proc.stdin.close()
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(65536):
        collector.add(chunk)
    await proc.wait()


async def _drain_after_kill(proc: asyncio.subprocess.Process, collector: _Collector) -> None:
    try:
        assert proc.stdout is not None
        while chunk := await asyncio.wait_for(proc.stdout.read(65536), 2):
            collector.add(chunk)
        await asyncio.wait_for(proc.wait(), 2)
    except (asyncio.TimeoutError, ProcessLookupError):
        pass


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Collector:
    """Keeps the first and the last `limit // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return decode(bytes(self.head + self.tail))
        return f"{decode(bytes(self.head))}\n[... {cut} bytes cut ...]\n{decode(bytes(self.tail))}"
