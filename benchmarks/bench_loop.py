"""Work loop cost: 200 rounds of one tool call each against the scripted server, zero model latency.

Contenders, alternated A B C ... and reported as medians:
  httpx      a plain httpx2 while-loop doing the same requests (the limit)
  openai     a hand-written loop on openai's chat.completions.create
  runner     runner's WorkLoop (official openai client, request API)
  agents / pydantic-ai / smolagents   peer frameworks, when the `bench` extra is installed
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from common import alternate, median, scripted_server, timed

ROUNDS = 200
NOTE = Path(tempfile.mkdtemp()) / "note.txt"
NOTE.write_text("a short note\n")
TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
SYSTEM = {"role": "system", "content": "You are a benchmark agent."}
USER = {"role": "user", "content": "Read note.txt again and again."}


def script(final: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    call = {"tool_calls": [{"name": "read_file", "arguments": {"path": str(NOTE)}}]}
    return [call] * ROUNDS + [final or {"content": "done"}]


def read_file(path: str) -> str:
    """Read a text file.

    Args:
        path: the file to read
    """
    return Path(path).read_text()


async def httpx_loop(url: str) -> None:
    import httpx2

    async with httpx2.AsyncClient(base_url=url, headers={"Authorization": "Bearer x"}) as http:
        messages = [SYSTEM, USER]
        while True:
            response = await http.post("/chat/completions", json={"model": "m", "messages": messages, "tools": [TOOL]})
            message = response.json()["choices"][0]["message"]
            messages.append(
                {
                    "role": "assistant",
                    "content": message["content"],
                    **({"tool_calls": message["tool_calls"]} if message.get("tool_calls") else {}),
                }
            )
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                output = read_file(**json.loads(call["function"]["arguments"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})


async def openai_loop(url: str) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="x")
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    while True:
        response = await client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            output = read_file(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    await client.close()


async def runner_loop(url: str) -> None:
    from runner.config import Goal, Limits, ModelConfig, ToolEntry
    from runner.work import WorkLoop
    from runner.work.model import Model
    from runner.work.tools import Toolbox

    config = ModelConfig(name="m", base_url=url, api_key_env=None)
    goal = Goal(
        name="bench", prompt=USER["content"], model=config, tools=[ToolEntry(name="read_file")], root=NOTE.parent
    )
    model = Model.open(config, NOTE.parent)
    result = await WorkLoop(model, Toolbox.for_goal(goal), Limits(max_steps=ROUNDS + 5, max_tokens=10**12)).run(
        [SYSTEM, USER]
    )
    assert result.steps == ROUNDS + 1, (result.stop_reason, result.steps)
    await model.aclose()


async def agents_loop(url: str) -> None:
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=url, api_key="x")
    model = OpenAIChatCompletionsModel(model="m", openai_client=client)
    agent = Agent(name="bench", instructions=SYSTEM["content"], tools=[function_tool(read_file)], model=model)
    await Runner.run(agent, USER["content"], max_turns=ROUNDS + 5)
    await client.close()


async def pydantic_ai_loop(url: str) -> None:
    import openai
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    client = openai.AsyncOpenAI(base_url=url, api_key="x")
    model = OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client))
    agent = Agent(model, tools=[read_file], instructions=SYSTEM["content"])
    await agent.run(USER["content"], usage_limits=UsageLimits(request_limit=ROUNDS + 5))
    await client.close()


async def smolagents_loop(url: str) -> None:
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    agent = ToolCallingAgent(
        tools=[tool(read_file)],
        model=OpenAIServerModel(model_id="m", api_base=url, api_key="x"),
        max_steps=ROUNDS + 5,
        verbosity_level=0,
    )
    await asyncio.to_thread(agent.run, USER["content"])


FINAL_TOOL = {"tool_calls": [{"name": "final_answer", "arguments": {"answer": "done"}}]}
CORE = {"httpx": (httpx_loop, None), "openai": (openai_loop, None), "runner": (runner_loop, None)}
PEERS = {
    "agents": (agents_loop, None),
    "pydantic-ai": (pydantic_ai_loop, None),
    "smolagents": (smolagents_loop, FINAL_TOOL),
}
PEER_MODULES = {"agents": "agents", "pydantic-ai": "pydantic_ai", "smolagents": "smolagents"}


def contender(loop: Any, final: dict | None) -> Any:
    def run() -> tuple[float, float]:
        with scripted_server(script(final)) as url:
            return timed(lambda: asyncio.run(loop(url)))

    return run


def available_peers() -> dict[str, Any]:
    import importlib.util

    return {name: spec for name, spec in PEERS.items() if importlib.util.find_spec(PEER_MODULES[name])}


def run(reps: int = 5, peers: bool = True) -> dict[str, dict[str, float]]:
    chosen = {**CORE, **(available_peers() if peers else {})}
    for _name, (loop, final) in chosen.items():  # warm imports and caches once, untimed
        contender(loop, final)()
    results = alternate({name: contender(*spec) for name, spec in chosen.items()}, reps)
    return {
        name: {"cpu_ms_per_step": median([c for c, _ in rows]) / ROUNDS * 1000, "wall_s": median([w for _, w in rows])}
        for name, rows in results.items()
    }


if __name__ == "__main__":
    for name, figures in run().items():
        print(f"{name:12} {figures['cpu_ms_per_step']:7.2f} ms CPU/step  {figures['wall_s']:6.2f} s wall")
