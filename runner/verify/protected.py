"""What the tamper lock protects: the project's fixed paths, a goal's `protect:`, its checks' scripts and what its
checks read, as patterns relative to the project root; and how a path is matched against them."""

from __future__ import annotations

import fnmatch

from ..config import ALWAYS_PROTECTED, Goal
from ..work.tools.paths import check_inputs, check_scripts

STATE = ".runner"
"""runner's own state changes during a run: never fingerprinted, never restored."""


def protected_patterns(goal: Goal) -> list[str]:
    """Every path the tamper lock watches, relative to the root: the project's fixed ones, `protect:`, the
    checks' scripts and (unless `verify.protect_check_inputs` is false) what the checks name as arguments."""
    return list(dict.fromkeys([*locked_patterns(goal), *input_patterns(goal)]))


def locked_patterns(goal: Goal) -> list[str]:
    return [*(p for p in ALWAYS_PROTECTED if p != STATE), *goal.protect, *check_scripts(goal)]


def input_patterns(goal: Goal) -> list[str]:
    return [p for p in check_inputs(goal) if not in_state(p)]


def in_state(rel: str) -> bool:
    return rel == STATE or rel.startswith(STATE + "/")


def literal_prefix(pattern: str) -> str:
    """The folder part of a pattern before its first wildcard: `secrets/*.key` -> `secrets`."""
    parts = pattern.removesuffix("/**").strip("/").split("/")
    literal = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        literal.append(part)
    return "/".join(literal)


def covered(path: str, patterns: list[str]) -> bool:
    """Whether `patterns` protect `path` (the same rule as the file tools' PathGuard)."""
    for pattern in patterns:
        base = pattern.rstrip("/").removesuffix("/**")
        if path == base or path.startswith(base + "/") or fnmatch.fnmatchcase(path, pattern):
            return True
    return False
