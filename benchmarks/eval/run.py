"""Evaluate runner on small real tasks against any OpenAI-compatible endpoint.

    python3 benchmarks/eval/run.py --base-url http://127.0.0.1:8765/v1 --model local
    python3 benchmarks/eval/run.py --base-url https://api.deepseek.com --model deepseek-chat \
        --api-key-env DEEPSEEK_API_KEY --tasks csv_total,fix_add --attempts 3 --out deepseek.json

Each task under `tasks/` is a small runner project: `goals/NAME.yaml` (a prompt and its checks) and
the files the task starts from. For every task and every `--attempts` count, the task is copied into
a fixed folder (`--root`/NAME, emptied first: a random temporary name would show up in the system
prompt and change a greedy model's answers), a `runner.yaml` naming the model is written beside it,
and `python -m runner -C DIR goal NAME --json --max-attempts N` runs it through the CLI. The table
shows, per task and in total: achieved with 1 attempt and with 3, the attempts used, tokens and time;
the transcript of each run tells which attempt passed, how many tool calls each made, and how often
runner nudged the model or ran a tool call written as text.

When `--attempts` holds no 1, the 1-attempt figure is read from the first attempt of the longest run
(the same conversation up to the first feedback, as long as the model is greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TASKS = HERE / "tasks"
REPO = HERE.parent.parent


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    names = sorted(p.name for p in TASKS.iterdir() if (p / "goals" / f"{p.name}.yaml").is_file())
    if args.list:
        print("\n".join(names))
        return 0
    chosen = [t.strip() for t in args.tasks.split(",")] if args.tasks else names
    unknown = [t for t in chosen if t not in names]
    if unknown:
        print(f"error: unknown task(s) {', '.join(unknown)} (tasks: {', '.join(names)})", file=sys.stderr)
        return 2
    counts = sorted({int(a) for a in args.attempts.split(",")})
    report: dict[str, Any] = {
        "model": args.model,
        "base_url": args.base_url,
        "runner": describe_checkout(Path(args.runner)),
        "verify_overrides": args.verify,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "attempt_counts": counts,
        "tasks": {},
    }
    for name in chosen:
        report["tasks"][name] = {}
        for count in counts:
            run = run_task(name, count, args)
            report["tasks"][name][str(count)] = run
            print(progress_line(name, count, run), file=sys.stderr, flush=True)
            if args.out:  # so far, in case the evaluation is stopped before the end
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    report["summary"] = summarize(report["tasks"], counts)
    print(table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=False, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8765/v1")
    p.add_argument("--model", required=False, help="model name at that endpoint")
    p.add_argument("--api-key-env", default=None, help="variable holding the key (default: none needed)")
    p.add_argument("--tasks", help="comma-separated task names (default: all)")
    p.add_argument("--attempts", default="1,3", help="max_attempts values to run each task with (default 1,3)")
    p.add_argument("--out", help="write the full results as JSON to this file")
    p.add_argument("--root", default="/tmp/runner-eval", help="fixed parent folder of the task copies")
    p.add_argument("--runner", default=str(REPO), help="checkout whose `runner` package runs (default: this one)")
    p.add_argument("--max-steps", type=int, default=10, help="limits.max_steps per attempt (default 10)")
    p.add_argument("--timeout", default="10m", help="limits.timeout per attempt (default 10m)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--verify",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="set a verify field in every task's goal, e.g. fresh_context=true (YAML value; repeatable)",
    )
    p.add_argument("--list", action="store_true", help="list the tasks and exit")
    args = p.parse_args(argv)
    if not args.list and not (args.base_url and args.model):
        p.error("--base-url and --model are required")
    for setting in args.verify:
        field, equals, _ = setting.partition("=")
        if not equals or not field.strip().isidentifier():
            p.error(f"--verify {setting!r}: expected FIELD=VALUE, e.g. fresh_context=true")
    return args


def prepare(name: str, args: argparse.Namespace) -> Path:
    """A fresh copy of the task at a fixed path, with a runner.yaml naming the model under test."""
    folder = Path(args.root) / name
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(TASKS / name, folder)
    if args.verify:
        import yaml

        path = folder / "goals" / f"{name}.yaml"
        goal = yaml.safe_load(path.read_text())
        for setting in args.verify:
            field, _, value = setting.partition("=")
            goal.setdefault("verify", {})[field.strip()] = yaml.safe_load(value)
        path.write_text(yaml.safe_dump(goal, sort_keys=False))
    model = {"name": args.model, "base_url": args.base_url, "api_key_env": args.api_key_env}
    model.update(temperature=args.temperature, request_timeout=600, max_retries=1)  # a slow local model is no fault
    config = {"model": model, "limits": {"max_steps": args.max_steps, "timeout": args.timeout}}
    (folder / "runner.yaml").write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return folder


def run_task(name: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    folder = prepare(name, args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(args.runner).resolve()), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # pytest must not write caches into the protected verifiers/
    command = [sys.executable, "-m", "runner", "-C", str(folder), "goal", name, "--json", "--max-attempts", str(count)]
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=folder, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - started
    result: dict[str, Any] = {"max_attempts": count, "exit_code": proc.returncode, "wall_s": round(wall, 1)}
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        result.update(outcome="error", error=(proc.stderr or proc.stdout).strip()[-500:], attempts=0, tokens=0)
        result["attempt_details"] = []
        return result
    result.update({k: data.get(k) for k in ("run_id", "outcome", "attempts", "steps", "tokens", "duration_s", "error")})
    result["attempt_details"] = read_transcript(
        folder / ".runner" / "runs" / str(data.get("run_id")) / "transcript.jsonl"
    )
    return result


def read_transcript(path: Path) -> list[dict[str, Any]]:
    """Per attempt: steps, tool calls, whether its checks passed, nudges, text tool calls, the last reply."""
    attempts: list[dict[str, Any]] = []
    if not path.is_file():
        return attempts
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("kind")
        if kind == "attempt":
            attempts.append(
                {
                    "attempt": event.get("attempt"),
                    "steps": 0,
                    "tool_calls": 0,
                    "checks_passed": None,
                    "nudges": 0,
                    "text_tool_calls": 0,
                    "stop_reason": None,
                    "last_reply": None,
                }
            )
            continue
        if not attempts:
            continue
        current = attempts[-1]
        if kind == "step":
            current["steps"] = event.get("step", current["steps"])
        elif kind == "tool_call":
            current["tool_calls"] += 1
        elif kind == "nudge":
            current["nudges"] += 1
        elif kind == "text_tool_call":
            current["text_tool_calls"] += 1
        elif kind == "stopped":
            current["stop_reason"] = event.get("reason")
        elif kind == "check" or (kind in ("run", "judge", "approve") and "passed" in event):
            # (a check's own `kind` field has been seen to overwrite the event kind "check")
            passed = bool(event.get("passed"))
            current["checks_passed"] = (
                passed if current["checks_passed"] is None else current["checks_passed"] and passed
            )
        elif kind == "message":
            message = event.get("message") or {}
            if message.get("role") == "assistant" and message.get("content"):
                current["last_reply"] = str(message["content"])[:300]
    return attempts


def first_attempt_passed(run: dict[str, Any]) -> bool:
    details = run.get("attempt_details") or []
    if details:
        return bool(details[0].get("checks_passed"))
    return run.get("outcome") == "achieved" and run.get("attempts") == 1


def summarize(tasks: dict[str, dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    longest = str(max(counts))
    one = "1" if 1 in counts else longest
    summary: dict[str, Any] = {
        "tasks": len(tasks),
        "one_attempt_from": "run with max_attempts 1"
        if one == "1"
        else f"first attempt of the max_attempts {longest} run",
    }
    summary["achieved_1"] = sum(
        (runs[one].get("outcome") == "achieved") if one == "1" else first_attempt_passed(runs[one])
        for runs in tasks.values()
    )
    summary[f"achieved_{longest}"] = sum(runs[longest].get("outcome") == "achieved" for runs in tasks.values())
    failed_first = [n for n, runs in tasks.items() if not first_attempt_passed(runs[longest])]
    rescued = [n for n in failed_first if tasks[n][longest].get("outcome") == "achieved"]
    summary.update(first_attempt_failed=failed_first, rescued=rescued)
    summary["tokens"] = sum(r.get("tokens") or 0 for runs in tasks.values() for r in runs.values())
    summary["time_s"] = round(sum(r.get("wall_s") or 0 for runs in tasks.values() for r in runs.values()), 1)
    summary["nudges"] = sum(a["nudges"] for runs in tasks.values() for r in runs.values() for a in r["attempt_details"])
    summary["text_tool_calls"] = sum(
        a["text_tool_calls"] for runs in tasks.values() for r in runs.values() for a in r["attempt_details"]
    )
    return summary


def mark(run: dict[str, Any]) -> str:
    outcome = run.get("outcome")
    return "yes" if outcome == "achieved" else "no" if outcome == "not_achieved" else str(outcome)


def progress_line(name: str, count: int, run: dict[str, Any]) -> str:
    passes = "".join(
        "." if a.get("checks_passed") is None else "P" if a["checks_passed"] else "F" for a in run["attempt_details"]
    )
    return (
        f"{name} x{count}: {run.get('outcome')} attempts={run.get('attempts')} [{passes}] "
        f"tokens={run.get('tokens')} {run.get('wall_s')}s"
    )


def table(report: dict[str, Any]) -> str:
    counts = report["attempt_counts"]
    longest = str(max(counts))
    rows = [("task", "1 attempt", f"{longest} attempts", "used", "per attempt", "tool calls", "tokens", "time")]
    for name, runs in report["tasks"].items():
        run = runs[longest]
        one = mark(runs["1"]) if "1" in runs else ("yes" if first_attempt_passed(run) else "no")
        rescued = run.get("outcome") == "achieved" and not first_attempt_passed(run)
        per = "".join(
            "-" if a.get("checks_passed") is None else "P" if a["checks_passed"] else "F"
            for a in run["attempt_details"]
        )
        extras = (
            sum(a["nudges"] for a in run["attempt_details"]),
            sum(a["text_tool_calls"] for a in run["attempt_details"]),
        )
        calls = "/".join(str(a["tool_calls"]) for a in run["attempt_details"])
        if any(extras):
            calls += f" (nudges {extras[0]}, text calls {extras[1]})"
        tokens = sum(r.get("tokens") or 0 for r in runs.values())
        wall = sum(r.get("wall_s") or 0 for r in runs.values())
        rows.append(
            (
                name,
                one,
                mark(run) + (" rescued" if rescued else ""),
                str(run.get("attempts")),
                per,
                calls,
                f"{tokens / 1000:.1f}k",
                f"{wall:.0f}s",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    s = report["summary"]
    failed = s["first_attempt_failed"]
    lines += [
        "",
        f"model {report['model']} at {report['base_url']}; runner {report['runner']}",
        f"achieved with 1 attempt: {s['achieved_1']}/{s['tasks']} ({s['one_attempt_from']})",
        f"achieved with {longest} attempts: {s[f'achieved_{longest}']}/{s['tasks']}",
        f"first attempts failed: {len(failed)} ({', '.join(failed) or '-'}); rescued by retries: "
        f"{len(s['rescued'])} of {len(failed)} ({', '.join(s['rescued']) or '-'})",
        f"tokens {s['tokens']:,}, time {s['time_s']:.0f}s, nudges {s['nudges']}, "
        f"text tool calls {s['text_tool_calls']}",
        "(per attempt: P = its checks passed, F = failed; tool calls per attempt)",
    ]
    return "\n".join(lines)


def describe_checkout(path: Path) -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "runner"], capture_output=True, text=True
        ).stdout.strip()
        return f"{commit}{' (uncommitted changes)' if dirty else ''} at {path}"
    except (OSError, subprocess.CalledProcessError):
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
