"""The sandbox of the agent's processes, attacked through the shell by a scripted model: the bubblewrap jail
where it works (CI installs bubblewrap), and the fallback (`RUNNER_SANDBOX=off`, `sandbox: off`, no bwrap)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from support import KEY, call

from runner.config import Goal, ModelConfig
from runner.store import SqliteStore
from runner.work.tools import sandbox


def bwrap_works() -> bool:
    path = shutil.which("bwrap")
    return path is not None and sandbox._probe(path) is None


JAILED = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is not installed or cannot create namespaces here")


@pytest.fixture(params=["jail", "fallback"])
def mode(request, monkeypatch) -> str:
    """Both paths: the jail (skipped where bwrap cannot run) and the fallback."""
    if request.param == "jail" and not bwrap_works():
        pytest.skip("bubblewrap is not installed or cannot create namespaces here")
    if request.param == "fallback":
        monkeypatch.setenv("RUNNER_SANDBOX", "off")
    return request.param


def attack(proj, server, command: str, checks: list | None = None, **fields) -> tuple[dict, str]:
    """Run goal `g` whose model sends one shell command, then stops; the run's JSON and the command's output."""
    proj.goal("g", prompt="work", verify={"max_attempts": 1, "checks": checks or []}, **fields)
    server.add({"tool_calls": [call("shell", command=command)]}, {"content": "done"})
    out = proj.cli_json("goal", "g")
    return out, tool_output(proj, out["run_id"])


def tool_output(proj, run_id: str) -> str:
    events = SqliteStore(proj.root / ".runner").transcript_events(run_id)
    return "\n".join(e["output"] for e in events if e["kind"] == "tool_result")


def events(proj, run_id: str, kind: str) -> list[dict]:
    return [e for e in SqliteStore(proj.root / ".runner").transcript_events(run_id) if e["kind"] == kind]


def goal(root: Path, **fields) -> Goal:
    return Goal(name="g", prompt="p", model=ModelConfig(name="m"), root=root, **fields)


# the status line: jailed, or off and why
@JAILED
def test_a_run_records_that_it_is_jailed(proj, server):
    out, _ = attack(proj, server, "true")
    assert events(proj, out["run_id"], "sandbox")[0]["status"] == "sandbox: bubblewrap jail (network on)"


def test_the_status_says_why_the_sandbox_is_off(tmp_path, monkeypatch):
    assert sandbox.sandbox_status(goal(tmp_path, sandbox="off")).startswith("sandbox: off (`sandbox: off`)")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    status = sandbox.sandbox_status(goal(tmp_path))
    assert status.startswith("sandbox: off (bwrap is not installed")
    assert "the fallback tracks and kills the agent's processes" in status


@pytest.mark.parametrize(
    ("runner_yaml", "goal_yaml"),
    [("sandbox: off\n", ""), ("", "sandbox: off\n"), ("", "sandbox: {mode: off, network: off}\n")],
    ids=["runner.yaml", "goal", "goal, mode"],
)
def test_a_bare_sandbox_off_as_design_writes_it_turns_the_jail_off(proj, runner_yaml, goal_yaml):
    """YAML 1.1 reads a bare `off` as false: `sandbox: off` still means off, in runner.yaml and in a goal."""
    proj.write("runner.yaml", "model: {name: m}\n" + runner_yaml)
    proj.write("goals/g.yaml", "prompt: work\n" + goal_yaml)
    result = proj.cli("validate")
    assert result.exit_code == 0, result.output
    assert "sandbox: off (`sandbox: off`)" in result.output


def test_bwrap_required_but_missing_ends_the_run_error_before_any_model_call(proj, server, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    proj.goal("g", prompt="work", sandbox="bwrap")
    out = proj.cli_json("goal", "g")
    assert (out["exit_code"], out["outcome"]) == (3, "error")
    assert "`sandbox: bwrap` is required but bwrap is not installed" in out["error"]
    assert server.requests == []


def test_without_bwrap_on_path_the_run_falls_back_and_says_so(proj, server, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out, output = attack(proj, server, "echo hello from the fallback")
    assert out["outcome"] == "achieved" and "hello from the fallback" in output
    assert "bwrap is not installed" in events(proj, out["run_id"], "sandbox")[0]["status"]


# the filesystem
@JAILED
def test_the_jail_is_read_only_but_the_workdir_and_protects_what_the_checks_read(proj, server):
    proj.write("verifiers/v.py", "import sys; sys.exit(open(sys.argv[1]).read() != 'assert 1 == 2\\n')\n")
    proj.write("tests/test_calc.py", "assert 1 == 2\n")
    proj.write("src/calc.py", "x = 1\n")
    command = (
        "echo forged > verifiers/v.py; echo 'assert True' > tests/test_calc.py; echo x > /etc/runner-escape; "
        "mkdir -p /tmp/x && echo y > /tmp/x/y; echo 'x = 2' > src/calc.py && echo wrote src"
    )
    out, output = attack(proj, server, command, checks=[{"run": "python3 verifiers/v.py tests/test_calc.py"}])
    assert output.count("Read-only file system") == 3
    assert "wrote src" in output and (proj.root / "src/calc.py").read_text() == "x = 2\n"
    assert out["outcome"] == "achieved"  # nothing was tampered with: the writes never happened
    assert (proj.root / "tests/test_calc.py").read_text() == "assert 1 == 2\n"
    assert not Path("/etc/runner-escape").exists() and not Path("/tmp/x/y").exists()


@JAILED
def test_the_jail_hides_env_and_the_store(proj, server):
    proj.write(".env", "DATABASE_URL=postgres://app:hunter2@db/app\n")
    insert = (
        "python3 -c \"import sqlite3; c = sqlite3.connect('.runner/runs.db'); "
        "c.execute('CREATE TABLE forged (x)'); c.commit()\""
    )
    out, output = attack(proj, server, f"cat .env; ls -A .runner; {insert}; echo > .runner/runs.db")
    assert "hunter2" not in output and "runs.db" not in output.split("Traceback")[0]
    assert "Read-only file system" in output
    tables = sqlite3.connect(proj.root / ".runner/runs.db").execute("SELECT name FROM sqlite_master").fetchall()
    assert ("forged",) not in tables
    assert proj.cli_json("show", out["run_id"])["outcome"] == "achieved"  # the store is intact


@JAILED
def test_the_jail_sees_only_its_own_processes(proj, server):
    command = "ls /proc | grep -c '^[0-9]'; cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; "
    command += "tr '\\0' '\\n' < /proc/1/environ"
    _, output = attack(proj, server, command)
    lines = output.splitlines()
    assert int(lines[1]) < 10
    programs = {Path(word).name for word in lines[2].split()}
    assert "bwrap" in programs and not programs & {"python", "python3", "pytest"}  # runner is not there
    assert KEY not in output


@JAILED
@pytest.mark.parametrize("network", [True, False])
def test_network_is_on_unless_turned_off(proj, server, network):
    connect = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {server.port}), 5)\""
    connect += " && echo connected"
    _, output = attack(proj, server, connect, sandbox={"network": network})
    assert ("connected" in output) is network


# secrets, on both paths
def test_dotenv_variables_reach_tools_only_when_named(proj, server, mode):
    proj.write(".env", "DATABASE_URL=postgres://app:hunter2@db/app\nPLAIN_SETTING=shown-when-named\n")
    _, output = attack(proj, server, 'echo "db=$DATABASE_URL plain=$PLAIN_SETTING"', env=["PLAIN_SETTING"])
    assert "db= plain=shown-when-named" in output


def test_a_key_variable_without_key_in_its_name_is_not_passed(proj, server, mode, monkeypatch):
    monkeypatch.setenv("PROVIDER_CRED", KEY)
    text = proj.root.joinpath("runner.yaml").read_text().replace("TEST_API_KEY", "PROVIDER_CRED")
    proj.write("runner.yaml", text)
    out, output = attack(proj, server, 'echo "cred=$PROVIDER_CRED"; env | grep -c sk-test || true')
    assert out["outcome"] == "achieved"
    assert "cred=\n0" in output and KEY not in output


def test_the_key_is_not_in_any_environ_the_agent_can_read(proj, server, mode):
    """runner started with the key in its environment (as a shell export): /proc/$PPID/environ (runner's own
    in the fallback, the jail's init in the jail) holds no key."""
    proj.goal("g", prompt="work", verify={"max_attempts": 1})
    grep = "tr '\\0' '\\n' < /proc/$PPID/environ | grep -c sk-test-secret"
    server.add({"tool_calls": [call("shell", command=grep)]}, {"content": "done"})
    done = proj.subprocess("goal", "g", "--json", timeout=120)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["outcome"] == "achieved", done.stderr
    output = tool_output(proj, out["run_id"])
    assert output.splitlines()[-1] == "0" and KEY not in output


@JAILED
def test_cat_env_is_refused_in_the_jail(proj, server):
    proj.write(".env", "SOMETHING=hunter2\n")
    _, output = attack(proj, server, "cat .env; cat ./.env; cat $PWD/.env")
    assert "hunter2" not in output
