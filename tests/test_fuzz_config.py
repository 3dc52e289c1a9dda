"""Hostile configuration: `runner validate` and goal loading answer every file with exit 0 or 2, never a
traceback, a hang or unbounded memory (issue 9, item 10).

Property tests (hypothesis) feed generated and mutated goal, schedule and runner.yaml files through the loader
and `runner validate` in this process; a few real `runner validate` processes run the worst documents under a
memory limit.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.cli import main
from runner.config import Catalog
from runner.errors import ConfigError

VALID_GOAL = """\
name: calc
prompt: |
  Fix the bug in calc.py so that the tests pass.
workdir: .
model: {name: test-model, base_url: http://127.0.0.1:9/v1, api_key_env: null, temperature: 0}
judge_model: judge
tools: [read_file, write_file, {name: weather, run: python3 tools/w.py, timeout: 30s}]
limits: {max_steps: 20, max_tokens: 200000, timeout: 10m}
env: [GITHUB_TOKEN]
protect: [secrets/**]
verify:
  max_attempts: 3
  stuck_after: 2
  before_retry: git checkout -- .
  checks:
    - name: unit
      run: python3 -m pytest -q tests/test_calc.py
      timeout: 30s
    - judge: The fix is minimal.
      files: [calc.py]
    - approve: Ship it?
"""
VALID_SCHEDULE = """\
- goal: calc
  every: 15m
  jitter: 30s
  misfire_grace: 5m
- goal: calc
  cron: "0 9 * * 1-5"
  timezone: Europe/Paris
"""
HOSTILE = [
    "\x01",
    "\x00",
    "\t",
    "\ufeff",
    "\ud7ff",
    "&a [*a]",
    "&a {k: *a}",
    "*undefined",
    "[" * 1200,
    "{" * 1200,
    "- " * 300,
    ".nan",
    ".inf",
    "-.inf",
    "99999999999d",
    "1e309",
    "9" * 5000,
    "0x" + "f" * 3000,
    "2024-13-45",
    "2024-02-30 25:61:61",
    "!!python/object:os.system",
    "!!binary AAAA",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "? [a, b]\n: c",
    "<<: *a",
    "''",
    '""',
    "~",
    "{}",
    "[]",
    "${UNSET_VARIABLE_FOR_FUZZ}",
    "${HOME:-x}",
    "'a\\0b'",
    '"a\\0b"',
    "a" * 5000,
    "../../../../etc",
    "python3 " + "a" * 300 + ".py",
    "cat " + "b/" * 3000,
    "'python3 x.py \\0'",
    "---\n---\n",
    "%YAML 1.1\n---",
    ": :",
    "|\n  text",
    ">-\n",
]
FIELDS = [
    "name",
    "prompt",
    "workdir",
    "model",
    "judge_model",
    "tools",
    "limits",
    "timeout",
    "max_steps",
    "env",
    "protect",
    "verify",
    "checks",
    "run",
    "judge",
    "approve",
    "files",
    "every",
    "cron",
    "misfire_grace",
    "jitter",
    "at",
    "until",
    "mcp",
    "sandbox",
    "notify",
    "budget",
    "goal",
]

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
WORST = {
    "alias bomb": "prompt: hi\nmodel: {name: x}\n" + ALIAS_BOMB,
    "deep nesting": "prompt: hi\nmodel: {name: x}\nx: " + "[" * 5000 + "]" * 5000 + "\n",
    "recursive alias": "prompt: hi\nmodel: &m {name: x, extra_body: *m}\n",
    "huge integer": "prompt: hi\nmodel: {name: x}\nlimits: {max_steps: " + "9" * 100_000 + "}\n",
    "huge file": "prompt: hi\nmodel: {name: x}\n" + "# padding\n" * 200_000,
}


def project(root: Path, goal: str | None = None, schedule: str | None = None, settings_file: str | None = None) -> Path:
    (root / "goals").mkdir(parents=True, exist_ok=True)
    (root / "goals" / "calc.yaml").write_text(VALID_GOAL if goal is None else goal, encoding="utf-8")
    if schedule is not None:
        (root / "schedules").mkdir(exist_ok=True)
        (root / "schedules" / "team.yaml").write_text(schedule, encoding="utf-8")
    if settings_file is not None:
        (root / "runner.yaml").write_text(settings_file, encoding="utf-8")
    return root


def load_and_validate(root: Path) -> int:
    """The loader raises nothing but ConfigError, and `runner validate` exits 0 or 2 without a traceback."""
    try:
        Catalog.load(root)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
    result = CliRunner().invoke(main, ["-C", str(root), "validate"])
    assert isinstance(result.exception, (SystemExit, type(None))), result.exception
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    return result.exit_code


def test_the_valid_documents_are_valid(tmp_path):
    assert load_and_validate(project(tmp_path, schedule=VALID_SCHEDULE)) == 0


def mutate(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply (where, how much to cut, what to insert) edits to a document."""
    for where, cut, insert in edits:
        at = where % (len(text) + 1)
        text = text[:at] + insert + text[at + cut :]
    return text


edits = st.lists(
    st.tuples(
        st.integers(0, 10_000),
        st.integers(0, 40),
        st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12), st.sampled_from(["\n", ": ", "- ", "  ", "#"])),
    ),
    min_size=1,
    max_size=6,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["30s", "5m", "1d", "-1s", "99999999999d", "0", ".", "**", ".runner", "", " "]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
documents = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)

FUZZ = settings(
    max_examples=100,
    deadline=10_000,  # ms per document: a hang fails here
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.slow
@FUZZ
@given(edits=edits)
def test_mutated_goal_files(tmp_path_factory, edits):
    root = project(tmp_path_factory.mktemp("goal"), goal=mutate(VALID_GOAL, edits))
    load_and_validate(root)


@pytest.mark.slow
@FUZZ
@given(edits=edits)
def test_mutated_schedule_files(tmp_path_factory, edits):
    root = project(tmp_path_factory.mktemp("schedule"), schedule=mutate(VALID_SCHEDULE, edits))
    load_and_validate(root)


@pytest.mark.slow
@FUZZ
@given(goal=documents, settings_file=documents, entry=documents)
def test_generated_documents(tmp_path_factory, goal, settings_file, entry):
    dump = yaml.safe_dump
    root = project(
        tmp_path_factory.mktemp("gen"), goal=dump(goal), schedule=dump([entry]), settings_file=dump(settings_file)
    )
    load_and_validate(root)


@pytest.mark.slow
@FUZZ
@given(field=st.sampled_from(FIELDS), hostile=st.sampled_from(HOSTILE), nested=st.booleans())
def test_hostile_values_in_every_field(tmp_path_factory, field, hostile, nested):
    line = f"verify:\n  checks:\n    - {field}: {hostile}\n" if nested else f"{field}: {hostile}\n"
    root = project(
        tmp_path_factory.mktemp("hostile"),
        goal="prompt: hi\nmodel: {name: x}\n" + line,
        schedule=f"- goal: calc\n  {field}: {hostile}\n",
    )
    load_and_validate(root)


MEMORY_LIMIT = 1 << 30
"""Address space of each `runner validate` process below: an alias bomb once took 2.8 GB."""


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.parametrize("name", sorted(WORST))
def test_the_worst_documents_in_a_real_process(tmp_path, name):
    project(tmp_path, goal=WORST[name])
    done = subprocess.run(
        [sys.executable, "-m", "runner", "-C", str(tmp_path), "validate"],
        capture_output=True,
        text=True,
        timeout=60,  # a hang fails here
        preexec_fn=limited,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("goals/calc.yaml:")
