"""Config: every invalid file gives `file:line: field: what was expected`, exit 2, no traceback."""

from __future__ import annotations

import pytest

from runner.config import parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("5m", 300), ("2h", 7200), ("1d", 86400), (45, 45), ("1.5s", 1.5), ("250ms", 0.25)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "-3s", True])
def test_bad_durations(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


BAD_GOALS = [
    ("prompt: hi\nlimits:\n\tmax_steps: 3\n", "goals/g.yaml:3: invalid YAML: found character '\\t'"),
    ("prompt: [unclosed\n", "goals/g.yaml:2: invalid YAML: expected ',' or ']'"),
    ("name: g\n", "goals/g.yaml:1: prompt: required field is missing"),
    ("prompt: hi\nlimits:\n  max_steps: lots\n", "goals/g.yaml:3: limits.max_steps: Input should be a valid integer"),
    ("prompt: hi\nlimits:\n  timeout: soon\n", "goals/g.yaml:3: limits.timeout: expected a duration like 30s"),
    ("prompt: hi\npromt: typo\n", "goals/g.yaml:2: promt: unknown field"),
    (
        "prompt: hi\nverify:\n  checks:\n    - name: a\n      run: x\n      judge: y\n",
        "goals/g.yaml:4: verify.checks[0]: a check needs exactly one of run, judge or approve",
    ),
    ("prompt: hi\ntools: [read_file, fly]\n", "goals/g.yaml:2: tools[1]: unknown tool 'fly'"),
    ("prompt: ${NOT_SET_ANYWHERE}\n", "goals/g.yaml:1: prompt: environment variable NOT_SET_ANYWHERE is not set"),
    ("- just a list\n", "goals/g.yaml:1: (file): expected a mapping"),
    ("prompt: hi\nverify:\n  max_attempts: 0\n", "goals/g.yaml:3: verify.max_attempts: Input should be greater"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_GOALS)
def test_bad_goal_files(proj, text, expected):
    proj.write("goals/g.yaml", text)
    for args in (["goal", "g"], ["validate"]):
        result = proj.cli(*args)
        assert result.exit_code == 2, result.output
        assert expected in result.stderr, result.stderr
        assert "Traceback" not in result.output + result.stderr


def test_bad_runner_yaml(proj):
    proj.write("runner.yaml", "model:\n  name: m\ndaemon:\n  max_concurrent_runs: -1\n")
    result = proj.cli("validate")
    assert result.exit_code == 2
    assert "runner.yaml:4: daemon.max_concurrent_runs: Input should be greater than or equal to 1" in result.stderr


@pytest.mark.parametrize(
    ("store", "expected"),
    [
        ("mysql://root@db/x", "not 'mysql://'"),
        ("postgresq://me@db/x", "not 'postgresq://'"),  # a typo is not a folder named `postgresq:`
        ("postgresql:/db/x", "not 'postgresql:'"),  # one slash
        ('" postgresql://me@db/x"', "expected no space before or after"),
        ('""', "expected a folder relative to the project root"),  # what an unset ${VAR:-} gives
    ],
)
def test_a_store_that_is_neither_a_folder_nor_a_postgresql_url_is_refused(proj, store, expected):
    proj.write("runner.yaml", f"model:\n  name: m\nstore: {store}\n")
    result = proj.cli("runs")
    assert result.exit_code == 2
    assert "runner.yaml:3: store: expected " in result.stderr and expected in result.stderr
    assert [p.name for p in proj.root.iterdir() if p.name not in ("goals", "runner.yaml")] == []  # nothing made


def test_history_stays_readable_while_runner_yaml_has_a_mistake_elsewhere(proj, server):
    """`runner runs` and `runner show` read only `store` (and `daemon.store_timeout`) of runner.yaml, without
    building its models: a typo in a model setting does not hide the history, while every command that uses
    the setting still refuses with the file's line, and a wrong store or timeout is refused by all."""
    proj.goal("g", prompt="hi")
    server.add({"content": "ok"})
    run_id = proj.cli_json("goal", "g")["run_id"]
    settings = (proj.root / "runner.yaml").read_text()
    proj.write("runner.yaml", settings + "daemon:\n  max_concurrent_runs: 0\n")
    assert run_id in proj.cli("runs").output
    assert proj.cli("show", run_id).exit_code == 0
    line = len(settings.splitlines()) + 2
    for command in ("validate", "goal g", "list"):
        refused = proj.cli(*command.split())
        assert refused.exit_code == 2 and f"runner.yaml:{line}: daemon.max_concurrent_runs: " in refused.stderr
    for wrong, where in (("daemon:\n  store_timeout: 0\n", "daemon.store_timeout"), ("daemon: [1]\n", "daemon")):
        proj.write("runner.yaml", settings + wrong)
        for command in (("runs",), ("show", run_id)):
            result = proj.cli(*command)
            line = len(settings.splitlines()) + (2 if "store_timeout" in wrong else 1)
            assert result.exit_code == 2 and f"runner.yaml:{line}: {where}: " in result.stderr, result.output
    proj.write("runner.yaml", settings + "daemon:\n  store_timeout: 2m\n")
    assert run_id in proj.cli("runs").output


def test_a_mistake_in_runner_yaml_is_named_there_not_in_the_goal_that_inherits_it(proj, server):
    """A default in runner.yaml is merged into every goal before validation; a mistake in it names runner.yaml
    and its line (it named each goal file at the line of a field the goal did not even hold), while the same
    mistake written in the goal itself still names the goal."""
    proj.goal("g", prompt="hi", limits={"timeout": "1m"})
    proj.goal("h", prompt="ho")
    settings = (proj.root / "runner.yaml").read_text()
    extra = "limits:\n  max_stepz: 3\nsandbox: {network: maybe}\nnotify: [{url: 5}]\n"
    proj.write("runner.yaml", settings + extra)
    line = len(settings.splitlines()) + 1
    expected = [
        f"runner.yaml:{line + 1}: limits.max_stepz: unknown field; did you mean `max_steps`?",
        f"runner.yaml:{line + 2}: sandbox.network: Input should be a valid boolean",
        f"runner.yaml:{line + 3}: notify[0].url: Input should be a valid string",
    ]
    for command in ("validate", "goal g"):
        result = proj.cli(*command.split())
        assert result.exit_code == 2 and all(result.stderr.count(e) == 1 for e in expected), result.stderr
        assert "goals/g.yaml" not in result.stderr  # nor once per goal that inherits it
    proj.write("runner.yaml", settings + "model:\n  api_key_envv: X\n")
    result = proj.cli("goal", "g")
    assert f"runner.yaml:{line + 1}: model.api_key_envv: unknown field; did you mean `api_key_env`?" in result.stderr
    proj.write("runner.yaml", settings + "limits:\n  timeout: 1m\n")
    proj.goal("g", prompt="hi", limits={"max_stepz": 3})
    result = proj.cli("goal", "g")
    assert result.exit_code == 2 and "goals/g.yaml:" in result.stderr and "runner.yaml" not in result.stderr


def test_a_scalar_default_and_a_default_check_are_named_in_runner_yaml(proj):
    """`sandbox: bogus` (a scalar standing for the whole section) and a default check whose script is missing
    name runner.yaml's line once, not each goal that inherits them (found by an audit)."""
    proj.goal("g", prompt="hi")
    proj.goal("h", prompt="ho")
    settings = (proj.root / "runner.yaml").read_text()
    line = len(settings.splitlines()) + 1
    for extra, field in (
        ("sandbox: bogus\n", "sandbox.mode: Input should be"),
        ("verify: {checks: [{run: python3 verifiers/missing.py}]}\n", "verify.checks[0].run: verifiers/missing.py"),
    ):
        proj.write("runner.yaml", settings + extra)
        result = proj.cli("validate")
        assert result.exit_code == 2 and result.stderr.count(f"runner.yaml:{line}: {field}") == 1, result.stderr
        assert "goals/" not in result.stderr


def test_a_judge_models_mistake_names_where_it_was_written(proj):
    """`judge_model` is merged over `model`: a bad field it inherits names the model's line (runner.yaml's or the
    goal's), once, and one of its own names its own line."""
    judge = {"judge_model": "j", "verify": {"checks": [{"judge": "is it good"}]}}
    proj.goal("g", prompt="hi", **judge)
    settings = (proj.root / "runner.yaml").read_text()
    proj.write("runner.yaml", settings + "model:\n  api_key_envv: X\n")
    result = proj.cli("validate")
    line = f"runner.yaml:{len(settings.splitlines()) + 2}: model.api_key_envv: unknown field"
    assert result.exit_code == 2 and result.stderr.count(line) == 1 and "judge_model" not in result.stderr
    proj.write("runner.yaml", settings)
    proj.goal("g", prompt="hi", model={"name": "m", "timeoutt": 1}, **judge)
    result = proj.cli("validate")
    assert result.stderr.startswith("goals/g.yaml:") and result.stderr.count(": model.timeoutt: unknown") == 1
    assert "judge_model" not in result.stderr
    proj.goal("g", prompt="hi", judge_model={"name": "j", "timeoutt": 1}, verify=judge["verify"])
    result = proj.cli("validate")
    assert result.stderr.startswith("goals/g.yaml:") and ": judge_model.timeoutt: unknown field" in result.stderr


@pytest.mark.parametrize("where", ["goals/bad.yaml", "schedules/bad.yaml", "runner.yaml"])
def test_a_control_character_after_a_syntax_error_is_named_not_a_traceback(proj, where):
    """The screen that refuses control characters stops at a syntax error; one 20 KB further on (past the
    parser's first chunk) made PyYAML's reader raise a traceback (found by test_fuzz_config)."""
    proj.write(where, "prompt: a: b\n# " + "x" * 20_000 + "\n\x01\n")
    result = proj.cli("validate")
    assert result.exit_code == 2
    assert f"{where}:3: the control character U+0001 is not allowed in YAML" in result.stderr


def test_validate_reports_every_problem_at_once(proj):
    proj.write("goals/a.yaml", "name: a\n")
    proj.write("goals/b.yaml", "prompt: hi\nlimits: {max_steps: x}\n")
    result = proj.cli("validate")
    assert result.exit_code == 2
    assert "goals/a.yaml:1: prompt" in result.stderr and "goals/b.yaml:2: limits.max_steps" in result.stderr


def test_env_defaults_and_overrides(proj, server, monkeypatch):
    monkeypatch.setenv("GREETING", "bonjour")
    proj.goal("g", prompt="${GREETING} ${NAME:-world}", limits={"max_steps": 7})
    server.add({"content": "ok"})
    out = proj.cli_json("goal", "g", "--max-steps", "2", "--model", "other-model")
    assert out["outcome"] == "achieved"
    request = server.requests[0]
    assert request["messages"][1]["content"] == "bonjour world"
    assert request["model"] == "other-model"


def test_project_defaults_merge_under_goal_fields(proj, server):
    proj.write(
        "runner.yaml",
        {
            "model": {"name": "base", "base_url": server.base_url, "api_key_env": "TEST_API_KEY", "temperature": 0.5},
            "limits": {"max_steps": 1},
        },
    )
    proj.goal("g", prompt="hi", model={"temperature": 0.1})
    server.add({"tool_calls": [{"name": "list_files", "arguments": {}}]})
    out = proj.cli_json("goal", "g")
    assert out["stop_reason"] == "max_steps" and out["steps"] == 1
    assert server.requests[0]["model"] == "base" and server.requests[0]["temperature"] == 0.1


def test_unknown_goal_and_bad_flags(proj):
    result = proj.cli("goal", "nothing")
    assert result.exit_code == 2 and "no goal named 'nothing'" in result.stderr
    assert proj.cli("goal").exit_code == 2
    assert proj.cli("goal", "--max-steps", "0", "x").exit_code == 2


def test_no_model_anywhere(proj, monkeypatch):
    monkeypatch.delenv("RUNNER_MODEL", raising=False)
    proj.write("runner.yaml", "limits: {max_steps: 3}\n")
    proj.goal("g", prompt="hi")
    result = proj.cli("goal", "g")
    assert result.exit_code == 2 and "goals/g.yaml:1: model: no model is set" in result.stderr


def test_a_missing_model_is_reported_with_the_other_problems(proj, monkeypatch):
    monkeypatch.delenv("RUNNER_MODEL", raising=False)
    proj.write("runner.yaml", "limits: {max_steps: 3}\n")
    proj.write("goals/g.yaml", "prompt: hi\nlimits:\n  max_steps: lots\n")
    result = proj.cli("validate")
    assert result.exit_code == 2
    assert "goals/g.yaml:1: model: no model is set" in result.stderr
    assert "goals/g.yaml:3: limits.max_steps: Input should be a valid integer" in result.stderr


def test_a_missing_workdir_is_bad_input(proj):
    proj.goal("g", prompt="hi", workdir="nowhere")
    result = proj.cli("goal", "g")
    assert result.exit_code == 2 and "nowhere is not a folder" in result.stderr
    (proj.root / "elsewhere").mkdir()
    assert "is not a folder" in proj.cli("goal", "g", "--workdir", "missing").stderr


def test_a_goal_keeps_the_folders_it_resolved_and_a_copy_elsewhere_resolves_its_own(proj, tmp_path_factory):
    """The workdir is resolved once per goal: a symlink swapped in after the run looked does not move the
    run's tools elsewhere; a copy of the goal under another root resolves against that root."""
    from runner.config import Catalog

    (proj.root / "work").mkdir()
    proj.goal("g", prompt="p", workdir="work")
    goal = Catalog.load(proj.root).goals["g"]
    first = goal.workpath
    assert first == (proj.root / "work").resolve() and goal.rootpath == proj.root.resolve()
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (proj.root / "work").rename(proj.root / "old-work")
    (proj.root / "work").symlink_to(elsewhere)
    assert goal.workpath == first  # not the symlink's target
    other = tmp_path_factory.mktemp("other")
    (other / "work").mkdir()
    copy = goal.model_copy(update={"root": other})
    assert copy.workpath == (other / "work").resolve() and copy.rootpath == other.resolve()
    assert Catalog.load(proj.root).goals["g"].workpath == elsewhere.resolve()  # a reload looks again
