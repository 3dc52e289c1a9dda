"""When schedule entries fire: APScheduler triggers for cron, every and at, missed fires, next fires."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from ..config import Entry
from ..config.values import format_duration


def time_trigger(entry: Entry) -> Any:
    """The APScheduler trigger of a cron, every or at entry (None for event triggers)."""
    from apscheduler.triggers.date import DateTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    if entry.cron is not None:
        from .clock import OnceAWallTime

        return OnceAWallTime(entry.cron_trigger(), fixed_hour=entry.cron.split()[1] != "*")
    if entry.every is not None:
        return IntervalTrigger(seconds=entry.every, end_date=entry.until, timezone=entry.zone())
    if entry.at is not None:
        return DateTrigger(run_date=entry.at)
    return None


def missed_fire(entry: Entry, last_fire: datetime | None, now: datetime) -> datetime | None:
    """The first fire time after `last_fire` if it is already past (the daemon was down), else None."""
    if entry.at is not None:
        return entry.at if last_fire is None and entry.at <= now else None
    if last_fire is None:
        return None
    if entry.every is not None:
        fire = last_fire + timedelta(seconds=entry.every)
    else:
        fire = time_trigger(entry).get_next_fire_time(last_fire, last_fire + timedelta(microseconds=1))
    return fire if fire is not None and fire <= now else None


def describe(entry: Entry) -> str:
    if entry.cron is not None:
        return f"cron {entry.cron}" + (f" ({entry.timezone})" if entry.timezone else "")
    if entry.every is not None:
        return f"every {format_duration(entry.every)}"
    if entry.at is not None:
        return f"at {entry.at.isoformat()}"
    if entry.watch is not None:
        return f"watch {', '.join(entry.watch)}"
    if entry.webhook is not None:
        return f"webhook /hooks/{entry.webhook}"
    return f"after {entry.after} ({entry.on})"


def next_fire(entry: Entry, last_fire: str | None) -> datetime | None:
    """When a time entry fires next, as far as the store knows (None for event triggers)."""
    now = datetime.now(timezone.utc)
    if entry.every is not None:
        last = datetime.fromisoformat(last_fire) if last_fire else now
        return max(last + timedelta(seconds=entry.every), now)
    if entry.at is not None:
        return entry.at if entry.at > now and not last_fire else None
    if entry.cron is not None:
        return time_trigger(entry).get_next_fire_time(None, now)
    return None
