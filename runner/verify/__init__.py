"""The verify loop (middle): work, then the acceptance checks; failures go back to the model, up to N attempts.

Its names load their modules when first used: `runner runs` settles dead runs without loading the loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .approval import StoreApprover, TerminalApprover, answer
    from .checks import Approver, CheckResult, run_checks_alone
    from .loop import RunResult, run_goal
    from .settle import settle_interrupted

_HOMES = {
    "approval": ["StoreApprover", "TerminalApprover", "answer"],
    "checks": ["Approver", "CheckResult", "run_checks_alone"],
    "loop": ["RunResult", "run_goal"],
    "settle": ["settle_interrupted"],
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Approver",
    "CheckResult",
    "RunResult",
    "StoreApprover",
    "TerminalApprover",
    "answer",
    "run_checks_alone",
    "run_goal",
    "settle_interrupted",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
