"""The verify loop (middle): work, then the acceptance checks; failures go back to the model, up to N attempts.

    for attempt in 1..max_attempts:
        work loop -> tamper lock -> checks -> all pass? achieved : feedback -> before_retry -> retry

The machine, not the model, decides when a goal is done. Every attempt and check is written to the
store and the transcript as it happens. The verify loop knows nothing of the daemon and never prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from .. import notify, prompts
from ..config import Check, Goal, NotifyTarget
from ..errors import RunnerError
from ..store import Store, now
from ..vocabulary import Event, Outcome, StopReason
from ..work import Model, Observer, Reply, Toolbox, WorkLoop, WorkResult, ignore
from ..work.cost import Pricer
from ..work.loop import READ_ONLY
from ..work.tools.paths import PathGuard
from ..work.tools.process import run_env, run_process, scrub_env, spawned
from ..work.tools.sandbox import contained, jail_refused, sandbox_status
from .approval import StoreApprover
from .changes import Changes, listing
from .checks import Approver, CheckContext, CheckResult, run_checks
from .claims import claimed
from .feedback import Feedback, describe_failures, signature
from .resume import Resume
from .tamper import Snapshot, shown
from .trigger import prompt_block, write_context


@dataclass
class RunResult:
    run_id: str
    goal: str
    outcome: Outcome = "error"
    attempts: int = 0
    steps: int = 0
    tokens: int = 0
    stop_reason: str | None = None
    duration_s: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    final_message: str | None = None
    error: str | None = None
    cost_usd: float | None = None
    """US dollars of the run's replies; None when the model's price is unknown."""
    continues: str | None = None
    """The run this one picked back up (runner continue)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "goal": self.goal,
            "outcome": self.outcome,
            "attempts": self.attempts,
            "steps": self.steps,
            "tokens": self.tokens,
            "stop_reason": self.stop_reason,
            "duration_s": round(self.duration_s, 3),
            "checks": [{"name": c.name, "passed": c.passed, "exit_code": c.exit_code} for c in self.checks],
            "final_message": self.final_message,
            "error": self.error,
            "cost_usd": self.cost_usd,
            "continues": self.continues,
        }


async def run_goal(
    goal: Goal,
    store: Store,
    *,
    trigger: str = "manual",
    entry_id: str | None = None,
    observe: Observer = ignore,
    approver: Approver | None = None,
    checks_first: bool | None = None,
    context: dict[str, Any] | None = None,
    pass_trigger: bool = True,
    targets: list[NotifyTarget] | None = None,
    resume: Resume | None = None,
) -> RunResult:
    """Run one goal once, work + verify, and record it. Cancellation ends it `cancelled`, not with an exception.

    `context` is what triggered the run (trigger.json, RUNNER_TRIGGER_FILE, and with `pass_trigger` a block
    in the first prompt); `targets` are the notification targets (default the goal's); `resume` picks an
    earlier run's conversation back up (runner continue).
    """
    run_id = store.new_run(goal.name, trigger, entry_id)
    continues = resume.run_id if resume is not None else None
    if continues:
        store.update_run(run_id, continues=continues)
    result = RunResult(run_id, goal.name, continues=continues)
    try:
        transcript = store.transcript(run_id)
    except OSError as exc:  # an unwritable state folder, no file descriptors left
        return abandon(store, result, exc)

    def record(kind: str, data: dict[str, Any]) -> None:
        transcript.append(kind, data)
        observe(kind, data)

    verifier = Verifier(goal, store, result, record, approver)
    try:
        record(Event.RUN, {"run_id": run_id, "goal": goal.name, "trigger": trigger, "continues": continues})
        record(Event.SANDBOX, {"status": sandbox_status(goal)})
        spawned.set(lambda pid, alive: store.track_process(run_id, pid, alive))
        verifier.entry_id, verifier.resume = entry_id, resume
        verifier.targets = targets if targets is not None else goal.notify
        if context is not None:
            record(Event.TRIGGER, {"context": context})
            verifier.context = context  # trigger.json: written before the first tool or check (Verifier.run)
            verifier.trigger_block = prompt_block(context) if pass_trigger else None
        return await verifier.run(goal.verify.checks_first if checks_first is None else checks_first)
    except Exception as exc:  # recording itself failed (a full disk): the row still gets its outcome
        return abandon(store, result, exc)
    finally:
        with contextlib.suppress(OSError):
            transcript.close()


def unexpected(exc: Exception) -> str:
    """What a user reads when the run failed in a way nothing above caught."""
    if isinstance(exc, OSError):
        return f"the run could not go on: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
    return f"internal error ({type(exc).__name__}: {exc}); please report it"


def abandon(store: Store, result: RunResult, exc: Exception) -> RunResult:
    """End the run `error` in the store when even its transcript or recording failed: never left `running`."""
    result.outcome, result.error = "error", unexpected(exc)
    counts = {"attempts": result.attempts, "steps": result.steps, "tokens": result.tokens}
    with contextlib.suppress(Exception):  # a store that cannot be written: the daemon's restart marks it
        store.finish_run(result.run_id, "error", error=result.error, **counts)
    return result


def _some(paths: list[str], most: int = 10) -> str:
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


def _writable(goal: Goal) -> Any:
    """Whether the agent may write a path given relative to the goal's workdir, as the tools decide it for
    this run (check inputs are the files that exist now)."""
    guard = PathGuard.for_goal(goal)

    def writable(path: str) -> bool:
        rel = guard.relative((goal.workpath / path).resolve())
        return rel is None or not guard.protected(rel)

    return writable


@dataclass
class FirstCall:
    """The first attempt's first model call, sent before the run sets up (see Verifier._ask_first)."""

    messages: list[dict[str, Any]]
    schemas: list[dict[str, Any]]
    reply: asyncio.Future[Reply]
    sent: float
    answered: float | None = None

    def __post_init__(self) -> None:
        self.reply.add_done_callback(lambda _: setattr(self, "answered", time.monotonic()))

    def started(self) -> float:
        """When the attempt started, for its time limit: the model's time for this reply counts, a wait for
        another run's claim after it does not."""
        if self.answered is None:
            return self.sent
        return time.monotonic() - (self.answered - self.sent)

    def discard(self) -> None:
        """Cancel the call if it is still out; a reply nobody used is dropped, its error too."""
        if not self.reply.done():
            self.reply.cancel()
        elif not self.reply.cancelled():
            self.reply.exception()


class Verifier:
    def __init__(self, goal: Goal, store: Store, result: RunResult, record: Observer, approver: Approver | None):
        self.goal, self.store, self.result, self.record, self.approver = goal, store, result, record, approver
        self.started = time.monotonic()
        self.model: Model | None = None
        self.judge: Model | None = None
        self.feedback = Feedback(goal.workpath, goal.prompt)
        self.work: WorkLoop | None = None
        self.pricer: Pricer | None = None
        self.entry_id: str | None = None
        self.targets: list[NotifyTarget] = []
        self.trigger_block: str | None = None
        self.context: dict[str, Any] | None = None
        """What triggered the run, for trigger.json; None once written (or when nothing did)."""
        self.resume: Resume | None = None
        self.told_waiting = False
        self.first_call: FirstCall | None = None
        self.attempt_open = False
        self.snapshot: Snapshot | None = None

    async def run(self, checks_first: bool) -> RunResult:
        goal = self.goal
        try:
            first_feedback = None
            if checks_first:
                self._write_context()
                results = await self._checks(0)
                if all(r.passed for r in results):
                    return self._finish("satisfied")
                checks = describe_failures(results, goal.workpath)
                first_feedback = prompts.CHECKS_FAILED_BEFORE_WORK.format(checks=checks)
            self.model = Model.open(goal.model, goal.root)
            self.pricer = Pricer.for_model(goal.model, self.model.url)
            if not self.pricer.known:
                self.record(Event.PRICE_UNKNOWN, {"model": goal.model.name, "reason": self.pricer.unknown})
            self.judge = Model.open(goal.judge_model, goal.root) if goal.judge_model else self.model
            await self._ask_first(first_feedback)
            self._write_context()
            async with claimed(goal, self.result.run_id, self._waiting), Toolbox.open(goal) as toolbox:
                return await self._attempts(toolbox, first_feedback)
        except asyncio.CancelledError:
            if self.work is not None and self.work.result is not None:  # cancelled inside the work loop
                self._end_attempt(self.result.attempts, self.work.result)
            else:  # between an attempt's start and its work loop (its first reply out, waiting for a claim)
                self._end_open_attempt("cancelled")
            return self._finish("cancelled", error="cancelled before the goal finished")
        except RunnerError as exc:
            self._end_open_attempt("error", str(exc))
            return self._finish("error", error=str(exc))
        except Exception as exc:  # the last resort: a bug or a failing disk still ends the run with an outcome
            with contextlib.suppress(Exception):
                self._end_open_attempt("error", unexpected(exc))
            return self._finish("error", error=unexpected(exc))
        finally:
            if self.context is not None:  # the run ended before it set up: the file is still left for the user
                with contextlib.suppress(OSError):
                    self._write_context()
            if self.first_call is not None:
                self.first_call.discard()
            for model in {id(m): m for m in (self.model, self.judge) if m is not None}.values():
                await model.aclose()

    def _write_context(self) -> None:
        """Write trigger.json and name it in RUNNER_TRIGGER_FILE for the run's processes (the jail binds it),
        once, before the first check or tool runs: a file created on the way to the first call would hold
        back every run of a burst behind it."""
        if self.context is not None:
            context, self.context = self.context, None
            path = write_context(self.store, self.result.run_id, context, self.goal.root)
            run_env.set({"RUNNER_TRIGGER_FILE": str(path)})

    async def _ask_first(self, first_feedback: str | None) -> None:
        """Send the first attempt's first model call before the run sets up, and wait for its reply: the claim,
        the jail and the snapshot are made once the model has answered, before any tool runs. A burst of runs
        so gets every first request out before any of them spends its CPU on set-up (the sandbox set-up of
        200 runs otherwise stands between the first request and the last).

        Not for a continued run, nor a goal with MCP servers (their tools are known once they run), nor one
        whose required jail cannot run (it ends `error` without a call). A run that must wait for another
        run's claim waits with its reply in hand."""
        goal = self.goal
        schemas = None if self.resume is not None or jail_refused(goal) else Toolbox.schemas_of(goal)
        if schemas is None:
            return
        assert self.model is not None
        messages = self._conversation(first_feedback)
        self._begin_attempt(1, goal.verify.max_attempts)
        self.record(Event.STEP, {"step": 1})
        call = asyncio.ensure_future(self.model.chat(messages, schemas))
        self.first_call = FirstCall(messages, schemas, call, time.monotonic())
        await asyncio.wait([call], timeout=goal.limits.timeout)  # past it, the work loop stops with `timeout`

    async def _attempts(self, toolbox: Toolbox, first_feedback: str | None) -> RunResult:
        """Work, then check, up to max_attempts; the outcome of the run."""
        goal, verify = self.goal, self.goal.verify
        early = self.first_call
        if early is not None:
            messages = early.messages
        else:
            messages = self._resumed() if self.resume is not None else self._conversation(first_feedback)
        first = self.resume.first_attempt if self.resume is not None else 1
        last = first + verify.max_attempts - 1
        if verify.checks and last > first:
            self.feedback.writable = _writable(goal)  # the files the feedback may point the agent at
        failing: list[tuple[Any, ...]] = []
        commands = any(check.kind == "run" for check in verify.checks)
        for attempt in range(first, last + 1):
            answered = early if early is not None and attempt == first else None  # begun in _ask_first
            if answered is None:
                self._begin_attempt(attempt, last)
            assert self.model is not None
            after_feedback = attempt > first or first_feedback is not None
            acting = ", ".join(name for name in toolbox.tools if name not in READ_ONLY) or ", ".join(toolbox.tools)
            need = self.feedback.need if attempt > first else ""
            nudge = prompts.NUDGE.format(tools=acting, need=need) if verify.nudge and after_feedback else None
            self.work = WorkLoop(self.model, toolbox, goal.limits, self.record, self.pricer, nudge=nudge)
            self.work.before_writing = self._fingerprint
            if answered is not None and answered.schemas == toolbox.schemas:  # else asked again, with the tools
                self.work.first, self.work.started = answered.reply, answered.started()
            before = listing(goal.workpath) if verify.checks and attempt < last else None  # for the feedback
            async with contained(self.result.run_id):  # every process the attempt started is gone before the checks
                work = await self.work.run(messages)
            if answered is not None:
                answered.discard()  # unused only when the attempt stopped before its first step
            after = listing(goal.workpath) if before is not None else None
            changes = Changes.between(before, after) if before is not None and after is not None else None
            self._end_attempt(attempt, work)
            if tampered := self._tampered("the attempt"):
                return tampered
            if work.stop_reason == "error":
                return self._finish("error", error=work.error)
            if commands:
                self._fingerprint()
            results = await self._checks(attempt)
            ran = any(r.kind == "run" and not r.skipped for r in results)  # only a command can write
            if ran and (tampered := self._tampered("something while the checks ran", checks_ran=True)):
                return tampered
            if not verify.checks:
                return self._finish("achieved" if work.stop_reason == "completed" else "not_achieved")
            if all(r.passed for r in results):
                return self._finish("achieved")
            if any(r.kind == "approve" and not r.passed and not r.skipped for r in results):
                return self._finish("rejected", error=next(r.reason for r in results if r.kind == "approve"))
            failing.append(signature(results))
            if attempt == last:
                break
            if len(failing) >= verify.stuck_after and len(set(failing[-verify.stuck_after :])) == 1:
                return self._finish(
                    "stuck", error=f"the same checks failed the same way {verify.stuck_after} attempts in a row"
                )
            messages = await self._retry(attempt, results, messages, changes)
            if verify.before_retry:
                self.snapshot = None  # the user's reset command may change protected files; fingerprint anew
        return self._finish("not_achieved")

    def _fingerprint(self) -> None:
        """The tamper lock's baseline, taken before the first thing of the run that may write: a round with a
        tool that may (the shell, write_file, a command or MCP tool), or the checks' commands. Kept across
        attempts. An attempt whose agent only read leaves nothing to compare, and is not walked for it."""
        if self.snapshot is None:
            self.snapshot = Snapshot.take(self.goal)

    def _tampered(self, who: str, *, checks_ran: bool = False) -> RunResult | None:
        """The run ends `tampered` when protected paths changed since the snapshot; what changed is kept in
        `.runner/tampered/<run id>/` (the change may be a person's), then put back.
        Without a snapshot nothing that may write has run since the last one: nothing to compare."""
        snapshot = self.snapshot
        if snapshot is None:
            return None
        try:
            changed = snapshot.changes(checks_ran=checks_ran)
        except Exception as exc:  # what cannot be checked counts as changed: the machine decides, not the model
            return self._finish(
                "tampered", error=f"{who}: the protected files could not be checked ({unexpected(exc)})"
            )
        if not changed:
            return None
        kept = snapshot.keep(changed, self.result.run_id)
        try:
            failed = snapshot.restore(changed)
        except Exception as exc:
            failed = [f"the restore stopped ({unexpected(exc)})"]
        notes = [f"could not put back: {_some(failed)}" if failed else "their original content was put back"]
        if kept.paths:
            notes.append(f"the changed versions are kept in {kept.folder}")
        if kept.missed:
            notes.append(f"not kept: {_some(kept.missed)}")
        return self._finish(
            "tampered",
            error=f"{who} changed protected files: {_some([shown(p) for p in changed])} ({'; '.join(notes)})",
        )

    def _waiting(self, runs: list[str]) -> None:
        self.record(Event.CLAIM_WAIT, {"runs": runs})

    async def _retry(
        self, attempt: int, results: list[CheckResult], messages: list[dict[str, Any]], changes: Changes | None
    ) -> list[dict[str, Any]]:
        """Feedback for the next attempt: appended to the conversation, or a fresh one holding it."""
        feedback = self.feedback.after(attempt, results, changes)
        self.record(Event.FEEDBACK, {"attempt": attempt, "text": feedback, **self.feedback.sections})
        await self._before_retry()
        if self.goal.verify.fresh_context:
            return self._conversation(feedback)
        messages.append({"role": "user", "content": feedback})
        self.record(Event.MESSAGE, {"message": messages[-1]})
        return messages

    def _conversation(self, feedback: str | None) -> list[dict[str, Any]]:
        system = prompts.SYSTEM.format(workdir=self.goal.workpath)
        if self.goal.system:
            system += "\n\n" + self.goal.system
        prompt = self.goal.prompt
        if self.trigger_block:
            prompt = f"{prompt}\n\n{self.trigger_block}"
        if feedback and self.goal.verify.fresh_context and self.result.attempts:
            prompt = prompts.FRESH_CONTEXT.format(prompt=prompt, feedback=feedback)
        elif feedback:
            prompt = f"{prompt}\n\n{feedback}"
        messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        for message in messages:
            self.record(Event.MESSAGE, {"message": message})
        return messages

    def _resumed(self) -> list[dict[str, Any]]:
        """The conversation of the run being continued, written into this run's transcript too."""
        assert self.resume is not None
        messages = self.resume.messages
        for message in messages:
            self.record(Event.MESSAGE, {"message": message})
        return messages

    def _begin_attempt(self, attempt: int, last: int) -> None:
        self.attempt_open = True
        self.result.attempts = attempt
        self.store.record_attempt(self.result.run_id, attempt)
        self.store.update_run(self.result.run_id, attempts=attempt)
        self.record(Event.ATTEMPT, {"attempt": attempt, "of": last})

    def _end_open_attempt(self, reason: StopReason, error: str | None = None) -> None:
        """End an attempt that began but whose work loop never ran, so that no attempt is left without an end."""
        if self.attempt_open:
            self.record(Event.STOPPED, {"reason": reason, "steps": 0, "tokens": 0, "error": error})
            self._end_attempt(self.result.attempts, WorkResult(reason, [], error=error))

    def _end_attempt(self, attempt: int, work: WorkResult) -> None:
        self.attempt_open = False
        self.work = None
        result = self.result
        result.steps += work.steps
        result.tokens += work.tokens
        if work.cost_usd is not None:
            result.cost_usd = (result.cost_usd or 0.0) + work.cost_usd
        result.stop_reason = work.stop_reason
        result.final_message = work.final_message or result.final_message
        cost = {"cost": work.cost_usd} if work.cost_usd is not None else {}
        self.store.record_attempt(
            result.run_id,
            attempt,
            stop_reason=work.stop_reason,
            steps=work.steps,
            tokens=work.tokens,
            ended=now(),
            **cost,
        )
        self.store.update_run(
            result.run_id,
            steps=result.steps,
            tokens=result.tokens,
            stop_reason=work.stop_reason,
            final_message=result.final_message,
            **({"cost": result.cost_usd} if result.cost_usd is not None else {}),
        )

    async def _checks(self, attempt: int) -> list[CheckResult]:
        def recorded(position: int, result: CheckResult) -> None:
            self.store.record_check(self.result.run_id, attempt, position, **result.columns())
            self.record(Event.CHECK, {"attempt": attempt, **result.record()})

        if not self.goal.verify.checks:
            self.result.checks = []
            return []
        approver = self._approve if self.approver is not None else None
        context = CheckContext(self.goal, self.result.run_id, attempt, self.judge, approver)
        async with contained(self.result.run_id):
            self.result.checks = await run_checks(context, self.goal.verify.checks, on_result=recorded)
        return self.result.checks

    async def _approve(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        """Ask the approver; one that waits for a person through the store first tells the targets."""
        assert self.approver is not None
        if isinstance(self.approver, StoreApprover) and not self.told_waiting:
            self.told_waiting = True
            self._notify("awaiting_approval")
        return await self.approver(run_id, check)

    async def _before_retry(self) -> None:
        command = self.goal.verify.before_retry
        if not command:
            return
        result = await run_process(command, cwd=self.goal.workpath, env=scrub_env(self.goal.env), timeout=300)
        self.record(Event.BEFORE_RETRY, {"command": command, "exit_code": result.exit_code, "output": result.output})

    def _finish(self, outcome: Outcome, error: str | None = None) -> RunResult:
        result = self.result
        result.outcome, result.error = outcome, error
        result.duration_s = time.monotonic() - self.started
        if outcome == "cancelled" and self.store.run(result.run_id)["outcome"] == "awaiting_approval":
            result.outcome, result.error = "awaiting_approval", None  # it still waits: `runner approve` goes on
            error = None
        else:
            self.store.finish_run(
                result.run_id,
                result.outcome,
                error=error,
                attempts=result.attempts,
                steps=result.steps,
                tokens=result.tokens,
            )
        self.record(
            Event.OUTCOME,
            {
                "outcome": result.outcome,
                "error": error,
                "attempts": result.attempts,
                "steps": result.steps,
                "tokens": result.tokens,
                "cost_usd": result.cost_usd,
                "duration_s": round(result.duration_s, 3),
            },
        )
        if not (result.outcome == "awaiting_approval" and self.told_waiting):
            self._notify(result.outcome)
        return result

    def _notify(self, outcome: str) -> None:
        """Tell the targets that want this outcome; delivery happens off the run's path."""
        result, goal = self.result, self.goal

        def record(kind: str, detail: str) -> None:
            self.store.log_event(kind, goal.name, self.entry_id, detail)

        failing = [c.name for c in result.checks if not c.passed and not c.skipped]
        message = notify.Message(
            goal.name, outcome, result.run_id, self.entry_id, failing, result.error, result.cost_usd
        )
        notify.announce(message, self.targets, goal.root, record)
