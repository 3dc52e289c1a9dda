"""Schedule entries (`schedules/*.yaml`), and the `Catalog` of every goal and entry a project declares."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..errors import ConfigError
from .models import Budget, Duration, Goal, NotifyTarget, Strict, StrList
from .project import Project, goal_from_file, load_project
from .yamlfile import Document, read_yaml

TRIGGERS = ("cron", "every", "at", "watch", "webhook", "after")


class Entry(Strict):
    """One schedule entry: a goal and exactly one trigger, with its options."""

    goal: str
    cron: str | None = None
    """Five fields: minute hour day-of-month month day-of-week."""
    timezone: str | None = None
    every: Duration | None = None
    at: datetime | None = None
    watch: StrList | None = None
    """Globs relative to the project root."""
    debounce: Duration = 2.0
    webhook: str | None = None
    """POST /hooks/NAME with an HMAC-SHA256 signature of the body."""
    secret: str | None = None
    after: str | None = None
    on: Literal["achieved", "not_achieved", "any"] = "achieved"
    checks_first: bool = False
    jitter: Duration = 0.0
    misfire_grace: Duration = 300.0
    catch_up: bool = True
    until: datetime | None = None
    pause_after: int = Field(default=5, ge=0)
    """N runs in a row not achieved pause the entry until `runner resume`; 0 never pauses."""
    enabled: bool = True
    pass_trigger: bool = True
    """Append the trigger's context (webhook body, changed paths, upstream run) to the first prompt."""
    retry_interrupted: bool = False
    """With a PostgreSQL store: a run interrupted by a dead worker is run again, once."""
    notify: list[NotifyTarget] | None = None
    """Notification targets of this entry's runs; default the goal's."""
    budget: Budget | None = None
    """What this entry's runs may spend in one day; past it, its fires are skipped."""
    id: str = ""
    """Stable name of the entry: FILE/GOAL/TRIGGER (set by the loader)."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true.
        if isinstance(data, dict) and True in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None:
            _cron_trigger(value, timezone.utc)
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str | None) -> str | None:
        if value is not None:
            _zone(value)
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> Entry:
        given = [name for name in TRIGGERS if getattr(self, name) is not None]
        if len(given) != 1:
            found = f"found {', '.join(given)}" if given else "found none"
            raise ValueError(f"an entry needs exactly one trigger of {', '.join(TRIGGERS)} ({found})")
        if self.every is not None and self.every <= 0:
            raise ValueError("every: expected a duration above zero")
        if self.webhook is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", self.webhook):
            raise ValueError("webhook: expected a name of letters, digits, _ . or -")
        for name in ("at", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                setattr(self, name, value.astimezone())
        return self

    @property
    def kind(self) -> str:
        return next(name for name in TRIGGERS if getattr(self, name) is not None)

    def cron_trigger(self) -> Any:
        return _cron_trigger(self.cron or "", self.zone())

    def zone(self) -> Any:
        """The entry's time zone; the machine's local zone when none is given."""
        if self.timezone is None:
            return datetime.now(timezone.utc).astimezone().tzinfo
        return _zone(self.timezone)


def _cron_trigger(expression: str, zone: Any) -> Any:
    from apscheduler.triggers.cron import CronTrigger

    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"expected 5 fields (minute hour day month weekday), got {len(fields)}")
    try:
        return CronTrigger.from_crontab(expression, timezone=zone)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def _zone(name: str) -> Any:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file name
        raise ValueError(f"unknown time zone {name[:80]!r} (expected a name like Europe/Paris)") from None


def load_schedules(project: Project, goals: dict[str, Goal], goal_names: set[str] | None = None) -> list[Entry]:
    """Every entry of every schedules/*.yaml file; all problems at once, each with file:line."""
    known = goal_names if goal_names is not None else set(goals)
    entries: list[Entry] = []
    taken: dict[str, int] = {}
    """Each entry id given, and how many entries share its FILE/GOAL/TRIGGER base (ids stay linear to give)."""
    problems: list[str] = []
    for path in project.schedule_files():
        try:
            doc = read_yaml(path, project.root)
        except ConfigError as exc:
            problems += exc.problems
            continue
        if doc.data is None:
            continue
        if not isinstance(doc.data, list):
            problems.append(doc.problem((), "expected a list of entries (`- goal: NAME` with one trigger)"))
            continue
        for i, raw in enumerate(doc.data):
            try:
                entry = doc.validate(Entry, raw, prefix=(i,))
            except ConfigError as exc:
                problems += exc.problems
                continue
            problems += _references(doc, i, entry, known, project)
            entry.id = _entry_id(path.stem, entry, taken)
            entries.append(entry)
    if problems:
        raise ConfigError("invalid schedules", problems)
    return entries


def _references(doc: Document, i: int, entry: Entry, known: set[str], project: Project) -> list[str]:
    problems = []
    if entry.goal not in known:
        problems.append(doc.problem((i, "goal"), f"unknown goal {entry.goal!r} (goals: {', '.join(sorted(known))})"))
    if entry.after is not None and entry.after not in known:
        problems.append(doc.problem((i, "after"), f"unknown goal {entry.after!r}"))
    if entry.webhook is not None and not (entry.secret or project.settings.daemon.webhook.secret):
        problems.append(doc.problem((i, "webhook"), "a webhook needs `secret:` (or daemon.webhook.secret)"))
    return problems


def _entry_id(stem: str, entry: Entry, taken: dict[str, int]) -> str:
    """FILE/GOAL/TRIGGER, then FILE/GOAL/TRIGGER#2, #3... for the next entries with the same base."""
    base = f"{stem}/{entry.goal}/{entry.kind}"
    name, n = base, taken.get(base, 1)
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    taken[base] = n
    taken[name] = taken.get(name, 1)
    return name


@dataclass
class Catalog:
    """Everything a project declares: its settings (runner.yaml), the goals by name and the schedule entries."""

    project: Project
    goals: dict[str, Goal]
    entries: list[Entry]
    _by_id: dict[str, Entry] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, root: Any = None) -> Catalog:
        """Load and validate every file; all problems at once, each `file:line: field: ...`."""
        project = load_project(root)
        goals: dict[str, Goal] = {}
        problems: list[str] = []
        for path in project.goal_files():
            try:
                goal = goal_from_file(project, path)
                goals[goal.name] = goal
            except ConfigError as exc:
                problems += exc.problems
        entries: list[Entry] = []
        try:
            entries = load_schedules(project, goals, set(goals) | {p.stem for p in project.goal_files()})
        except ConfigError as exc:
            problems += exc.problems
        if problems:
            raise ConfigError("invalid configuration", problems)
        return cls(project, goals, entries)

    def entry(self, entry_id: str) -> Entry | None:
        """The entry with this id (a dict built on first use: a daemon with 10,000 entries looks one up a fire)."""
        if self._by_id is None:
            self._by_id = {entry.id: entry for entry in self.entries}
        return self._by_id.get(entry_id)
