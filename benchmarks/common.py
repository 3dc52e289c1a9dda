"""Shared pieces of the benchmarks: a scripted server in its own process, timing, alternation, medians."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

PYTHON = sys.executable


@contextmanager
def scripted_server(replies: list[dict[str, Any]], latency: float = 0.0) -> Iterator[str]:
    """runner.testing's server in a separate process (so its CPU is not the client's); yields base_url."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as script:
        json.dump(replies, script)
    proc = subprocess.Popen(
        [PYTHON, "-m", "runner.testing", script.name, "--latency", str(latency)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait()
        os.unlink(script.name)


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(client CPU seconds, wall seconds) of one call."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def alternate(contenders: dict[str, Callable[[], tuple[float, float]]], reps: int) -> dict[str, list[tuple]]:
    """Run A B C A B C ... so that drift of the machine hits every contender alike."""
    results: dict[str, list[tuple]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, run in contenders.items():
            results[name].append(run())
    return results


def median(values: list[float]) -> float:
    return statistics.median(values)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
