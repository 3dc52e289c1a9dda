"""Run every benchmark, print one table of figures against their targets, and write benchmarks/RESULTS.md.

python3 benchmarks/run_all.py            # all of them (peer frameworks when the bench extra is installed)
python3 benchmarks/run_all.py --quick    # fewer repetitions, no peers, shorter idle window
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_daemon
import bench_loop
import bench_startup
import bench_tools
from common import table

HERE = Path(__file__).resolve().parent


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    import openai

    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), "
        f"Python {platform.python_version()}, openai {openai.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md as it is")
    args = parser.parse_args()
    reps = 2 if args.quick else 5
    started = time.monotonic()
    rows: list[list[str]] = []

    loop = bench_loop.run(reps=reps, peers=not args.quick)
    limit, ours = loop["httpx"], loop["runner"]
    cpu_ratio = ours["cpu_ms_per_step"] / limit["cpu_ms_per_step"]
    rows.append(
        [
            "work loop, 200 rounds: CPU/step vs httpx limit",
            f"{ours['cpu_ms_per_step']:.2f} ms vs {limit['cpu_ms_per_step']:.2f} ms",
            f"{cpu_ratio:.2f}x",
            "<= 2x",
            verdict(cpu_ratio <= 2),
        ]
    )
    for name, figures in loop.items():
        if name in ("httpx", "runner"):
            continue
        ratio = figures["cpu_ms_per_step"] / ours["cpu_ms_per_step"]
        peer = name not in ("openai",)
        rows.append(
            [
                f"  {name}: CPU/step, {figures['wall_s']:.2f} s wall",
                f"{figures['cpu_ms_per_step']:.2f} ms",
                f"{ratio:.1f}x runner's",
                ">= 10x" if peer else "-",
                verdict(ratio >= 10) if peer else "-",
            ]
        )
    rows.append(
        [
            "  runner wall / httpx wall",
            f"{ours['wall_s']:.2f} s vs {limit['wall_s']:.2f} s",
            f"{ours['wall_s'] / limit['wall_s']:.2f}x",
            "-",
            "-",
        ]
    )

    parallel = bench_tools.parallel(reps=3 if args.quick else 5)
    rows.append(
        [
            "5 tool calls of 1 s in one round",
            f"{parallel['round_wall_s']:.3f} s vs {parallel['slowest_call_s']:.3f} s",
            f"{parallel['ratio']:.2f}x",
            "<= 1.2x",
            verdict(parallel["ratio"] <= 1.2),
        ]
    )
    context = bench_tools.context()
    rows.append(
        [
            "1 MB tool output: bytes added to the context",
            f"{context['context_bytes_added']:,} B of {context['output_bytes']:,} B",
            "-",
            "<= 20 KB",
            verdict(context["context_bytes_added"] <= 20_480),
        ]
    )

    startup = bench_startup.run(reps=5 if args.quick else 15)
    base = startup["python -c pass"]["wall_s"]
    floor_s = startup["floor: click+yaml+pydantic, one model"]
    rows.append(
        [
            "  the floor: import click, yaml, pydantic; build one model",
            f"{floor_s['wall_s'] * 1000:.0f} ms",
            f"{floor_s['ratio']:.2f}x",
            "-",
            "-",
        ]
    )
    for name in ("runner --help", "runner validate"):
        figures = startup[name]
        rows.append(
            [
                f"`{name}` vs `python -c pass`",
                f"{figures['wall_s'] * 1000:.0f} ms vs {base * 1000:.0f} ms",
                f"{figures['ratio']:.2f}x",
                "<= 3x",
                verdict(figures["ratio"] <= 3),
            ]
        )

    idle = bench_daemon.idle(seconds=10 if args.quick else 30)
    rows.append(
        [
            f"daemon, 1,000 `every: 1h` entries, idle {idle['idle_s']:.0f} s",
            f"{idle['cpu_percent']:.2f}% CPU, {idle['rss_mb']:.0f} MB RSS",
            "-",
            "< 1%, < 150 MB",
            verdict(idle["cpu_percent"] < 1 and idle["rss_mb"] < 150),
        ]
    )
    delay = bench_daemon.start_delay(seconds=10 if args.quick else 20)
    rows.append(
        [
            "daemon, 100 `every: 1s` no-op goals: start delay",
            f"p50 {delay['p50_s']:.3f} s, p99 {delay['p99_s']:.3f} s ({delay['starts']} starts)",
            "-",
            "p99 < 1 s",
            verdict(delay["p99_s"] < 1),
        ]
    )
    floors: dict[int, list[dict]] = {1: [], 2: []}
    manies = []
    for _ in range(1 if args.quick else 3):  # alternated: floors, runner, floors, runner, ...
        for processes, results in floors.items():
            results.append(bench_daemon.many_httpx(processes=processes))
        manies.append(bench_daemon.many_goals())
    many = sorted(manies, key=lambda m: m["total_s"])[len(manies) // 2]
    for processes, results in floors.items():
        floor = sorted(results, key=lambda f: f["total_s"])[len(results) // 2]
        rows.append(
            [
                f"  the floor: 200 bare httpx loops, {processes} process{'es' if processes > 1 else ''}",
                f"{floor['total_s']:.2f} s",
                f"{floor['ratio']:.2f}x of 3 s",
                "-",
                "-",
            ]
        )
    rows.append(
        [
            "200 goals at once, 1 s model latency, 3 rounds",
            f"{many['total_s']:.2f} s (daemon CPU "
            f"{many['daemon_cpu_s']:.1f} s, starts spread {many['start_spread_s']:.2f} s)",
            f"{many['ratio']:.2f}x of 3 s",
            "<= 1.1x",
            verdict(many["ratio"] <= 1.1),
        ]
    )

    header = ["benchmark", "figure", "ratio", "target", "verdict"]
    text = table(rows, header)
    print(text)
    print(f"\n{time.monotonic() - started:.0f} s in all")
    if not args.no_write:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
        ).stdout.strip()
        notes = (HERE / "NOTES.md").read_text() if (HERE / "NOTES.md").exists() else ""
        (HERE / "RESULTS.md").write_text(
            f"# Benchmark results\n\nLast run: {stamp}, commit {commit}{' (--quick)' if args.quick else ''}.\n"
            f"Machine: {machine()}.\nCommand: `python3 benchmarks/run_all.py`. Medians of alternated runs; "
            f"every ratio is against a baseline measured in the same run.\n\n{text}\n\n{notes}"
        )


if __name__ == "__main__":
    main()
