"""The verify loop (middle): work, then the acceptance checks; failures go back to the model, up to N attempts."""

from __future__ import annotations

from .approval import StoreApprover, TerminalApprover, answer
from .checks import Approver, CheckResult, run_checks_alone
from .loop import RunResult, run_goal, settle_interrupted

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
