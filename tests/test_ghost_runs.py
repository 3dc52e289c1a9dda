"""No ghost runs (issue 9, item 9): every way a run can fail ends in an outcome the store shows, never a row
left `running`; `runner goal` exits 3 with the outcome `error`, not 1 with a traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys

from support import call, child_env

from runner.verify import loop

HAIKU = "loops within loops\nthe agent tries once again\nchecks decide the end\n"


def haiku_goal(proj) -> None:
    proj.goal("haiku", prompt="write haiku.txt", verify={"max_attempts": 1, "checks": [{"run": "test -f haiku.txt"}]})


def runs(proj) -> list[dict]:
    return json.loads(proj.cli("runs", "--json").output)


def test_an_unwritable_transcript_folder_ends_the_run_in_error(proj, server):
    haiku_goal(proj)
    (proj.root / ".runner").mkdir()
    (proj.root / ".runner/runs").symlink_to("/sys")  # a folder nobody, root included, may create folders in
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"]) == (3, "error")
    assert out["error"].startswith("the run could not go on: ") and ".runner/runs/" in out["error"]
    assert [r["outcome"] for r in runs(proj)] == ["error"]


def test_a_bug_in_the_verify_loop_ends_the_run_in_error(proj, server, monkeypatch):
    async def broken(*args, **kwargs):
        raise RuntimeError("a bug in a check")

    monkeypatch.setattr(loop, "run_checks", broken)
    haiku_goal(proj)
    server.add({"tool_calls": [call("write_file", path="haiku.txt", content=HAIKU)]}, {"content": "done"})
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"]) == (3, "error")
    assert out["error"] == "internal error (RuntimeError: a bug in a check); please report it"
    assert [r["outcome"] for r in runs(proj)] == ["error"]
    assert proj.cli_json("show", out["run_id"])["outcome"] == "error"


OUT_OF_DESCRIPTORS = """
import asyncio, json, os, resource, sys
from pathlib import Path
from runner.config import load_goal, load_project
from runner.store import open_store
from runner.verify import run_goal

project = load_project(Path(sys.argv[1]))
goal, store = load_goal(project, "haiku"), open_store(project)
store.runs()
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
for fd in held[-3:]:  # room for the event loop, nothing more
    os.close(fd)
print(json.dumps(asyncio.run(run_goal(goal, store)).to_json()))
"""


def test_running_out_of_file_descriptors_ends_the_run_in_error(proj, server):
    haiku_goal(proj)
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, str(proj.root)], capture_output=True, text=True, env=child_env()
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["outcome"] == "error" and "Too many open files" in result["error"]
    assert [r["outcome"] for r in runs(proj)] == ["error"]


def test_a_torn_last_line_of_a_transcript_is_skipped(proj, server):
    haiku_goal(proj)
    server.add({"tool_calls": [call("write_file", path="haiku.txt", content=HAIKU)]}, {"content": "done"})
    run_id = proj.cli_json("goal", "haiku")["run_id"]
    transcript = proj.root / ".runner/runs" / run_id / "transcript.jsonl"
    with transcript.open("a") as file:
        file.write('{"at": "2026-11-30T12:00:00", "kind": "mess')  # the process died mid-write
    shown = proj.cli("show", run_id)
    assert shown.exit_code == 0 and "Traceback" not in shown.output
    assert "write_file" in shown.output
    assert proj.cli_json("show", run_id)["outcome"] == "achieved"
