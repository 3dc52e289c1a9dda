"""Tool rounds: five independent 1 s tool calls in one round, and a 1 MB tool output in the context."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from common import median, scripted_server

CALLS = 5


def goal_in(folder: Path, url: str, tools: list) -> tuple:
    from runner.config import Goal, Limits, ModelConfig
    from runner.work.model import Model
    from runner.work.tools import Toolbox

    config = ModelConfig(name="m", base_url=url, api_key_env=None)
    goal = Goal(name="bench", prompt="p", model=config, tools=tools, root=folder)
    return Model.open(config, folder), Toolbox.for_goal(goal), Limits(max_steps=5, max_tokens=10**12)


async def one_round(url: str, folder: Path) -> float:
    """Wall seconds of the round alone (from the first tool call to the last result)."""
    from runner.config import ToolEntry
    from runner.work import WorkLoop

    sleeper = ToolEntry(name="wait", description="wait a second", run="sleep 1; echo done", timeout=10)
    model, toolbox, limits = goal_in(folder, url, [sleeper])
    marks: list[float] = []

    def observe(kind: str, data: dict) -> None:
        if kind in ("tool_call", "tool_result"):
            marks.append(time.perf_counter())

    await WorkLoop(model, toolbox, limits, observe).run([{"role": "user", "content": "wait"}])
    await model.aclose()
    return marks[-1] - marks[0]


def parallel(reps: int = 5) -> dict[str, float]:
    """A round of five 1 s calls against a round of the single slowest call, alternated."""
    walls: dict[int, list[float]] = {1: [], CALLS: []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(reps):
            for count in walls:
                replies = [{"tool_calls": [{"name": "wait", "arguments": {}}] * count}, {"content": "done"}]
                with scripted_server(replies) as url:
                    walls[count].append(asyncio.run(one_round(url, Path(folder))))
    five, one = median(walls[CALLS]), median(walls[1])
    return {"round_wall_s": five, "slowest_call_s": one, "ratio": five / one}


async def big_output(url: str, folder: Path) -> int:
    from runner.config import ToolEntry
    from runner.work import WorkLoop

    model, toolbox, limits = goal_in(folder, url, [ToolEntry(name="read_file")])
    messages: list = [{"role": "user", "content": "read it"}]
    await WorkLoop(model, toolbox, limits).run(messages)
    await model.aclose()
    tool_message = next(m for m in messages if m["role"] == "tool")
    return len(json.dumps(tool_message, ensure_ascii=False).encode())


def context() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "big.txt").write_text("".join(f"line {i:07d} of a large file\n" for i in range(40_000)))
        size = (Path(folder) / "big.txt").stat().st_size
        replies = [{"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]}, {"content": "done"}]
        with scripted_server(replies) as url:
            added = asyncio.run(big_output(url, Path(folder)))
    return {"output_bytes": size, "context_bytes_added": added}


if __name__ == "__main__":
    print(parallel())
    print(context())
