"""Values the settings hold, checked without pydantic: durations and where the state lives.

The models use these as validators; `Project` reads runner.yaml's `store` through them without building
a model, so a history command (`runner runs`) does not pay pydantic's import.
"""

from __future__ import annotations

import re
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

MAX_DURATION = 3650 * 86400.0
"""Ten years: longer durations are typos (`99999999999d`) and overflow the schedulers' date arithmetic."""

DEFAULT_STORE = ".runner"
DEFAULT_STORE_TIMEOUT = 30.0
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def parse_duration(value: Any) -> float:
    """`30s`, `5m`, `2h`, `1d` or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m, 2h, 1d or a number of seconds")
    if isinstance(value, (int, float)):
        seconds = float(value) if abs(value) < 1e300 else float("inf")
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"expected a duration like 30s, 5m, 2h, 1d or a number of seconds, got {value!r}")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return _bounded(seconds, value)


def _bounded(seconds: float, value: Any) -> float:
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite duration like 30s, 5m, 2h or 1d, got {value!r}")
    if seconds < 0:
        raise ValueError("expected a duration that is not negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most 3650d (ten years), got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as a person writes them: 3600 -> `1h`, 90 -> `90s`, 5400 -> `90m`, 1.5 -> `1.5s`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def check_store(value: str) -> str:
    """runner.yaml `store:`: a folder relative to the root or a postgresql:// URL (its scheme lowercased).

    Raises ValueError naming what was expected: an unset `${VAR:-}`, a mistyped scheme or a URL without
    `//` would otherwise become an SQLite folder named after the URL, password included."""
    if not value.strip():
        raise ValueError("expected a folder relative to the project root (default .runner) or a postgresql:// URL")
    if value != value.strip():
        raise ValueError("expected no space before or after the folder or URL")
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):(//)?", value)  # two letters at least: C:\ is a folder
    if scheme and (scheme.group(1).lower() not in ("postgresql", "postgres") or not scheme.group(2)):
        raise ValueError(
            f"expected a postgresql:// URL (postgresql://user@host/database) or a folder, not {scheme.group(0)!r}..."
        )
    return value if scheme is None else scheme.group(1).lower() + value[len(scheme.group(1)) :]


def is_postgres_url(store: str) -> bool:
    return store.startswith(POSTGRES_SCHEMES)
