"""Notifications (DESIGN 10): a run that needs a person's eyes is announced through Apprise or a command.

    announce(message, targets, root, record)    # returns at once; delivery happens on a thread

A target is an Apprise URL (`json://`, `slack://`, `mailto://`, `ntfy://`, ...) or `{command: ...}`,
which gets the same message as JSON on stdin. Delivery runs off the run's path: a slow or dead receiver
delays nothing. Each target is tried `TRIES` times with a growing pause; the result is recorded (an
event `notified` or `notify_failed`) and a failure is logged. Nothing here changes a run's outcome.
`drain(timeout)` lets a process that is about to exit wait a bounded time for deliveries under way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import NotifyTarget
from .vocabulary import GOOD, OUTCOMES

log = logging.getLogger("runner.notify")

PAUSED = "paused"
"""An entry paused by its circuit breaker (`pause_after` runs in a row not achieved)."""
BUDGET = "budget"
"""A goal's or an entry's daily budget is spent; its fires are skipped until the next day (UTC)."""
TEST = "test"
"""`runner notify test`: sent to every target, whatever its `on:`."""
EVENTS = (*OUTCOMES, PAUSED, BUDGET)
"""What a target's `on:` may name."""
DEFAULT_ON = frozenset(o for o in EVENTS if o not in GOOD)
"""Every outcome but achieved and satisfied, plus awaiting_approval, a paused entry and a spent budget."""

TRIES = 3
PAUSE = 1.0
"""Seconds before the second try; doubled before each later one."""
COMMAND_TIMEOUT = 30.0

Recorder = Callable[[str, str], None]
"""Records a delivery: (event kind `notified` or `notify_failed`, detail)."""


@dataclass
class Message:
    """What a notification says: enough to know what happened and where to look."""

    goal: str
    outcome: str
    """An outcome, or `paused`, `budget` or `test`."""
    run_id: str | None = None
    entry: str | None = None
    failing_checks: list[str] = field(default_factory=list)
    error: str | None = None
    cost_usd: float | None = None
    look: str | None = None
    """The command (or dashboard link) that shows more; default `runner show RUN_ID`."""

    def __post_init__(self) -> None:
        if self.look is None and self.run_id:
            self.look = f"runner show {self.run_id}"

    @property
    def title(self) -> str:
        return f"runner: {self.goal} {self.outcome}"

    @property
    def body(self) -> str:
        lines = [f"goal {self.goal}: {self.outcome}"]
        if self.run_id:
            lines.append(f"run {self.run_id}")
        if self.entry:
            lines.append(f"schedule entry {self.entry}")
        if self.failing_checks:
            lines.append("failing checks: " + ", ".join(self.failing_checks))
        if self.error:
            lines.append(self.error)
        if self.cost_usd is not None:
            lines.append(f"cost ${self.cost_usd:.4f}")
        if self.look:
            lines.append(f"look: {self.look}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "title": self.title, "body": self.body}


def wants(target: NotifyTarget, what: str) -> bool:
    """Whether a target is told of an outcome (or `paused`, `budget`); every target is told of a test."""
    return what == TEST or what in (target.on if target.on is not None else DEFAULT_ON)


def describe(target: NotifyTarget) -> str:
    """A target as a person may see it in a log: an Apprise URL with its secrets masked, or the command."""
    if target.command is not None:
        return f"command {target.command}"
    import apprise

    plugin = apprise.Apprise.instantiate(target.url or "")
    return plugin.url(privacy=True).split("?")[0] if plugin else f"{(target.url or '').split(':')[0]}://..."


_pending: set[asyncio.Task[Any]] = set()


def announce(message: Message, targets: Iterable[NotifyTarget], root: Path, record: Recorder) -> int:
    """Start delivering `message` to each target that wants it; returns how many, at once."""
    chosen = [t for t in targets if wants(t, message.outcome)]
    for target in chosen:
        task = asyncio.get_running_loop().create_task(_deliver(target, message, root, record))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
    return len(chosen)


async def drain(timeout: float) -> None:
    """Wait at most `timeout` seconds for the deliveries under way (a process about to exit calls this)."""
    loop = asyncio.get_running_loop()
    under_way = {task for task in _pending if task.get_loop() is loop}
    if under_way:
        await asyncio.wait(under_way, timeout=timeout)


async def _deliver(target: NotifyTarget, message: Message, root: Path, record: Recorder) -> None:
    """Deliver on a daemon thread (an exiting process does not wait for it), then record on the loop."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[bool, str]] = loop.create_future()

    def work() -> None:
        result = deliver(target, message, root)
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))
        except RuntimeError:  # the loop closed while we were sending
            pass

    threading.Thread(target=work, name="runner-notify", daemon=True).start()
    ok, detail = await done
    where = describe(target)
    if not ok:
        log.warning("notification of %s %s to %s failed: %s", message.goal, message.outcome, where, detail)
    try:
        record("notified" if ok else "notify_failed", f"{message.outcome} run {message.run_id} to {where}: {detail}")
    except Exception as exc:  # the store may be closed by now; the log line above is the record then
        log.warning("could not record the notification to %s: %s", where, exc)


def deliver(target: NotifyTarget, message: Message, root: Path, tries: int = TRIES) -> tuple[bool, str]:
    """Send one message to one target, blocking, with retries; (delivered, what happened)."""
    detail = ""
    for attempt in range(tries):
        if attempt:
            time.sleep(PAUSE * 2 ** (attempt - 1))
        try:
            ok, detail = _send_command(target.command, message, root) if target.command else _send_url(target, message)
        except Exception as exc:  # a broken receiver or plugin never reaches the run
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        if ok:
            return True, f"delivered (try {attempt + 1})"
    return False, f"{detail} (after {tries} tries)"


def _send_url(target: NotifyTarget, message: Message) -> tuple[bool, str]:
    import apprise

    sender = apprise.Apprise()
    if not sender.add(target.url or ""):
        return False, f"not an Apprise URL this installation can send to: {describe(target)}"
    kind = apprise.NotifyType.INFO if message.outcome == TEST else apprise.NotifyType.FAILURE
    if message.outcome in ("awaiting_approval", PAUSED, BUDGET):
        kind = apprise.NotifyType.WARNING
    _said.lines = []
    try:
        ok = bool(sender.notify(body=message.body, title=message.title, notify_type=kind))
        said = " ".join(_said.lines)
    finally:
        _said.lines = None
    return ok, said or ("sent" if ok else "the receiver did not accept it")


class _Said(logging.Handler):
    """Keeps what Apprise logs while this thread sends: the reason a delivery failed, for the record.

    Apprise's own log lines stop here; the failure is logged once, by `_deliver`.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.local = threading.local()

    @property
    def lines(self) -> list[str] | None:
        return getattr(self.local, "lines", None)

    @lines.setter
    def lines(self, value: list[str] | None) -> None:
        self.local.lines = value

    def emit(self, record: logging.LogRecord) -> None:
        if self.lines is not None:
            self.lines.append(record.getMessage())


_said = _Said()
_apprise_log = logging.getLogger("apprise")
_apprise_log.addHandler(_said)
_apprise_log.setLevel(logging.WARNING)
_apprise_log.propagate = False


def _send_command(command: str, message: Message, root: Path) -> tuple[bool, str]:
    done = subprocess.run(
        command,
        shell=True,
        cwd=root,
        input=json.dumps(message.to_json()),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        start_new_session=True,
    )
    if done.returncode == 0:
        return True, "sent"
    return False, f"exit code {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"


def targets_of(goal_targets: list[NotifyTarget], entry_targets: list[NotifyTarget] | None) -> list[NotifyTarget]:
    """An entry's own targets, else its goal's (which inherit runner.yaml's)."""
    return entry_targets if entry_targets is not None else goal_targets
