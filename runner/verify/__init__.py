"""The verify loop (middle): work, then the acceptance checks; failures go back to the model, up to N attempts.

Its names load their modules when first used: `runner runs` settles dead runs without loading the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import loader

if TYPE_CHECKING:
    from .approval import StoreApprover, TerminalApprover, answer
    from .checks import Approver, CheckResult, run_checks_alone
    from .loop import RunResult, run_goal
    from .settle import settle_interrupted

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

__getattr__ = loader(
    __name__,
    {
        "approval": ["StoreApprover", "TerminalApprover", "answer"],
        "checks": ["Approver", "CheckResult", "run_checks_alone"],
        "loop": ["RunResult", "run_goal"],
        "settle": ["settle_interrupted"],
    },
)
