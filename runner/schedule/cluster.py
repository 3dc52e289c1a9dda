"""The cluster engine: with a PostgreSQL store, every run is a Procrastinate job, and any number of daemons
(`runner daemon`: schedule and work) and workers (`runner worker`: only work) share one database.

The local daemon's logic (runner.schedule.daemon) is kept; only where a run starts changes:
- a trigger defers a job `runner.run` with `lock=GOAL` (one run per goal at a time across the cluster) and
  `queueing_lock=GOAL` (at most one waiting follow-up; a further trigger is recorded `skip`);
- a time trigger first claims its (entry, fire time) in the store, a compare-and-set that only moves
  `last_fire` forwards: exactly one daemon fires it, however many scheduled it. `every` entries are laid on
  one grid (from ANCHOR) so that every daemon computes the same fire times;
- the job carries the goal file's content hash; a worker whose copy differs ends the run `error`;
- every process heartbeats (Procrastinate's workers table) and sweeps for jobs of workers that stopped
  answering: their runs become `interrupted` within INTERRUPTED_WITHIN seconds of a kill -9, and the job
  is retried once when the entry says `retry_interrupted: true`. Their process groups are killed when a
  daemon or worker starts again on that machine (the store knows each run's host and pid).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from .. import notify
from ..config import Entry, Goal
from ..errors import DaemonError
from ..store.pgconnect import (
    HOST,
    process_name,
    psycopg_module,
    quiet_connection,
    session,
)
from ..store.postgres import CLAIM_FIRE, COMMANDS_CHANNEL, ENTRY_PAUSED, JOB, PostgresStore
from ..verify import settle_interrupted
from ..work import warm_up
from . import unattended
from .daemon import NOTIFY_GRACE, Daemon, freeze_start_up, log_loop_error
from .jobs import STALLED_AFTER, TASK, make_app, procrastinate_module
from .triggers import time_trigger

log = logging.getLogger("runner.daemon")
ANCHOR = datetime(2000, 1, 1, tzinfo=timezone.utc)
"""`every` entries fire at ANCHOR + phase + k * every on every daemon."""
SPREAD = 60.0
"""An `every` entry's phase: a fixed fraction (from its id) of its interval, at most this many seconds, so that
a hundred entries of one interval do not all fire in the same instant and queue behind each other."""
HEARTBEAT = 2.0
"""Seconds between a worker's heartbeats."""
SWEEP = 2.0
"""Seconds between two looks for stalled jobs, in every daemon and worker."""
JOB_POLL = 5.0
"""Seconds between a worker's looks for jobs it was not told of: new jobs and follow-ups whose goal's run ended
wake every worker at once (LISTEN/NOTIFY; runner's schema adds the notice Procrastinate lacks for the latter)."""
GATHER = 0.05
"""Seconds a daemon waits after a command's notice before it reads the commands: a burst is read in one go."""
LISTEN_RETRY = 5.0
"""Seconds before listening for commands again after the connection for it failed."""
ALREADY_QUEUED = "a run is already queued (one follow-up at most)"
INTERRUPTED_WITHIN = STALLED_AFTER + HEARTBEAT + SWEEP
"""The bound on the time from a worker's kill -9 to its run being `interrupted` (while another process runs)."""


@dataclass
class Fire:
    """An admitted trigger waiting to become a job."""

    entry: Entry | None
    trigger: str
    goal: Goal
    due: datetime | None
    context: dict[str, Any] | None
    jobs: set[str] | None = None
    """The goal's job states as the claim of this fire read them (None: not known, asked before deferring)."""


class Cluster(Daemon):
    """A daemon (`schedules=True`) or a worker on a PostgreSQL store."""

    def __init__(self, root: Any = None, schedules: bool = True, concurrency: int | None = None) -> None:
        super().__init__(root)
        if not isinstance(self.store, PostgresStore):
            raise DaemonError("the cluster engine needs `store: postgresql://...` in runner.yaml")
        self.schedules = schedules
        self.catalog.project.state.mkdir(parents=True, exist_ok=True)
        self.concurrency = concurrency or self.settings.max_concurrent_runs
        self.name = process_name("daemon" if schedules else "worker")
        self.app = make_app(self.store.url, self.name)
        self.app.task(name=TASK, pass_context=True)(self.run_job)
        self.queue = make_app(self.store.url, self.name)
        """Defers on a pool of their own: a burst of triggers never makes the worker wait for a connection."""
        self.worker: asyncio.Task[Any] | None = None
        self.deferring: set[asyncio.Task[Any]] = set()
        self.to_defer: list[Fire] = []
        """Fires admitted in this turn of the event loop, deferred together by `defer_pending`."""
        self.digests: dict[tuple[str, int, int], str] = {}
        self.refreshed = 0.0
        self.paused_when_claimed: dict[str, bool] = {}
        self.jobs_when_claimed: dict[str, set[str]] = {}
        self.waking: asyncio.Future[bool] | None = None
        """What the command reader waits on between polls: True when a command's notice came, False at the poll."""
        self.heard_meanwhile = False
        """A notice came while the reader was not waiting (it was polling): it polls again at once."""

    # lifecycle
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(log_loop_error)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        for run_id in settle_interrupted(self.store):
            self.record("interrupted", detail=f"run {run_id} was left running on {HOST} by a process that is gone")
            unattended.tell_interrupted(self, run_id)
        warm_up()  # once here, not inside the first run while others wait
        assert isinstance(self.store, PostgresStore)
        self.store.start_writer()

        async with self.app.open_async(), self.queue.open_async():
            await self.check_queue()
            if self.schedules:
                self.start_scheduling()
            self.listeners.append(asyncio.create_task(self.sweep_stalled()))
            self.worker = asyncio.create_task(self.work())
            self.stamp = self.config_stamp()
            freeze_start_up()
            log.info(
                "%s started on %s: %d goals, %d entries, max %d runs at once, store %s",
                "daemon" if self.schedules else "worker",
                HOST,
                len(self.catalog.goals),
                len(self.catalog.entries) if self.schedules else 0,
                self.concurrency,
                self.store.where,
            )
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait([stop, self.worker], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if self.worker.done() and not self.stopping.is_set():
                self.failure = f"the Procrastinate worker stopped ({_reason(self.worker)})"
            await self.shutdown()
        if self.failure is not None:
            raise DaemonError(f"{self.failure}; the {'daemon' if self.schedules else 'worker'} stopped")

    async def check_queue(self) -> None:
        if not await self.app.check_connection_async():
            raise DaemonError(f"the database {self.store.where} has no Procrastinate schema: run `runner db migrate`")

    async def work(self) -> None:
        await self.app.run_worker_async(
            name=f"{HOST}:{os.getpid()}",
            concurrency=self.concurrency,
            install_signal_handlers=False,
            shutdown_graceful_timeout=self.settings.shutdown_grace,
            update_heartbeat_interval=HEARTBEAT,
            stalled_worker_timeout=STALLED_AFTER,
            fetch_job_polling_interval=JOB_POLL,
            abort_job_polling_interval=1.0,
            delete_jobs="successful",
        )

    async def shutdown(self) -> None:
        log.info("shutting down: no new runs; running ones get %gs to finish", self.settings.shutdown_grace)
        self.stopping.set()
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
        for task in self.listeners:
            task.cancel()
        for task in list(self.approver.waiting):  # waiting on a person: kept `awaiting_approval`, not drained
            task.cancel()
        if self.deferring:
            await asyncio.wait(self.deferring)
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()  # Procrastinate stops fetching, drains for shutdown_grace, then aborts the rest
        if self.worker is not None:
            await asyncio.gather(self.worker, return_exceptions=True)
        await notify.drain(NOTIFY_GRACE)
        self.store.close()
        log.info("%s stopped", "daemon" if self.schedules else "worker")

    # scheduling: the local daemon's, on one grid and with claimed fire times
    def trigger_of(self, entry: Entry) -> Any:
        if entry.every is not None:
            from apscheduler.triggers.interval import IntervalTrigger

            start = ANCHOR + timedelta(seconds=phase(entry))
            return IntervalTrigger(seconds=entry.every, start_date=start, end_date=entry.until, timezone=timezone.utc)
        return time_trigger(entry)

    def claim(self, entry: Entry, fire: datetime) -> bool:
        assert isinstance(self.store, PostgresStore)
        return self.store.claim_fire(entry.id, fire)

    async def fire_due(self, entry: Entry, due: datetime | None) -> None:
        """A time entry is due: its fire time is claimed on the queue's own connections, a round trip the event
        loop does not stand still for (a second of a hundred `every: 1s` entries held it for a hundred), which
        also reads the entry's pause and its goal's jobs (no further round trip before the job is deferred);
        a claim the database refuses is fired again at the next poll, as with one daemon."""
        try:
            rows = await self.queue.connector.execute_query_all_async(
                CLAIM_FIRE_AND_JOBS, entry=entry.id, fire=due or datetime.now(timezone.utc), goal=entry.goal
            )
        except Exception as exc:
            log.error("cannot record a fire (%s); it is tried again at the next poll", _reason_of(exc))
            self.deferred.append(functools.partial(self.fire_on_time, entry, due))
            return
        if rows:
            self.paused_when_claimed[entry.id] = bool(rows[0]["paused"])
            self.jobs_when_claimed[entry.goal] = set(rows[0]["jobs"] or ())
            try:
                self.fire(entry, entry.kind, due=due)
            finally:
                self.paused_when_claimed.pop(entry.id, None)
                self.jobs_when_claimed.pop(entry.goal, None)

    def paused(self, entry: Entry) -> bool:
        """As the claim just read it, for the fire it claimed; else from the store."""
        known = self.paused_when_claimed.pop(entry.id, None)
        return super().paused(entry) if known is None else known

    async def paused_now(self, entry: Entry) -> bool:
        rows = await self.queue.connector.execute_query_all_async(ENTRY_PAUSED, entry=entry.id)
        return bool(rows and rows[0]["paused"])

    def schedule_all(self) -> None:
        if self.scheduler is not None:
            super().schedule_all()

    # triggers become jobs
    def fire(
        self,
        entry: Entry | None,
        trigger: str,
        goal_name: str | None = None,
        follow_up: bool = False,
        due: datetime | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        if trigger == "watch" and entry is not None and not self.claim(entry, _window(entry.debounce)):
            return  # another daemon watching the same files fired this change
        super().fire(entry, trigger, goal_name, follow_up, due, context)

    def admits(self, entry: Entry | None, name: str) -> bool:
        if not super().admits(entry, name):
            return False
        if entry is not None and entry.watch and "doing" in self.jobs_of(name):
            self.record("skip", entry, "a watched file changed while the goal ran (its own writes do not retrigger it)")
            return False
        return True

    def start(
        self, entry: Entry | None, trigger: str, name: str, due: datetime | None, context: dict[str, Any] | None
    ) -> None:
        """Defer a job for the admitted goal: `queued` when it runs elsewhere now, `skip` when one already waits,
        `start` when a worker takes it. The fires of one turn of the event loop (a poll's commands, entries
        due together) are deferred together, with one look at the goals' jobs and one INSERT."""
        jobs = self.jobs_when_claimed.pop(name, None)
        self.to_defer.append(Fire(entry, trigger, self.catalog.goals[name], due, context, jobs))
        if len(self.to_defer) == 1:
            task = asyncio.create_task(self.defer_pending())
            self.deferring.add(task)
            task.add_done_callback(self.deferring.discard)

    async def defer_pending(self) -> None:
        procrastinate = procrastinate_module()
        fires, self.to_defer = self.to_defer, []
        unknown = {fire.goal.name for fire in fires if fire.jobs is None}
        try:
            states = await self.jobs_of_goals(unknown) if unknown else {}
        except Exception as exc:  # the database went away: the triggers are lost, and say so
            for fire in fires:
                self.cannot_queue(fire, exc)
            return
        for fire in fires:
            if fire.jobs is not None:
                states.setdefault(fire.goal.name, set()).update(fire.jobs)
        jobs: list[tuple[Fire, Any, bool]] = []
        for fire in fires:
            known = states.setdefault(fire.goal.name, set())
            if "todo" in known:  # the queueing lock would refuse another: cheaper to ask first
                self.already_queued(fire)
                continue
            running = "doing" in known
            known.add("todo")
            jobs.append((fire, self.job(fire, follow_up=running), running))
        if not jobs:
            return
        manager = self.queue.job_manager
        try:
            await manager.batch_defer_jobs_async([job for _, job, _ in jobs])
            deferred = [(fire, running) for fire, _, running in jobs]
        except procrastinate.exceptions.AlreadyEnqueued:  # one of them raced another daemon: each on its own
            deferred = []
            for fire, job, running in jobs:
                try:
                    await manager.defer_job_async(job)
                except procrastinate.exceptions.AlreadyEnqueued:
                    self.already_queued(fire)
                except Exception as exc:
                    self.cannot_queue(fire, exc)
                else:
                    deferred.append((fire, running))
        except Exception as exc:  # the database went away: the triggers are lost, and say so
            for fire, _, _ in jobs:
                self.cannot_queue(fire, exc)
            return
        for fire, running in deferred:
            if running:
                self.record("queued", fire.entry, "the goal is running; one follow-up run queued", goal=fire.goal.name)

    def job(self, fire: Fire, follow_up: bool) -> Any:
        """The Procrastinate job of a fire: one at a time per goal (`lock`), one waiting at most (`queueing_lock`)."""
        args = {
            "goal": fire.goal.name,
            "entry_id": fire.entry.id if fire.entry else None,
            "trigger": fire.trigger,
            "digest": self.digest(fire.goal),
            "due": fire.due.isoformat() if fire.due and not follow_up else None,  # a follow-up is not on time
            "context": fire.context,
        }
        deferrer = self.queue.configure_task(TASK, lock=fire.goal.name, queueing_lock=fire.goal.name)
        return deferrer.make_new_job(**args)

    def already_queued(self, fire: Fire) -> None:
        self.record("skip", fire.entry, ALREADY_QUEUED, goal=fire.goal.name)

    def cannot_queue(self, fire: Fire, exc: Exception) -> None:
        self.record("error", fire.entry, f"cannot queue the run: {_reason_of(exc)}", goal=fire.goal.name)

    async def jobs_of_goals(self, goals: set[str]) -> dict[str, set[str]]:
        """`jobs_of` for several goals in one query, on the queue's connections (a goal without such jobs is left
        out)."""
        rows = await self.queue.connector.execute_query_all_async(JOB_STATES, goals=sorted(goals))
        return _states(rows)

    def jobs_of(self, goal: str) -> set[str]:
        """The states of the goal's jobs now: `doing` (it runs somewhere in the cluster), `todo` (one waits)."""
        assert isinstance(self.store, PostgresStore)
        rows = self.store.exec(JOB_STATES, {"goals": [goal]}, after_writes=False).fetchall()
        return _states(rows).get(goal, set())

    def digest(self, goal: Goal) -> str:
        path = _goal_file(goal)
        try:
            stat = path.stat()
        except OSError:
            return "missing"
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self.digests:
            self.digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        return self.digests[key]

    # the job: one run
    async def run_job(
        self,
        job: Any,
        goal: str,
        entry_id: str | None,
        trigger: str,
        digest: str,
        due: str | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        self.refresh()
        entry = self.entry(entry_id) if entry_id else None
        the_goal = self.catalog.goals.get(goal)
        token = JOB.set(job.job.id)
        try:
            if entry is not None and await self.paused_now(entry):  # paused while the job waited
                return self.record("skip", entry, "the entry is paused (runner resume to restart it)")
            if job.job.attempts:
                trigger = "retry"
            refused = self.missing(goal) if the_goal is None else self.mismatch(the_goal, digest)
            if refused is not None or the_goal is None:
                run_id = self.store.new_run(goal, trigger, entry_id)
                self.store.finish_run(run_id, "error", error=refused)
                return self.record("error", entry, f"run {run_id}: {refused}", goal=goal)
            when = datetime.fromisoformat(due) if due else None
            self.finished(the_goal, entry, await self.execute(the_goal, entry, trigger, when, context))
        except Exception as exc:  # a broken goal never stops the worker
            log.exception("goal %s failed", goal)
            self.record("error", entry, f"{type(exc).__name__}: {exc}", goal=goal)
        finally:
            JOB.reset(token)

    def refresh(self) -> None:
        """A worker reloads changed goal files before a run, at most once per poll interval (a daemon's own
        poll does it already)."""
        if self.schedules or time.monotonic() - self.refreshed < self.settings.poll_interval:
            return
        self.refreshed = time.monotonic()
        stamp = self.config_stamp()
        if stamp != self.stamp:
            self.stamp = stamp
            self.reload()

    @staticmethod
    def missing(goal: str) -> str:
        return (
            f"goal {goal!r} is not in this checkout on {HOST} (goals/{goal}.yaml is missing or invalid here):"
            " update this machine's checkout"
        )

    def mismatch(self, goal: Goal, digest: str) -> str | None:
        mine = self.digest(goal)
        if mine == digest:
            return None
        return (
            f"{goal.source} on {HOST} differs from the copy the scheduler read (content hash {mine} here,"
            f" {digest} in the job): update this machine's checkout"
        )

    # commands, read as soon as they are sent
    def start_scheduling(self) -> None:
        super().start_scheduling()
        self.listeners.append(asyncio.create_task(self.hear_commands()))

    async def hear_commands(self) -> None:
        """Listen for the notice each command sends (LISTEN/NOTIFY): a trigger from `runner trigger`, the
        dashboard or runner's MCP server reaches a daemon at once instead of at its next poll. Once listening,
        it reads the commands (one sent before the LISTEN had no one to tell); while it cannot listen (the
        database away), the commands are still read every poll interval."""
        psycopg = psycopg_module()
        while True:
            try:
                async with await quiet_connection().connect(
                    self.store.url,
                    autocommit=True,
                    connect_timeout=10,
                    application_name=self.name,
                    **session(self.store.url),
                ) as connection:
                    await connection.execute(f"LISTEN {COMMANDS_CHANNEL}")
                    self.command_heard()
                    async for _notice in connection.notifies():
                        self.command_heard()
            except psycopg.Error as exc:
                log.warning("listening for commands failed (retried in %gs): %s", LISTEN_RETRY, _reason_of(exc))
            await asyncio.sleep(LISTEN_RETRY)

    def command_heard(self) -> None:
        if self.waking is not None and not self.waking.done():
            self.waking.set_result(True)
        else:
            self.heard_meanwhile = True

    async def until_next_poll(self) -> None:
        """The poll interval, or a moment after a command was sent (the rest of a burst comes with it). A
        future and a timer, as cheap as the plain sleep: an idle daemon wakes for this twice a second."""
        if not self.heard_meanwhile:
            loop = asyncio.get_running_loop()
            self.waking = waking = loop.create_future()
            timer = loop.call_later(self.settings.poll_interval, _settle, waking, False)
            try:
                if not await waking:
                    return
            finally:
                timer.cancel()
                self.waking = None
        await asyncio.sleep(GATHER)
        self.heard_meanwhile = False  # what came meanwhile is read by the poll that follows

    # workers that died
    async def sweep_stalled(self) -> None:
        while True:
            await asyncio.sleep(SWEEP)
            try:
                manager = self.app.job_manager
                for job in await manager.get_stalled_jobs(task_name=TASK, seconds_since_heartbeat=STALLED_AFTER):
                    await self.interrupted(job)
            except Exception as exc:  # the database is away for a moment: look again next time
                log.warning("looking for stalled jobs failed: %s", exc)

    async def interrupted(self, job: Any) -> None:
        """A job whose worker stopped answering: its run becomes `interrupted`; retried once if the entry says so."""
        assert isinstance(self.store, PostgresStore)
        procrastinate = procrastinate_module()
        args = job.task_kwargs
        entry = self.entry(args.get("entry_id")) if args.get("entry_id") else None
        why = f"the worker running it stopped answering (no heartbeat for {STALLED_AFTER:g}s)"
        for run_id in self.store.interrupt_job_runs(job.id, why):
            self.record("interrupted", entry, f"run {run_id}: {why}", goal=args.get("goal"))
            unattended.tell_interrupted(self, run_id)
        retry = entry is not None and entry.retry_interrupted and not job.attempts
        try:
            if retry:
                await self.app.job_manager.retry_job_by_id_async(job.id, retry_at=datetime.now(timezone.utc))
                self.record("retry", entry, f"job {job.id} queued again (retry_interrupted)", goal=args.get("goal"))
            else:
                await self.app.job_manager.finish_job_by_id_async(
                    job.id, status=procrastinate.jobs.Status.FAILED, delete_job=False
                )
        except procrastinate.exceptions.ConnectorException as exc:
            if "status" not in str(exc):  # another process handled this job first: nothing to do
                self.record("error", entry, f"job {job.id}: {exc}", goal=args.get("goal"))
                await self.app.job_manager.finish_job_by_id_async(
                    job.id, status=procrastinate.jobs.Status.FAILED, delete_job=False
                )


def next_on_grid(entry: Entry, after: datetime) -> datetime | None:
    """An `every` entry's first fire time after `after` on the cluster's grid (what every daemon fires), or None
    past its `until`."""
    every = timedelta(seconds=float(entry.every or 0))
    start = ANCHOR + timedelta(seconds=phase(entry))
    fire = start + ((after - start) // every + 1) * every
    return None if entry.until is not None and fire > entry.until else fire


def phase(entry: Entry) -> float:
    """Where in its interval an `every` entry fires: the same on every daemon (from the entry's id)."""
    fraction = int(hashlib.sha256(entry.id.encode()).hexdigest()[:12], 16) / 16**12
    return round(fraction * min(float(entry.every or 0), SPREAD), 3)


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _reason(task: asyncio.Task[Any]) -> str:
    error = None if task.cancelled() else task.exception()
    return f"{type(error).__name__}: {error}" if error else "it lost its database connection"


CLAIM_FIRE_AND_JOBS = (
    f"{CLAIM_FIRE}, ARRAY(SELECT DISTINCT status::text FROM procrastinate_jobs"
    " WHERE lock = %(goal)s AND status IN ('todo', 'doing')) AS jobs"
)
"""CLAIM_FIRE that also returns the states of the goal's jobs (those JOB_STATES reads), in the same round trip."""
JOB_STATES = (
    "SELECT DISTINCT lock, status::text AS s FROM procrastinate_jobs"
    " WHERE lock = ANY(%(goals)s) AND status IN ('todo', 'doing')"
)


def _states(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    states: dict[str, set[str]] = {}
    for row in rows:
        states.setdefault(row["lock"], set()).add(row["s"])
    return states


def _reason_of(exc: Exception) -> str:
    """The database's own words for a failed query (Procrastinate wraps them in a bare ConnectorException)."""
    cause = exc.__cause__ or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def _goal_file(goal: Goal) -> Path:
    path = Path(goal.source or f"goals/{goal.name}.yaml")
    return path if path.is_absolute() else goal.root / path


def _window(seconds: float) -> datetime:
    """The start of the debounce window this moment falls in (the same for daemons watching the same files)."""
    step = max(float(seconds), 1.0)
    stamp = datetime.now(timezone.utc).timestamp()
    return datetime.fromtimestamp(stamp - stamp % step, timezone.utc)


async def run_daemon(root: Any) -> None:
    """`runner daemon` on a PostgreSQL store: schedule and work until SIGTERM or SIGINT."""
    await Cluster(root).run()


async def run_worker(root: Any, concurrency: int | None = None) -> None:
    """`runner worker`: only work the jobs, until SIGTERM or SIGINT."""
    await Cluster(root, schedules=False, concurrency=concurrency).run()
