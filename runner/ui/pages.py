"""What each page shows, read from the project's files and its store (through the store's public methods)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any

from ..config import Catalog, Project
from ..errors import ConfigError
from ..schedule.triggers import describe, next_fire
from ..store import Store
from .charts import DAYS, Chart, charts
from .reading import Reading, read_run

PAGE_SIZE = 50
STRIP = 30


@dataclass
class EntryRow:
    id: str
    trigger: str
    next_fire: str | None
    paused: bool
    enabled: bool
    budget: str | None = None


@dataclass
class GoalRow:
    name: str
    entries: list[EntryRow] = field(default_factory=list)
    strip: list[dict[str, Any]] = field(default_factory=list)
    """The last runs, oldest first."""
    tokens_today: int = 0
    cost_today: float | None = None
    budget: str | None = None


class Catalogs:
    """Every goal and entry of the project, loaded again only when one of its files changes (parsing costs ~30 ms
    a goal); or the problems that keep the files from loading (the pages still show the runs)."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.stamp: tuple[Any, ...] | None = None
        self.loaded: tuple[Catalog | None, list[str]] = (None, [])

    def get(self) -> tuple[Catalog | None, list[str]]:
        stamp = self._stamp()
        if stamp != self.stamp:
            try:
                self.loaded = Catalog.load(self.project.root), []
            except ConfigError as exc:
                self.loaded = None, exc.problems
            self.stamp = stamp
        return self.loaded

    def _stamp(self) -> tuple[Any, ...]:
        root = self.project.root
        paths = [root / "runner.yaml", root / ".env", *self.project.goal_files(), *self.project.schedule_files()]
        stamps = []
        for path in paths:
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            stamps.append((str(path), info.st_mtime_ns, info.st_size))
        return tuple(stamps)


def goal_rows(catalog: Catalog, store: Store) -> list[GoalRow]:
    today = utc_today().isoformat()
    spent: dict[str, list[dict[str, Any]]] = {}
    for row in store.daily_totals(None, today):
        spent.setdefault(row["goal"], []).append(row)
    rows = []
    for name in sorted(catalog.goals):
        row = GoalRow(name, budget=_budget(catalog.goals[name]))
        for entry in (e for e in catalog.entries if e.goal == name):
            state = store.entry(entry.id)
            paused = bool(state.get("paused"))
            fire = next_fire(entry, state.get("last_fire")) if entry.enabled and not paused else None
            row.entries.append(EntryRow(entry.id, describe(entry), _when(fire), paused, entry.enabled, _budget(entry)))
        row.strip = list(reversed(store.find_runs(goal=name, limit=STRIP)))
        today_rows = spent.get(name, [])
        row.tokens_today = sum(r["tokens"] or 0 for r in today_rows)
        costs = [r["cost"] for r in today_rows if r.get("cost") is not None]
        row.cost_today = sum(costs) if costs else None
        rows.append(row)
    return rows


def _budget(owner: Any) -> str | None:
    """The daily budget a goal or an entry declares, if any."""
    budget = getattr(owner, "budget", None)
    if budget is None:
        return None
    parts = []
    if getattr(budget, "tokens_per_day", None):
        parts.append(f"{budget.tokens_per_day:,} tokens")
    if getattr(budget, "cost_per_day", None):
        parts.append(f"${budget.cost_per_day:g}")
    return " · ".join(parts) + " a day" if parts else None


@dataclass
class RunFilter:
    goal: str | None = None
    outcome: str | None = None
    since: str | None = None
    until: str | None = None
    page: int = 1

    @classmethod
    def of(cls, query: Any) -> RunFilter:
        """From the query string; anything malformed is dropped rather than refused."""
        page = query.get("page", "1")
        return cls(
            goal=query.get("goal") or None,
            outcome=query.get("outcome") or None,
            since=_day(query.get("since")),
            until=_day(query.get("until")),
            page=max(int(page), 1) if page.isdigit() else 1,
        )

    def store_args(self) -> dict[str, Any]:
        until = (date.fromisoformat(self.until) + timedelta(days=1)).isoformat() if self.until else None
        return {"goal": self.goal, "outcome": self.outcome, "since": self.since, "until": until}

    def query(self, **change: Any) -> str:
        """This filter as a query string, with some fields changed (the pager's links)."""
        from urllib.parse import urlencode

        fields = {**self.__dict__, **change}
        return urlencode({k: v for k, v in fields.items() if v and not (k == "page" and v == 1)})


def runs_page(store: Store, chosen: RunFilter) -> tuple[list[dict[str, Any]], int]:
    args = chosen.store_args()
    total = store.count_runs(**args)
    rows = store.find_runs(**args, limit=PAGE_SIZE, offset=(chosen.page - 1) * PAGE_SIZE)
    return rows, total


def read(run: dict[str, Any], events: list[dict[str, Any]]) -> Reading:
    return read_run(events, run.get("checks", []))


def goal_charts(store: Store, goal: str) -> list[Chart]:
    today = utc_today()
    since = (today - timedelta(days=DAYS - 1)).isoformat()
    return charts(store.daily_totals(goal, since), today)


def utc_today() -> date:
    return datetime.now(timezone.utc).date()


def _day(value: str | None) -> str | None:
    try:
        return date.fromisoformat(value).isoformat() if value else None
    except ValueError:
        return None


def _when(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if moment else None
