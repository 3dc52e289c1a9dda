"""Schedule entries (`schedules/*.yaml`) and their triggers: cron, every, at, watch, webhook, after."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import Field, model_validator

from . import yamlfile
from .config import Duration, Goal, Project, Strict, StrList
from .errors import ConfigError

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
    id: str = ""
    """Stable name of the entry: FILE/GOAL/TRIGGER (set by the loader)."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true.
        if isinstance(data, dict) and True in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

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
        if self.cron is not None:
            self.cron_trigger()
        for name in ("at", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                setattr(self, name, value.astimezone())
        return self

    @property
    def kind(self) -> str:
        return next(name for name in TRIGGERS if getattr(self, name) is not None)

    def cron_trigger(self) -> Any:
        from apscheduler.triggers.cron import CronTrigger

        fields = (self.cron or "").split()
        if len(fields) != 5:
            raise ValueError(f"cron: expected 5 fields (minute hour day month weekday), got {len(fields)}")
        try:
            return CronTrigger.from_crontab(self.cron, timezone=self.zone())
        except ValueError as exc:
            raise ValueError(f"cron: {exc}") from None

    def zone(self) -> Any:
        if self.timezone is None:
            return datetime.now(timezone.utc).astimezone().tzinfo
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"timezone: unknown time zone {self.timezone!r} (expected a name like Europe/Paris)"
            ) from None


def load_schedules(project: Project, goals: dict[str, Goal], goal_names: set[str] | None = None) -> list[Entry]:
    """Every entry of every schedules/*.yaml file; all problems at once, each with file:line."""
    known = goal_names if goal_names is not None else set(goals)
    entries: list[Entry] = []
    problems: list[str] = []
    for path in project.schedule_files():
        try:
            doc = yamlfile.load(path, project.root)
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
            entry.id = _entry_id(path.stem, entry, {e.id for e in entries})
            entries.append(entry)
    if problems:
        raise ConfigError("invalid schedules", problems)
    return entries


def _references(doc: yamlfile.Document, i: int, entry: Entry, known: set[str], project: Project) -> list[str]:
    problems = []
    if entry.goal not in known:
        problems.append(doc.problem((i, "goal"), f"unknown goal {entry.goal!r} (goals: {', '.join(sorted(known))})"))
    if entry.after is not None and entry.after not in known:
        problems.append(doc.problem((i, "after"), f"unknown goal {entry.after!r}"))
    if entry.webhook is not None and not (entry.secret or project.config.daemon.webhook.secret):
        problems.append(doc.problem((i, "webhook"), "a webhook needs `secret:` (or daemon.webhook.secret)"))
    return problems


def _entry_id(stem: str, entry: Entry, taken: set[str]) -> str:
    base = f"{stem}/{entry.goal}/{entry.kind}"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}#{n}", n + 1
    return name
