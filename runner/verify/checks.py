"""The acceptance checks: `run` (a command's exit code), `judge` (an evaluation model), `approve` (a person)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .. import prompts
from ..config import Check, Goal
from ..errors import ProviderError
from ..work.model import Model
from ..work.tools.paths import PathGuard, ToolError
from ..work.tools.process import cap, run_process, scrub_env

CHECK_OUTPUT_CAP = 8_000
JUDGE_FILE_CAP = 20_000


@dataclass
class CheckResult:
    name: str
    kind: str
    passed: bool
    command: str | None = None
    exit_code: int | None = None
    output: str = ""
    reason: str | None = None
    duration_s: float = 0.0
    skipped: bool = False

    def record(self) -> dict[str, Any]:
        """The check as a `check` event: its own kind is `check_kind` (an event's `kind` is the event's)."""
        data = asdict(self)
        data["check_kind"] = data.pop("kind")
        return data

    def columns(self) -> dict[str, Any]:
        """The fields the store keeps of a check."""
        return {
            "name": self.name,
            "kind": self.kind,
            "passed": int(self.passed),
            "exit_code": self.exit_code,
            "duration_s": self.duration_s,
            "output": self.output,
            "reason": self.reason,
        }


class Approver(Protocol):
    """Whoever answers `approve` checks: a person at the terminal, or one answering later through the store."""

    async def __call__(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        """True to approve; the reason given, if any."""
        ...


@dataclass
class CheckContext:
    goal: Goal
    run_id: str
    attempt: int
    judge: Model | None
    approver: Approver | None


async def run_checks(
    ctx: CheckContext, checks: list[Check], on_result: Callable[[int, CheckResult], None] | None = None
) -> list[CheckResult]:
    """Every check in order; an approve check is not asked once an earlier check failed."""
    results: list[CheckResult] = []
    for check in checks:
        started = time.monotonic()
        if check.kind == "approve" and not all(r.passed for r in results):
            result = CheckResult(
                check.name or "", "approve", False, reason="not asked: an earlier check failed", skipped=True
            )
        elif check.kind == "run":
            result = await run_command_check(ctx, check)
        elif check.kind == "judge":
            result = await judge_check(ctx, check, results)
        else:
            result = await approve_check(ctx, check)
        result.duration_s = round(time.monotonic() - started, 3)
        results.append(result)
        if on_result is not None:
            on_result(len(results) - 1, result)
    return results


async def run_checks_alone(
    goal: Goal,
    checks: list[Check],
    run_id: str,
    attempt: int,
    approver: Approver | None,
    on_result: Callable[[int, CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Checks outside the verify loop (`runner check`, `runner approve`); a judge model is opened only if needed."""
    judge = Model.open(goal.judge_model or goal.model, goal.root) if any(c.kind == "judge" for c in checks) else None
    try:
        return await run_checks(CheckContext(goal, run_id, attempt, judge, approver), checks, on_result)
    finally:
        if judge is not None:
            await judge.aclose()


async def run_command_check(ctx: CheckContext, check: Check) -> CheckResult:
    goal = ctx.goal
    env = scrub_env(
        goal.env,
        {
            "RUNNER_ROOT": str(goal.root),
            "RUNNER_GOAL": goal.name,
            "RUNNER_ATTEMPT": str(ctx.attempt),
            "RUNNER_RUN_ID": ctx.run_id,
        },
    )
    try:
        result = await run_process(
            check.run or "", cwd=goal.workpath, env=env, timeout=check.timeout, cap_bytes=CHECK_OUTPUT_CAP
        )
    except OSError as exc:
        return CheckResult(check.name or "", "run", False, check.run, None, f"cannot run the check: {exc}")
    reason = f"timed out after {check.timeout:g}s and was killed" if result.timed_out else None
    return CheckResult(
        check.name or "", "run", result.exit_code == 0, check.run, result.exit_code, result.output, reason
    )


async def judge_check(ctx: CheckContext, check: Check, earlier: list[CheckResult]) -> CheckResult:
    name = check.name or ""
    if ctx.judge is None:
        return CheckResult(name, "judge", False, reason="no judge model is available")
    box = PathGuard.for_goal(ctx.goal)
    evidence = [_file_evidence(box, path) for path in check.files]
    evidence += [
        prompts.JUDGE_CHECK_OUTPUT.format(name=r.name, exit_code=r.exit_code, output=cap(r.output, 4000))
        for r in earlier
        if r.kind == "run"
    ]
    messages = [
        {"role": "system", "content": prompts.JUDGE_SYSTEM},
        {"role": "user", "content": prompts.JUDGE_PROMPT.format(rubric=check.judge, evidence="\n\n".join(evidence))},
    ]
    try:
        reply = await ctx.judge.chat(messages)
    except ProviderError as exc:
        return CheckResult(name, "judge", False, reason=f"the judge model failed: {exc}")
    verdict = parse_verdict(reply.message.get("content") or "")
    if verdict is None:
        head = (reply.message.get("content") or "")[:200]
        return CheckResult(
            name,
            "judge",
            False,
            reason=f"the judge's verdict could not be parsed: {head!r}",
            output=reply.message.get("content") or "",
        )
    return CheckResult(name, "judge", verdict[0], reason=verdict[1])


def parse_verdict(text: str) -> tuple[bool, str] | None:
    """`{"pass": bool, "reason": str}` from the judge's answer, tolerating code fences and prose around it."""
    for match in re.finditer(r"\{.*\}", text, re.DOTALL):
        try:
            data = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("pass"), bool):
            return data["pass"], str(data.get("reason") or "")
    return None


def _file_evidence(box: PathGuard, path: str) -> str:
    try:
        full = box.resolve(path)
        content = cap(full.read_text(encoding="utf-8", errors="replace"), JUDGE_FILE_CAP)
    except ToolError as exc:
        content = f"(not shown: {exc})"
    except OSError:
        content = "(the file does not exist)"
    return prompts.JUDGE_FILE.format(path=path, content=content)


async def approve_check(ctx: CheckContext, check: Check) -> CheckResult:
    if ctx.approver is None:
        return CheckResult(check.name or "", "approve", False, reason="nobody can be asked")
    approved, reason = await ctx.approver(ctx.run_id, check)
    return CheckResult(check.name or "", "approve", approved, reason=reason or ("approved" if approved else "rejected"))
