"""The schedule loop (outer): `runner daemon` reruns goals on cron, intervals, dates, file changes, webhooks
and other goals' outcomes, in one asyncio process on APScheduler's AsyncIOScheduler.

Guarantees kept here, where the library has none:
- one run per goal at a time; triggers that arrive meanwhile collapse into one follow-up run, and every
  skip is recorded (APScheduler drops ticks under max_instances with only a log line);
- `daemon.max_concurrent_runs` across goals;
- catch-up of a fire missed while the daemon was down, once, from the store's last fire time per entry
  (re-adding jobs loses APScheduler's own), within `misfire_grace`;
- SIGTERM/SIGINT drain in-flight runs for `shutdown_grace`, then cancel them (their processes killed)
  and record them `cancelled` (the asyncio executor ignores shutdown(wait=True));
- runs left `running` by a dead process become `interrupted` at start;
- `pause_after` runs in a row not achieved pause the entry until `runner resume`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gc
import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from .. import notify
from ..config import Catalog, Entry, Goal, Project
from ..errors import ConfigError, DaemonError, StoreError
from ..store import open_store
from ..verify import RunResult, StoreApprover, run_goal, settle_interrupted
from ..vocabulary import GOOD
from ..work import warm_up
from . import unattended
from .triggers import missed_fire, time_trigger

log = logging.getLogger("runner.daemon")
FULL_STAMP = 2.0
"""Seconds between two reads of every configuration file's stamp (the folders' are read every poll)."""
NOTIFY_GRACE = 5.0
"""Seconds a stopping daemon waits for notifications still being delivered."""
NOT_COUNTED = ("cancelled", "awaiting_approval")
"""Outcomes that neither trip the circuit breaker nor chain `after` entries."""


def _deferred_on_store_error(fire: Callable[..., None]) -> Callable[..., None]:
    """A fire that cannot be recorded (the store locked past its timeout) waits for the next poll, not lost."""

    @functools.wraps(fire)
    def guarded(self: Daemon, *args: Any, **kwargs: Any) -> None:
        try:
            fire(self, *args, **kwargs)
        except StoreError as exc:
            log.error("cannot record a fire (%s); it is tried again at the next poll", exc)
            self.deferred.append(functools.partial(guarded, self, *args, **kwargs))

    return guarded


@dataclass
class Slot:
    """What the daemon knows of one goal: its running task and at most one follow-up."""

    task: asyncio.Task[Any] | None = None
    follow_up: tuple[Entry | None, str] | None = None
    follow_up_context: dict[str, Any] | None = None
    """What triggered the follow-up (webhook body, changed paths, ...)."""


class Daemon:
    def __init__(self, root: Any = None) -> None:
        self.root = root
        self.catalog = Catalog.load(root)
        self.store = open_store(self.catalog.project)
        self.settings = self.catalog.project.settings.daemon
        self.slots: dict[str, Slot] = {}
        self.semaphore = asyncio.Semaphore(self.settings.max_concurrent_runs)
        self.stopping = asyncio.Event()
        self.scheduler: Any = None
        self.listeners: list[asyncio.Task[Any]] = []
        self.sources: dict[str, asyncio.Task[Any]] = {}
        """The file watcher and the webhook listener, by name, once an entry needs them."""
        self._lock: TextIO | None = None
        self.stamp: tuple[Any, ...] = ()
        self._quick: tuple[Any, ...] = ()
        self._full_at = float("-inf")
        self._full: tuple[tuple[str, int, int], ...] = ()
        self.approver = StoreApprover(self.store)
        self.due: dict[str, datetime] = {}
        self.deferred: list[Callable[[], None]] = []
        """Fires that met a store error; fired again at the next poll."""
        self.failure: str | None = None

    # lifecycle
    async def run(self) -> None:
        self._take_lock()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(log_loop_error)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        for run_id in settle_interrupted(self.store):
            self.record("interrupted", detail=f"run {run_id} was left running by a process that is gone")
            unattended.tell_interrupted(self, run_id)
        warm_up()  # once here, not inside the first run while others wait

        self.start_scheduling()
        freeze_start_up()
        log.info(
            "daemon started: %d goals, %d entries, max %d runs at once",
            len(self.catalog.goals),
            len(self.catalog.entries),
            self.settings.max_concurrent_runs,
        )
        await self.stopping.wait()
        await self.shutdown()
        if self.failure is not None:
            raise DaemonError(f"{self.failure}; the daemon stopped")

    def start_scheduling(self) -> None:
        """APScheduler with every time entry, the catch-up of missed fires, the listeners and the command reader."""
        from apscheduler.events import EVENT_JOB_SUBMITTED
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        from .listeners import start_listeners

        self.scheduler = AsyncIOScheduler(timezone=timezone.utc)
        self.scheduler.add_listener(self._due, EVENT_JOB_SUBMITTED)
        self.scheduler.start()
        self.schedule_all()
        self.catch_up()
        self.listeners = start_listeners(self, self.sources)
        self.stamp = self.config_stamp()
        self.listeners.append(asyncio.create_task(self.read_commands()))

    async def shutdown(self) -> None:
        log.info(
            "shutting down: no new runs; %d running get %gs to finish",
            len(self.running()),
            self.settings.shutdown_grace,
        )
        self.scheduler.shutdown(wait=False)
        for task in self.listeners:
            task.cancel()
        for task in list(self.approver.waiting):  # waiting on a person: kept `awaiting_approval`, not drained
            task.cancel()
        running = self.running()
        if running:
            _done, pending = await asyncio.wait(running, timeout=self.settings.shutdown_grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await notify.drain(NOTIFY_GRACE)
        self.store.close()
        log.info("daemon stopped")

    def _take_lock(self) -> None:
        path = self.catalog.project.state / "daemon.lock"
        self._lock = path.open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DaemonError(f"another daemon is already running for {self.catalog.project.root}") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()

    def running(self) -> list[asyncio.Task[Any]]:
        return [slot.task for slot in self.slots.values() if slot.task is not None and not slot.task.done()]

    # scheduling
    def schedule_all(self) -> None:
        self.scheduler.remove_all_jobs()
        for entry in self.catalog.entries:
            trigger = self.trigger_of(entry) if entry.enabled else None
            if trigger is None:
                continue
            if entry.at is not None and (self.store.entry(entry.id)["last_fire"] or entry.at <= _now()):
                continue  # done already, or missed: catch_up decides
            self.scheduler.add_job(
                self.on_time,
                trigger,
                args=[entry.id],
                id=entry.id,
                coalesce=True,
                max_instances=1000,
                misfire_grace_time=max(1, int(entry.misfire_grace)),
            )

    def catch_up(self) -> None:
        now = _now()
        for entry in self.catalog.entries:
            if not (entry.enabled and entry.catch_up) or time_trigger(entry) is None:
                continue
            last = self.store.entry(entry.id)["last_fire"]
            missed = missed_fire(entry, datetime.fromisoformat(last) if last else None, now)
            if missed is None or not self.claim(entry, missed):
                continue
            late = (now - missed).total_seconds()
            if late <= entry.misfire_grace:
                self.record("catch_up", entry, f"missed {missed.isoformat()} while down; running once")
                self.fire(entry, "catch_up")
            else:
                self.record("skip", entry, f"missed {missed.isoformat()} by {late:.0f}s, beyond misfire_grace")

    def _due(self, event: Any) -> None:
        """APScheduler tells when a job was due just before it runs; the start delay is measured from it."""
        self.due[event.job_id] = event.scheduled_run_times[-1]

    async def on_time(self, entry_id: str) -> None:
        entry = self.entry(entry_id)
        due = self.due.pop(entry_id, None)
        if entry is None:
            return
        if entry.jitter:
            await asyncio.sleep(random.uniform(0, entry.jitter))
        await self.fire_due(entry, due)

    async def fire_due(self, entry: Entry, due: datetime | None) -> None:
        self.fire_on_time(entry, due)

    @_deferred_on_store_error
    def fire_on_time(self, entry: Entry, due: datetime | None) -> None:
        """A time entry is due: fire it if this daemon claims the fire time."""
        if self.claim(entry, due or _now()):
            self.fire(entry, entry.kind, due=due)

    def trigger_of(self, entry: Entry) -> Any:
        """The APScheduler trigger of a time entry (None for event triggers)."""
        return time_trigger(entry)

    def claim(self, entry: Entry, fire: datetime) -> bool:
        """Take a fire time of an entry: True if this daemon runs it (the cluster engine lets one daemon of many)."""
        self.store.update_entry(entry.id, last_fire=_now().isoformat())
        return True

    def entry(self, entry_id: str) -> Entry | None:
        return self.catalog.entry(entry_id)

    # runs
    @_deferred_on_store_error
    def fire(
        self,
        entry: Entry | None,
        trigger: str,
        goal_name: str | None = None,
        follow_up: bool = False,
        due: datetime | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        """A trigger arrived: start the goal, or queue one follow-up, or record why not.

        Every trigger is recorded once, and ends as exactly one `start` or one `skip` event.
        """
        name = entry.goal if entry is not None else goal_name or ""
        if not follow_up:
            self.record("trigger", entry, trigger, goal=name)
        if self.admits(entry, name):
            self.start(entry, trigger, name, due, context)

    def admits(self, entry: Entry | None, name: str) -> bool:
        """Whether a trigger may start goal `name` now; a refusal is recorded as a `skip` with its reason."""
        if self.stopping.is_set():
            self.record("skip", entry, "the daemon is shutting down", goal=name)
        elif entry is not None and self.paused(entry):
            self.record("skip", entry, "the entry is paused (runner resume to restart it)")
        elif entry is not None and entry.until is not None and _now() > entry.until:
            self.record("skip", entry, f"past until {entry.until.isoformat()}")
        elif name not in self.catalog.goals:
            self.record("skip", entry, f"unknown goal {name!r}", goal=name)
        else:
            return not unattended.skip_for_budget(self, self.catalog.goals[name], entry)
        return False

    def paused(self, entry: Entry) -> bool:
        return bool(self.store.entry(entry.id)["paused"])

    def start(
        self, entry: Entry | None, trigger: str, name: str, due: datetime | None, context: dict[str, Any] | None
    ) -> None:
        """Start an admitted goal in this process, or queue its one follow-up, or record why not."""
        slot = self.slots.setdefault(name, Slot())
        if slot.task is not None and not slot.task.done():
            if slot.follow_up is None:
                slot.follow_up, slot.follow_up_context = (entry, trigger), context
                return self.record("queued", entry, "the goal is running; one follow-up run queued", goal=name)
            return self.record("skip", entry, "the goal is running and a follow-up is already queued", goal=name)
        slot.task = asyncio.create_task(self.run_one(self.catalog.goals[name], entry, trigger, due, context))

    async def run_one(
        self,
        goal: Goal,
        entry: Entry | None,
        trigger: str,
        due: datetime | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        try:
            async with self.semaphore:
                if self.stopping.is_set():
                    return self.record("skip", entry, "the daemon is shutting down", goal=goal.name)
                result = await self.execute(goal, entry, trigger, due, context)
            self.finished(goal, entry, result)
        except StoreError as exc:
            log.error("cannot record a run of %s (%s); it is tried again at the next poll", goal.name, exc)
            self.deferred.append(functools.partial(self.fire, entry, trigger, goal.name, due=due, context=context))
        except Exception as exc:  # a broken goal never stops the daemon
            log.exception("goal %s failed", goal.name)
            with contextlib.suppress(StoreError):
                self.record("error", entry, f"{type(exc).__name__}: {exc}", goal=goal.name)
        finally:
            slot = self.slots[goal.name]
            follow_up, slot.follow_up = slot.follow_up, None
            slot.task = None
            if follow_up is not None:
                self.fire(follow_up[0], follow_up[1], goal.name, follow_up=True, context=slot.follow_up_context)

    async def execute(
        self, goal: Goal, entry: Entry | None, trigger: str, due: datetime | None, context: dict[str, Any] | None
    ) -> RunResult:
        """One run of a goal for a trigger, recorded from `start` on (the cluster engine's workers call it too)."""
        self.record("start", entry, f"{trigger} due {due.isoformat()}" if due else trigger, goal=goal.name)
        return await run_goal(
            goal,
            self.store,
            trigger=trigger,
            entry_id=entry.id if entry else None,
            approver=self.approver,
            checks_first=entry.checks_first if entry is not None and entry.checks_first else None,
            context=unattended.context_of(goal, entry, trigger, due, context),
            pass_trigger=entry.pass_trigger if entry is not None else True,
            targets=notify.targets_of(goal.notify, entry.notify if entry is not None else None),
        )

    def finished(self, goal: Goal, entry: Entry | None, result: RunResult) -> None:
        self.record("outcome", entry, f"{result.outcome} run {result.run_id}", goal=goal.name)
        if result.outcome in NOT_COUNTED:
            return
        if entry is not None:
            self.trip_breaker(entry, result.outcome in GOOD)
        for chained in self.catalog.entries:
            if chained.after == goal.name and chained.enabled and _matches(chained.on, result.outcome):
                upstream = unattended.upstream_context(goal.name, result.run_id, result.outcome)
                self.fire(chained, "after", context=upstream)

    def trip_breaker(self, entry: Entry, good: bool) -> None:
        if good:
            return self.store.reset_failures(entry.id)
        failures = self.store.count_failure(entry.id)
        if entry.pause_after and failures >= entry.pause_after:
            self.store.update_entry(entry.id, paused=1)
            detail = f"{failures} runs in a row not achieved; runner resume {entry.goal} restarts it"
            self.record("paused", entry, detail)
            goal = self.catalog.goals.get(entry.goal)
            if goal is not None:
                unattended.tell(self, goal, entry, notify.PAUSED, detail, f"runner runs --goal {entry.goal}")

    # commands, reload
    async def read_commands(self) -> None:
        """Every poll interval: the store's health, fires that waited for it, commands, and a reload when a
        config file changed. A poll that fails is logged; the next one runs all the same."""
        seen = self.stamp
        while True:
            try:
                seen = self.poll(seen)
            except Exception as exc:
                log.error("poll failed (retried in %gs): %s: %s", self.settings.poll_interval, type(exc).__name__, exc)
            await self.until_next_poll()

    async def until_next_poll(self) -> None:
        """The wait between two polls: the poll interval."""
        await asyncio.sleep(self.settings.poll_interval)

    def poll(self, seen: tuple[Any, ...]) -> tuple[Any, ...]:
        problem = self.store.problem()
        if problem is not None:
            self.fail(problem)
            return seen
        waiting, self.deferred = self.deferred, []
        for fire in waiting:
            fire()
        for kind, target, *payload in self.store.take_commands():
            if kind == "trigger":
                self.fire(None, "manual", target, context=unattended.manual_context(payload[0] if payload else None))
        stamp = self.config_stamp()
        if stamp != seen:
            self.reload()
        return stamp

    def fail(self, problem: str) -> None:
        """Something the daemon cannot work around: stop (draining runs) and leave with the reason."""
        if self.failure is None:
            log.error("%s: stopping", problem)
            self.failure = problem
            self.stopping.set()

    def config_stamp(self) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime, size) of the configuration's folders and files, read every poll, so kept cheap: each
        poll reads the two folders, runner.yaml and .env (a file added, removed or replaced by an editor's
        rename shows there at once), and every file's own stamp at most every FULL_STAMP seconds (a file
        edited in place shows within them). With a hundred schedule files this is a tenth of the stats."""
        root = str(self.catalog.project.root)
        quick = tuple(_stamp(os.path.join(root, name)) for name in ("goals", "schedules", "runner.yaml", ".env"))
        if quick == self._quick and time.monotonic() - self._full_at < FULL_STAMP:
            return self._full
        stamps = [s for s in quick if s is not None]
        for folder in ("goals", "schedules"):
            try:
                with os.scandir(os.path.join(root, folder)) as entries:
                    paths = [e.path for e in entries if e.name.endswith((".yaml", ".yml"))]
            except OSError:
                continue
            stamps += [s for s in (_stamp(path) for path in sorted(paths)) if s is not None]
        self._quick, self._full_at, self._full = quick, time.monotonic(), tuple(stamps)
        return self._full

    def reload(self) -> None:
        try:
            catalog = Catalog.load(self.root)
        except ConfigError as exc:
            problems = exc.problems
        except Exception as exc:  # whatever a hostile file does, the last good configuration keeps running
            problems = [f"{type(exc).__name__}: {exc}"]
        else:
            problems = []
        if problems:
            log.error("reload failed; keeping the last good configuration:\n  %s", "\n  ".join(problems))
            self.store.log_event("reload_failed", detail="\n".join(problems))
            return
        self.catalog = catalog
        self.schedule_all()
        if self.scheduler is not None:
            from .listeners import start_listeners

            self.listeners += start_listeners(self, self.sources)
        self.record("reloaded", detail=f"{len(catalog.goals)} goals, {len(catalog.entries)} entries")

    def record(self, kind: str, entry: Entry | None = None, detail: str = "", goal: str | None = None) -> None:
        goal = goal or (entry.goal if entry is not None else None)
        where = f"{goal} [{entry.id}]" if entry is not None else (goal or "")
        log.info("%-9s %s %s", kind, where, detail)
        self.store.log_event(kind, goal, entry.id if entry is not None else None, detail)


def freeze_start_up() -> None:
    """Take what start-up made (modules, classes, the catalog, the scheduler) out of the cyclic garbage
    collector's sight: it lives as long as the process, and each full collection would otherwise walk all of
    it while a burst of runs waits for the event loop."""
    gc.collect()
    gc.freeze()


def log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """One line, not a traceback, for what the event loop could not do (out of descriptors at an accept)."""
    error = context.get("exception")
    log.error("%s%s", context.get("message", "event loop error"), f": {error!r}" if error else "")


def _stamp(path: str) -> tuple[str, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_mtime_ns, stat.st_size)


def _matches(on: str, outcome: str) -> bool:
    return on == "any" or (on == "achieved") == (outcome in GOOD)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def daemon_pid(project: Project) -> int | None:
    """The pid of the daemon running for this project, if one holds the lock."""
    path = project.state / "daemon.lock"
    if not path.exists():
        return None
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            text = handle.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None
