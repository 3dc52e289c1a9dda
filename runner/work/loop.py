"""The work loop (inner): ReAct tool calling until the model stops or a limit is hit.

    call the model -> append its message -> no tool calls? stop -> run the calls -> append results -> limits

Two things keep a weak model's turn from being wasted. A reply that writes its tool calls as text
(`textcalls`) is run as those calls, its message rewritten into a proper tool call so the provider
sees a valid history (`model.text_tool_calls: auto`), or answered that nothing was executed (`off`);
a call of a tool that does not exist is answered once with the tools there are.
And a loop given a `nudge` (the verify loop gives one after feedback) answers it once, when the
model ends its turn without having changed anything (no tool called, or only tools that read),
instead of ending the attempt.

A limit, a provider failure or a cut-off reply ends the loop with a `StopReason` and the messages so
far; nothing the model causes raises. The loop knows nothing of checks or schedules, and never
prints: it tells an `Observer` what happens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import prompts
from ..config import Limits
from ..errors import ProviderError
from ..vocabulary import FORCED, Event, StopReason
from .cost import Pricer
from .model import Model, Reply
from .textcalls import find_calls, unknown_calls
from .tools import READ_ONLY, Toolbox, describe_call

Observer = Callable[[str, dict[str, Any]], None]
"""Receives each event (a kind of `vocabulary.Event`) with its data."""


def ignore(kind: str, data: dict[str, Any]) -> None:
    """An observer that observes nothing."""


@dataclass
class WorkResult:
    stop_reason: StopReason
    messages: list[dict[str, Any]]
    steps: int = 0
    tokens: int = 0
    final_message: str | None = None
    error: str | None = None
    cost_usd: float | None = None
    """US dollars of the attempt's replies; None when the model's price is unknown."""

    @property
    def forced(self) -> bool:
        return self.stop_reason in FORCED


@dataclass
class WorkLoop:
    """One attempt: the model and tools it may use, the limits, and who is told what happens."""

    model: Model
    toolbox: Toolbox
    limits: Limits
    observe: Observer = ignore
    pricer: Pricer | None = None
    """Prices each reply (cost per step in the `reply` event, `limits.max_cost`); None counts tokens only."""
    nudge: str | None = None
    """Said once when the model ends its turn having changed nothing in this attempt; None: the turn ends it."""
    started: float = field(default_factory=time.monotonic)
    first: asyncio.Future[Reply] | None = None
    """The first call's reply when it was asked already (the verify loop sends it, and tells its step, before
    the run sets up)."""
    before_writing: Callable[[], None] | None = None
    """Called before a round with a call that may change files (the verify loop's tamper snapshot)."""
    result: WorkResult | None = None
    """The attempt so far, readable by the caller even when the loop is cancelled."""
    _acted: bool = field(default=False, init=False, repr=False)
    _gave_nudge: bool = field(default=False, init=False, repr=False)
    _force_tool: bool = field(default=False, init=False, repr=False)
    _told_invented: bool = field(default=False, init=False, repr=False)

    async def run(self, messages: list[dict[str, Any]]) -> WorkResult:
        result = self.result = WorkResult("completed", messages)
        try:
            while True:
                stop = self._limit_hit(result)
                if stop:
                    result.stop_reason = stop
                    break
                result.steps += 1
                if self.first is None:  # a call asked already was told as step 1 when it went out
                    self.observe(Event.STEP, {"step": result.steps})
                reply = await self._within_time(self._ask(messages))
                result.tokens += reply.tokens
                cost = self._price(result, reply)
                self.observe(
                    Event.REPLY,
                    {"step": result.steps, "finish_reason": reply.finish_reason, "usage": reply.usage, "cost": cost},
                )
                not_run = self._text_calls(result.steps, reply)  # calls written as text: made real, or refused
                self._append(messages, reply.message)
                if reply.message.get("content"):
                    result.final_message = reply.message["content"]
                if not_run:
                    self._append(messages, {"role": "user", "content": not_run})
                    continue
                if not reply.tool_calls:
                    if reply.finish_reason != "length" and self._nudged(result.steps, messages):
                        continue
                    result.stop_reason = "length" if reply.finish_reason == "length" else "completed"
                    break
                await self._within_time(self._run_tools(result.steps, reply, messages))
        except ProviderError as exc:
            result.stop_reason, result.error = "error", str(exc)
        except asyncio.TimeoutError:
            result.stop_reason = "timeout"
        except asyncio.CancelledError:
            result.stop_reason = "cancelled"
            self._close_open_calls(messages, "cancelled")
            self.observe(Event.STOPPED, {"reason": "cancelled", "steps": result.steps, "tokens": result.tokens})
            raise
        self._close_open_calls(messages, result.stop_reason)
        self.observe(
            Event.STOPPED,
            {"reason": result.stop_reason, "steps": result.steps, "tokens": result.tokens, "error": result.error},
        )
        return result

    async def _ask(self, messages: list[dict[str, Any]]) -> Reply:
        """One model call; the turn right after the nudge asks for a tool call (`tool_choice: required`),
        and a provider that refuses that field is asked again without it."""
        if self.first is not None:
            first, self.first = self.first, None
            return await first
        if not self._force_tool:
            return await self.model.chat(messages, self.toolbox.schemas)
        self._force_tool = False
        try:
            return await self.model.chat(messages, self.toolbox.schemas, tool_choice="required")
        except ProviderError:
            return await self.model.chat(messages, self.toolbox.schemas)

    def _text_calls(self, step: int, reply: Reply) -> str | None:
        """Tool calls written as text: made real calls (`auto`), or the words telling the model they did not run."""
        if reply.tool_calls or reply.finish_reason == "length":
            return None
        content = reply.message.get("content")
        calls = find_calls(content, self.toolbox.parameters)
        if not calls:
            return self._invented(step, content)
        run = self.model.config.text_tool_calls == "auto"
        names = [call.name for call in calls]
        self.observe(Event.TEXT_TOOL_CALL, {"step": step, "names": names, "content": content, "executed": run})
        if not run:
            return prompts.TEXT_CALL_NOT_RUN.format(names=", ".join(names))
        reply.message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"text_call_{step}_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for i, c in enumerate(calls, 1)
            ],
        }
        return None

    def _invented(self, step: int, content: str | None) -> str | None:
        """A call of a tool that does not exist, written as text: told so once an attempt, and the next turn
        asked for a real call; None when the reply holds none (or the model was told already)."""
        names = [] if self._told_invented else unknown_calls(content, self.toolbox.tools)
        if not names:
            return None
        self._told_invented = self._force_tool = True
        self.observe(
            Event.TEXT_TOOL_CALL, {"step": step, "names": names, "content": content, "executed": False, "unknown": True}
        )
        return prompts.UNKNOWN_TOOL.format(names=", ".join(names), tools=", ".join(self.toolbox.tools))

    def _nudged(self, step: int, messages: list[dict[str, Any]]) -> bool:
        """Answer a turn that changed nothing once with the nudge; False when there is none to give."""
        if self.nudge is None or self._gave_nudge or self._acted:
            return False
        self._gave_nudge = self._force_tool = True
        self.observe(Event.NUDGE, {"step": step, "text": self.nudge})
        self._append(messages, {"role": "user", "content": self.nudge})
        return True

    def _limit_hit(self, result: WorkResult) -> StopReason | None:
        if result.steps >= self.limits.max_steps:
            return "max_steps"
        if result.tokens >= self.limits.max_tokens:
            return "max_tokens"
        if self.limits.max_cost is not None and (result.cost_usd or 0.0) >= self.limits.max_cost:
            return "max_cost"
        if time.monotonic() - self.started >= self.limits.timeout:
            return "timeout"
        return None

    def _price(self, result: WorkResult, reply: Reply) -> float | None:
        """The reply's cost, added to the attempt's; None (and the attempt's stays None) when unknown."""
        cost = self.pricer.cost(reply.usage) if self.pricer is not None else None
        if cost is not None:
            result.cost_usd = (result.cost_usd or 0.0) + cost
        return cost

    async def _within_time(self, awaitable: Any) -> Any:
        remaining = self.limits.timeout - (time.monotonic() - self.started)
        return await asyncio.wait_for(awaitable, max(remaining, 0.001))

    async def _run_tools(self, step: int, reply: Reply, messages: list[dict[str, Any]]) -> None:
        """Run a round's calls concurrently; append the results in the order of the calls."""
        calls = reply.tool_calls
        self._acted = self._acted or any(call["function"]["name"] not in READ_ONLY for call in calls)
        if self.before_writing is not None and any(self.toolbox.writes(call["function"]["name"]) for call in calls):
            self.before_writing()
        outputs = await asyncio.gather(*(self._run_tool(step, call) for call in calls))
        for call, output in zip(calls, outputs, strict=True):
            self._append(messages, {"role": "tool", "tool_call_id": call["id"], "content": output})

    async def _run_tool(self, step: int, call: dict[str, Any]) -> str:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        summary = describe_call(name, arguments)
        self.observe(Event.TOOL_CALL, {"step": step, "id": call["id"], "name": name, "summary": summary})
        started = time.monotonic()
        output = await self.toolbox.call(name, arguments)
        self.observe(
            Event.TOOL_RESULT,
            {
                "step": step,
                "id": call["id"],
                "name": name,
                "summary": summary,
                "output": output,
                "duration_s": round(time.monotonic() - started, 3),
            },
        )
        return output

    def _append(self, messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
        messages.append(message)
        self.observe(Event.MESSAGE, {"message": message})

    def _close_open_calls(self, messages: list[dict[str, Any]], reason: str) -> None:
        """A round cut short leaves calls without results; answer them so the conversation stays valid."""
        answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
        for message in reversed(messages):
            if message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    if call["id"] not in answered:
                        self._append(
                            messages,
                            {
                                "role": "tool",
                                "tool_call_id": call["id"],
                                "content": f"error: not run: the attempt stopped ({reason})",
                            },
                        )
                break
