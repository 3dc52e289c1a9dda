"""Time triggers with guarantees APScheduler's own lack (imported only where jobs are scheduled)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apscheduler.triggers.base import BaseTrigger


class OnceAWallTime(BaseTrigger):
    """A cron trigger that runs a fixed-time job once on the day clocks fall back.

    APScheduler's CronTrigger fires `30 2 * * *` twice when 02:30 happens twice; like cron, a job
    with a fixed hour runs once, while a job on every hour (`*/30 * * * *`) runs in both hours. On
    the day clocks spring forward the missing 02:30 runs at 03:30, never skipped.
    """

    def __init__(self, inner: Any, fixed_hour: bool) -> None:
        self.inner = inner
        self.fixed_hour = fixed_hour

    def get_next_fire_time(self, previous: datetime | None, now: datetime) -> datetime | None:
        fire = self.inner.get_next_fire_time(previous, now)
        if self.fixed_hour and previous is not None and fire is not None and _repeated_wall_time(previous, fire):
            fire = self.inner.get_next_fire_time(fire, fire)
        return fire

    def __str__(self) -> str:
        return str(self.inner)


def _repeated_wall_time(previous: datetime, fire: datetime) -> bool:
    """The same local clock reading at another instant: the hour that repeats when clocks fall back."""
    return fire.replace(tzinfo=None) == previous.replace(tzinfo=None) and fire.timestamp() != previous.timestamp()
