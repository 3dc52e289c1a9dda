"""Start-up cost: `runner --help` and `runner validate` on the example project, against `python -c pass`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from common import median

REPO = Path(__file__).resolve().parent.parent
FLOOR = "import click, yaml, pydantic\nclass Probe(pydantic.BaseModel):\n    x: int = 0\nProbe(x=1)"
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "floor: click+yaml+pydantic, one model": [sys.executable, "-c", FLOOR],
    "runner --help": [sys.executable, "-m", "runner", "--help"],
    "runner validate": [sys.executable, "-m", "runner", "-C", str(REPO), "validate"],
}


# As on a user's machine, Python may cache compiled modules (this sandbox sets PYTHONDONTWRITEBYTECODE,
# which makes every start compile every imported module of runner from source).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    return time.perf_counter() - started


def run(reps: int = 15) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():
        wall(argv)  # warm the file cache
    for _ in range(reps):
        for name, argv in COMMANDS.items():
            times[name].append(wall(argv))
    base = median(times["python -c pass"])
    return {name: {"wall_s": median(t), "ratio": median(t) / base} for name, t in times.items()}


if __name__ == "__main__":
    for name, figures in run().items():
        print(f"{name:16} {figures['wall_s'] * 1000:7.1f} ms  {figures['ratio']:.2f}x")
