"""The cost a goal pays for MCP: starting a stdio server, and each tool call through runner against the SDK's client.

    python3 benchmarks/bench_mcp.py [--reps N] [--calls N]

Both paths talk to the same server (tests/mcp_servers/demo.py, written with the SDK), alternated so
that drift of the machine hits both alike:
- start-up: from nothing to the tools listed (spawn, initialize, tools/list), and the close after it;
- per call: `demo__add` through runner's whole path (`Toolbox.call` with the model's JSON arguments:
  parse, schema check, the SDK session, the result described and capped) against `Client.call_tool`
  of the SDK in a loop, on one started server each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import median, table

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "tests" / "mcp_servers" / "demo.py"
ARGS = {"a": 2, "b": 3}


def goal_in(folder: Path) -> Any:
    from runner.config import Goal, ModelConfig

    config = ModelConfig(name="m", base_url="http://127.0.0.1:9/v1", api_key_env=None)
    server = {"command": sys.executable, "args": [str(DEMO)]}
    return Goal(name="bench", prompt="p", model=config, tools=["demo__add"], mcp={"demo": server}, root=folder)


async def runner_path(folder: Path, calls: int) -> dict[str, float]:
    from runner.work.tools import Toolbox

    goal, raw = goal_in(folder), json.dumps(ARGS)
    started = time.perf_counter()
    async with Toolbox.open(goal) as toolbox:
        ready = time.perf_counter()
        assert await toolbox.call("demo__add", raw) == "5"
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            await toolbox.call("demo__add", raw)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        closing = time.perf_counter()
    return _figures(ready - started, time.perf_counter() - closing, cpu, wall, calls)


async def sdk_path(calls: int) -> dict[str, float]:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(DEMO)])
    started = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        ready = time.perf_counter()
        assert (await client.call_tool("add", ARGS)).content[0].text == "5"
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            await client.call_tool("add", ARGS)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        closing = time.perf_counter()
    return _figures(ready - started, time.perf_counter() - closing, cpu, wall, calls)


def _figures(start: float, close: float, cpu: float, wall: float, calls: int) -> dict[str, float]:
    return {"start_s": start, "close_s": close, "call_ms": wall / calls * 1000, "call_cpu_ms": cpu / calls * 1000}


def import_cost(reps: int) -> dict[str, float]:
    """What the first MCP server of a process costs before any server starts: importing the SDK."""

    def wall(code: str) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        return time.perf_counter() - started

    return {
        "python -c pass": median([wall("pass") for _ in range(reps)]),
        "import mcp": median([wall("import mcp") for _ in range(reps)]),
    }


def run(reps: int = 5, calls: int = 200) -> dict[str, Any]:
    import mcp  # noqa: F401  (imported once, as in a run; its cost is measured apart)

    results: dict[str, list[dict[str, float]]] = {"runner": [], "sdk": []}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(reps):
            results["runner"].append(asyncio.run(runner_path(Path(folder), calls)))
            results["sdk"].append(asyncio.run(sdk_path(calls)))
    summary = {name: {k: median([r[k] for r in runs]) for k in runs[0]} for name, runs in results.items()}
    summary["ratio_call"] = summary["runner"]["call_ms"] / summary["sdk"]["call_ms"]
    summary["ratio_start"] = summary["runner"]["start_s"] / summary["sdk"]["start_s"]
    summary["imports"] = import_cost(reps)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    figures = run(args.reps, args.calls)
    ours, sdk = figures["runner"], figures["sdk"]
    rows = [
        ["stdio server start (spawn, initialize, list)", f"{ours['start_s']:.3f} s", f"{sdk['start_s']:.3f} s",
         f"{figures['ratio_start']:.2f}x"],
        ["close (stdin closed, group killed)", f"{ours['close_s']:.3f} s", f"{sdk['close_s']:.3f} s",
         f"{ours['close_s'] / sdk['close_s']:.2f}x"],
        ["one call, wall", f"{ours['call_ms']:.2f} ms", f"{sdk['call_ms']:.2f} ms", f"{figures['ratio_call']:.2f}x"],
        ["one call, client CPU", f"{ours['call_cpu_ms']:.2f} ms", f"{sdk['call_cpu_ms']:.2f} ms",
         f"{ours['call_cpu_ms'] / sdk['call_cpu_ms']:.2f}x"],
        ["import mcp vs python -c pass", f"{figures['imports']['import mcp']:.3f} s",
         f"{figures['imports']['python -c pass']:.3f} s", "-"],
    ]  # fmt: skip
    print(f"{args.reps} alternated runs of each path, {args.calls} calls a run; medians")
    print(table(rows, ["", "runner", "SDK client", "ratio"]))
    print(f"per-call target <= 1.2x: {'met' if figures['ratio_call'] <= 1.2 else 'MISSED'}")


if __name__ == "__main__":
    main()
