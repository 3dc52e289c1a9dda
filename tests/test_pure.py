"""Pure helpers, tested directly: the judge's verdict, merging project defaults into a goal, script loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.config import Project, Settings, build_goal
from runner.errors import ConfigError
from runner.testing import load_script
from runner.verify.checks import parse_verdict


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"pass": true, "reason": "fine"}', (True, "fine")),
        ('Here you go:\n```json\n{"pass": false, "reason": "no loops"}\n```', (False, "no loops")),
        ('{"pass": true}', (True, "")),
        ('I think {"reason": "x", "pass": false} is right', (False, "x")),
    ],
)
def test_a_verdict_is_read_through_fences_and_prose(text, verdict):
    assert parse_verdict(text) == verdict


@pytest.mark.parametrize("text", ["yes", '{"pass": "yes"}', "{not json}", '{"verdict": true}', ""])
def test_what_is_not_a_verdict_is_none(text):
    assert parse_verdict(text) is None


def project(tmp_path: Path, **settings) -> Project:
    return Project(tmp_path, Settings.model_validate(settings))


def test_goal_fields_override_the_project_defaults_field_by_field(tmp_path):
    proj = project(tmp_path, model={"name": "base", "temperature": 0.5}, limits={"max_steps": 7, "max_tokens": 99})
    goal = build_goal(proj, {"prompt": "p", "model": {"temperature": 0}, "limits": {"max_steps": 3}}, default_name="g")
    assert (goal.model.name, goal.model.temperature) == ("base", 0)
    assert (goal.limits.max_steps, goal.limits.max_tokens) == (3, 99)


def test_command_line_overrides_win_over_goal_and_project(tmp_path):
    proj = project(tmp_path, model="base", verify={"max_attempts": 5})
    data = {"prompt": "p", "model": "mine", "verify": {"max_attempts": 2, "fresh_context": True}}
    goal = build_goal(proj, data, default_name="g", overrides={"model": {"name": "cli"}, "verify": {"max_attempts": 9}})
    assert goal.model.name == "cli"
    assert (goal.verify.max_attempts, goal.verify.fresh_context) == (9, True)


def test_a_judge_model_inherits_the_goal_model(tmp_path):
    proj = project(tmp_path, model={"name": "base", "base_url": "http://127.0.0.1:9/v1"})
    goal = build_goal(proj, {"prompt": "p", "judge_model": "strict"}, default_name="g")
    assert goal.judge_model is not None
    assert (goal.judge_model.name, goal.judge_model.base_url) == ("strict", "http://127.0.0.1:9/v1")


def test_the_model_can_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNNER_MODEL", "from-env")
    assert build_goal(project(tmp_path), {"prompt": "p"}, default_name="g").model.name == "from-env"


def test_a_goal_without_any_model_says_how_to_set_one(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNNER_MODEL", raising=False)
    with pytest.raises(ConfigError) as caught:
        build_goal(project(tmp_path), {"prompt": "p"}, default_name="g")
    assert "--model" in str(caught.value)
    assert "RUNNER_MODEL" in str(caught.value)


def test_sandbox_and_notify_come_from_runner_yaml_unless_the_goal_says(tmp_path):
    proj = project(tmp_path, model="m", sandbox="off", notify=["json://127.0.0.1:1/"])
    inherited = build_goal(proj, {"prompt": "p"}, default_name="g")
    data = {"prompt": "p", "sandbox": {"mode": "bwrap", "network": False}, "notify": []}
    own = build_goal(proj, data, default_name="h")
    assert inherited.sandbox.mode == "off"
    assert [t.url for t in inherited.notify] == ["json://127.0.0.1:1/"]
    assert (own.sandbox.mode, own.sandbox.network, own.notify) == ("bwrap", False, [])


def test_a_script_is_a_list_of_replies(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("- tool_calls: [{name: shell, arguments: {command: ls}}]\n- content: Done.\n")
    assert load_script(path) == [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]},
        {"content": "Done."},
    ]


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ("content: Done.\n", 1, "expected a list of replies"),
        ("- content: ok\n- 42\n", 2, "expected a mapping"),
        ("- content: ok\n- contents: typo\n", 2, "unknown field"),
        ("- tool_calls: [{arguments: {}}]\n", 1, "expected {name: TOOL"),
    ],
)
def test_a_bad_script_names_its_line(tmp_path, text, line, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_script(path, shown="s.yaml")
    assert str(caught.value).startswith(f"s.yaml:{line}:")
    assert expected in str(caught.value)
