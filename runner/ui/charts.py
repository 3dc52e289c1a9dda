"""Per-goal charts drawn on the server as SVG geometry: outcomes, tokens and cost per day (no script, no CDN)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from .outcomes import GROUPS, group_of

WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 10, 22
DAYS = 30


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass
class Chart:
    """One SVG: bars, horizontal grid lines with their labels, and a few day labels."""

    title: str
    unit: str
    bars: list[Bar] = field(default_factory=list)
    grid: list[tuple[float, str]] = field(default_factory=list)
    days: list[tuple[float, str]] = field(default_factory=list)
    rows: list[tuple[str, str]] = field(default_factory=list)
    """The numbers per day, for the table under the chart (readable without the picture)."""
    empty: bool = True
    top: float = 1.0
    """The value at the top grid line."""
    width: int = WIDTH
    height: int = HEIGHT


def last_days(today: date, count: int = DAYS) -> list[str]:
    return [(today - timedelta(days=count - 1 - i)).isoformat() for i in range(count)]


def charts(totals: list[dict[str, Any]], today: date) -> list[Chart]:
    """The three charts of a goal from the store's per-day, per-outcome totals."""
    days = last_days(today)
    by_day: dict[str, dict[str, dict[str, Any]]] = {d: {} for d in days}
    for row in totals:
        if row["day"] in by_day:
            by_day[row["day"]][row["outcome"]] = row
    outcomes = _stacked(
        "Outcomes per day",
        "runs",
        days,
        [{group_of(o): r["runs"] for o, r in by_day[d].items()} for d in days],
        [{o: r["runs"] for o, r in sorted(by_day[d].items())} for d in days],
    )
    spent = [sum(r["tokens"] or 0 for r in by_day[d].values()) for d in days]
    tokens = _single("Tokens per day", "tokens", days, spent)
    costs = [[r["cost"] for r in by_day[d].values() if r.get("cost") is not None] for d in days]
    cost = _single("Cost per day", "US$", days, [sum(c) if c else 0.0 for c in costs], money=True)
    cost.empty = not any(costs)
    return [outcomes, tokens, cost]


def _stacked(
    title: str, unit: str, days: list[str], groups: list[dict[str, int]], detail: list[dict[str, int]]
) -> Chart:
    chart = _frame(title, unit, days, max((sum(g.values()) for g in groups), default=0))
    scale, slot = _scale(chart), _slot()
    for i, (day, counts) in enumerate(zip(days, groups, strict=True)):
        y = HEIGHT - BOTTOM
        said = ", ".join(f"{n} {o.replace('_', ' ')}" for o, n in detail[i].items())
        for name in GROUPS:
            n = counts.get(name, 0)
            if n:
                y -= n * scale
                chart.bars.append(Bar(LEFT + i * slot + 1, y, slot - 2, n * scale, name, f"{day}: {said}"))
        if said:
            chart.rows.append((day, said))
    return chart


def _single(title: str, unit: str, days: list[str], values: list[float], money: bool = False) -> Chart:
    chart = _frame(title, unit, days, max(values, default=0), money)
    scale, slot = _scale(chart), _slot()
    for i, (day, value) in enumerate(zip(days, values, strict=True)):
        if value:
            said = _number(value, money)
            chart.bars.append(
                Bar(
                    LEFT + i * slot + 1,
                    HEIGHT - BOTTOM - value * scale,
                    slot - 2,
                    value * scale,
                    "amount",
                    f"{day}: {said} {unit}",
                )
            )
            chart.rows.append((day, f"{said} {unit}"))
    return chart


def _frame(title: str, unit: str, days: list[str], top: float, money: bool = False) -> Chart:
    ceiling = _nice(top)
    chart = Chart(title, unit, empty=not top, top=ceiling)
    for k in range(3):
        value = ceiling * k / 2
        chart.grid.append((HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * k / 2, _number(value, money)))
    chart.days = [(LEFT + (i + 0.5) * _slot(), day[5:]) for i, day in enumerate(days) if i % 5 == 4 or i == 0]
    return chart


def _scale(chart: Chart) -> float:
    return (HEIGHT - TOP - BOTTOM) / chart.top


def _slot() -> float:
    return (WIDTH - LEFT - RIGHT) / DAYS


def _nice(value: float) -> float:
    """The smallest of 2, 4, 10 times a power of ten at or above value: its half is a round grid line too."""
    if value <= 0:
        return 2.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 4, 10) if m * power >= value and (m > 1 or power > 1))


def _number(value: float, money: bool = False) -> str:
    if money:
        return f"{value:.2f}" if value >= 0.1 or value == 0 else f"{value:.4f}"
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1_000:
        return f"{value / 1_000:.1f}k"
    return f"{value:g}"
