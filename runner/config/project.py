"""A user's project: finding its root, loading .env and runner.yaml, and turning goal files into `Goal`s.

One loader reads each file (see `yamlfile`), merges the project defaults into the goal, and turns
every validation error into `file:line: field: what was expected`.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .values import DEFAULT_STORE, DEFAULT_STORE_TIMEOUT, check_store, is_postgres_url, parse_duration
from .yamlfile import Document, Elsewhere, Loc, read_yaml

if TYPE_CHECKING:
    from .models import Goal, Settings

PROJECT_MARKERS = ("runner.yaml", "goals", "schedules")


class Project:
    """A user's project: its root, its runner.yaml and where its files live.

    `settings`, runner.yaml validated, is built when first used. `store` and `store_timeout` are read
    without it when runner.yaml gives them plainly (`load_project(lazy=True)`): `runner runs` needs
    no pydantic. Anything irregular is left to the model, which reports it with the file's line.
    """

    def __init__(self, root: Path, settings: Settings | None = None, doc: Document | None = None) -> None:
        self.root = root
        self._settings = settings
        self._doc = doc

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from .models import Settings

            self._settings = Settings() if self._doc is None else self._doc.validate(Settings)
        return self._settings

    @property
    def store(self) -> str:
        """runner.yaml `store:`: a folder relative to the root (SQLite) or a postgresql:// URL."""
        if self._settings is None:
            value = self._raw().get("store", DEFAULT_STORE)
            if isinstance(value, str):
                try:
                    return check_store(value)
                except ValueError:
                    pass
        return self.settings.store

    @property
    def store_timeout(self) -> float:
        """runner.yaml `daemon.store_timeout`: how long a write waits for a store another process holds."""
        if self._settings is None:
            daemon = self._raw().get("daemon", {})
            try:
                timeout = parse_duration(daemon.get("store_timeout", DEFAULT_STORE_TIMEOUT))
                if timeout > 0:
                    return timeout
            except (AttributeError, ValueError):
                pass
        return self.settings.daemon.store_timeout

    @property
    def on_postgres(self) -> bool:
        return is_postgres_url(self.store)

    @property
    def state(self) -> Path:
        """The local state folder; with a postgresql:// store it holds only this machine's locks and ports."""
        return self.root / (DEFAULT_STORE if self.on_postgres else self.store)

    @property
    def document(self) -> Document | None:
        """runner.yaml as read, with its lines (None when there is none, or it is empty)."""
        return self._doc

    def _raw(self) -> dict[str, Any]:
        return self._doc.data if self._doc is not None and isinstance(self._doc.data, dict) else {}

    def goal_files(self) -> list[Path]:
        folder = self.root / "goals"
        return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else []

    def schedule_files(self) -> list[Path]:
        folder = self.root / "schedules"
        return sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]) if folder.is_dir() else []


def find_root(start: Path | None = None) -> Path:
    """The nearest folder upwards holding runner.yaml, goals/ or schedules/, else `start`."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    return here


_DOTENV_NAMES: set[str] = set()


def dotenv_names() -> frozenset[str]:
    """Names of the variables .env files put into the environment (never passed to tools or checks unless a
    goal's `env` names them)."""
    return frozenset(_DOTENV_NAMES)


def load_dotenv(root: Path) -> None:
    """Load ROOT/.env into the environment without overriding variables already set; remember every name it
    lists (one exported in the shell as well stays out of tools and checks too)."""
    path = root / ".env"
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        os.environ.setdefault(key, value)
        _DOTENV_NAMES.add(key)


def load_project(root: Path | None = None, lazy: bool = False) -> Project:
    """The project at or above `root`, with .env loaded; runner.yaml validated now unless `lazy`."""
    root = find_root(root)
    load_dotenv(root)
    path = root / "runner.yaml"
    if not path.is_file():
        return Project(root)
    doc = read_yaml(path, root)
    if doc.data is None:
        return Project(root)
    if not isinstance(doc.data, dict):
        raise ConfigError(doc.problem((), "expected a mapping of settings"))
    project = Project(root, doc=doc)
    if not lazy:
        project.settings  # noqa: B018 - validates runner.yaml now, before the command does anything
    return project


def goal_path(project: Project, name_or_file: str) -> Path:
    """A goal named NAME (goals/NAME.yaml, or a goal whose `name:` says NAME) or a file path."""
    candidate = Path(name_or_file)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate.resolve()
    for suffix in (".yaml", ".yml"):
        path = project.root / "goals" / f"{name_or_file}{suffix}"
        if path.is_file():
            return path
    for path in project.goal_files():
        doc = read_yaml(path, project.root)
        if isinstance(doc.data, dict) and doc.data.get("name") == name_or_file:
            return path
    known = ", ".join(p.stem for p in project.goal_files()) or "none"
    raise ConfigError(f"no goal named {name_or_file!r} in {project.root / 'goals'} (goals: {known})")


def load_goal(project: Project, name_or_file: str, overrides: dict[str, Any] | None = None) -> Goal:
    return goal_from_file(project, goal_path(project, name_or_file), overrides)


def goal_from_file(project: Project, path: Path, overrides: dict[str, Any] | None = None) -> Goal:
    doc = read_yaml(path, project.root)
    if not isinstance(doc.data, dict):
        raise ConfigError(doc.problem((), "expected a mapping with at least `prompt:`"))
    return build_goal(project, doc.data, doc, default_name=path.stem, source=doc.shown, overrides=overrides)


def build_goal(
    project: Project,
    data: dict[str, Any],
    doc: Document | None = None,
    *,
    default_name: str,
    source: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Goal:
    """Merge the project defaults under a goal's own fields, command-line overrides over them, and validate.

    `overrides` maps a section (`model`, `limits`, `verify`) to fields, or `workdir` to a path.
    """
    merged = dict(data)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict):
            current = merged.get(key)
            current = {"name": current} if key == "model" and isinstance(current, str) else current
            merged[key] = {**(current if isinstance(current, dict) else {}), **value}
        else:
            merged[key] = value
    merged.setdefault("name", default_name)
    defaults = project.settings
    model = merged.get("model")
    model = {"name": model} if isinstance(model, str) else model
    if model is None or isinstance(model, dict):
        merged["model"] = {**defaults.model, **(model or {})}
        if "name" not in merged["model"] and os.environ.get("RUNNER_MODEL"):
            merged["model"]["name"] = os.environ["RUNNER_MODEL"]
    judge = merged.get("judge_model")
    if isinstance(judge, (str, dict)):
        judge = {"name": judge} if isinstance(judge, str) else judge
        merged["judge_model"] = {**merged["model"], **judge} if isinstance(merged["model"], dict) else judge
    for section in ("limits", "verify"):
        if isinstance(merged.get(section, {}), dict):
            merged[section] = {**getattr(defaults, section), **merged.get(section, {})}
    if defaults.mcp and isinstance(merged.get("mcp", {}), dict):
        shared = {name: server.model_dump(exclude_unset=True) for name, server in defaults.mcp.items()}
        merged["mcp"] = {**shared, **merged.get("mcp", {})}
    for inherited in ("sandbox", "notify"):
        if inherited not in merged and inherited in defaults.model_fields_set:  # `sandbox: off` is false
            merged[inherited] = getattr(defaults, inherited)
    merged["root"] = project.root
    merged["source"] = source
    doc = doc or Document(path=Path("<inline>"), data=merged, shown="<inline goal>")
    no_model = isinstance(merged["model"], dict) and "name" not in merged["model"]
    problems: list[str] = []
    if no_model:
        merged["model"]["name"] = ""  # reported below, with the file's other problems
        problems.append(doc.problem(("model",), NO_MODEL))
    if isinstance(merged.get("prompt"), str) and not merged["prompt"].strip():
        problems.append(doc.problem(("prompt",), "the prompt is empty: say what the agent should do"))
    from .models import Goal

    elsewhere = _inherited_from(project, doc, data, overrides or {})
    try:
        goal = doc.validate(Goal, merged, elsewhere=elsewhere)
    except ConfigError as exc:
        raise ConfigError("invalid goal", problems + exc.problems) from None
    if not _is_folder(goal.workpath):
        problems.append(doc.problem(("workdir",), f"{goal.workpath} is not a folder (relative to the project root)"))
    problems += missing_scripts(goal, doc, elsewhere)
    if problems:
        raise ConfigError("invalid goal", problems)
    return goal


INHERITED = ("model", "limits", "verify", "mcp", "sandbox", "notify")
"""A goal's sections that runner.yaml gives defaults for."""


def _inherited_from(project: Project, goal_doc: Document, own: dict[str, Any], overrides: dict[str, Any]) -> Elsewhere:
    """For a problem in a merged goal, where the faulty value was written when not in the goal file at that
    place: runner.yaml for a default the goal and the command line did not give, the `model` section for a
    judge's field inherited from it. The message names the file, line and field to fix."""
    settings = project.document

    def elsewhere(loc: Loc) -> tuple[Document, Loc] | None:
        judge = own.get("judge_model")
        if (
            loc[:1] == ("judge_model",)
            and len(loc) > 1
            and isinstance(judge, (str, dict))
            and not _holds({"judge_model": judge}, loc[:2])
        ):
            loc = ("model", *loc[1:])  # merged from the model (the goal's or runner.yaml's) under the judge's own
            return from_settings(loc) or (goal_doc, loc)
        return from_settings(loc)

    def from_settings(loc: Loc) -> tuple[Document, Loc] | None:
        if settings is None or not loc or loc[0] not in INHERITED:
            return None
        given = loc[:2]
        if _holds(own, given) or _holds(overrides, given) or not _holds(settings.data, given):
            return None
        return settings, loc

    return elsewhere


def _holds(data: Any, loc: Loc) -> bool:
    """Whether `data` gives a value at `loc`: `model: NAME` gives `model.name`, `sandbox: off` the whole
    `sandbox` (a scalar stands for its section, but a model's or judge's stands for its name only)."""
    whole = bool(loc) and loc[0] not in ("model", "judge_model")
    for part in loc:
        if isinstance(data, str) and part == "name":
            return True
        if whole and data is not None and not isinstance(data, (dict, list)):
            return True
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if not (in_list or (isinstance(data, dict) and part in data)):
            return False
        data = data[part]
    return True


INTERPRETERS = {"python", "python3", "sh", "bash", "node", "ruby", "perl", "zsh", "pytest", "deno", "bun", "php"}
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".zsh", ".js", ".mjs", ".ts", ".rb", ".pl", ".php")
_SEPARATORS = ("&&", "||", ";", "|")


def script_words(command: str) -> list[str]:
    """The scripts a check command executes (`python verifiers/x.py`, `sh check.sh`, `./check`), as written."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    scripts: list[str] = []
    command_start = True
    for i, word in enumerate(words):
        if word in _SEPARATORS:
            command_start = True
            continue
        if command_start:
            command_start = False
            name = Path(word).name
            if "/" in word and not any(name.startswith(interp) for interp in INTERPRETERS):
                scripts.append(word)
            elif name.rstrip("0123456789.") in INTERPRETERS:
                rest = [w for w in words[i + 1 :] if not w.startswith("-")]
                if rest and rest[0] not in _SEPARATORS:
                    scripts.append(rest[0])
    return [s.replace("$RUNNER_ROOT/", "").replace("${RUNNER_ROOT}/", "") for s in scripts]


def missing_scripts(goal: Goal, doc: Document, elsewhere: Elsewhere | None = None) -> list[str]:
    """A `run:` check whose script (a path, or a file name with a script suffix) exists neither in the
    workdir nor at the project root: a typo, caught before any model call. Named where the check was written
    (`elsewhere`: runner.yaml for a default)."""
    problems = []
    for i, check in enumerate(goal.verify.checks):
        for word in script_words(check.run or ""):
            if "$" in word or not ("/" in word or word.endswith(SCRIPT_SUFFIXES)):
                continue
            if not any(_exists(base / word) for base in (goal.workpath, goal.root)):
                where = "the workdir" if goal.workpath == goal.rootpath else "the workdir or the project root"
                message = (
                    f"{word} does not exist in {where}: fix the path (if the agent is to create it, "
                    "check it through another command)"
                )
                problems.append(doc.problem(("verify", "checks", i, "run"), message, elsewhere))
    return problems


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name too long, a loop of symlinks: not a usable folder either
        return False


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


NO_MODEL = (
    "no model is set; give `model:` in the goal or runner.yaml (e.g. `model: {name: gpt-4.1-mini, "
    "api_key_env: OPENAI_API_KEY}`; runner.yaml from `runner init` has commented examples), "
    "--model on the command line, or RUNNER_MODEL in the environment"
)
