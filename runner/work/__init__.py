"""The work loop (inner): the model, the tools, and the ReAct loop that joins them."""

from __future__ import annotations

from .loop import Observer, WorkLoop, WorkResult, ignore
from .model import Model, Reply, warm_up
from .tools import Toolbox

__all__ = ["Model", "Observer", "Reply", "Toolbox", "WorkLoop", "WorkResult", "ignore", "warm_up"]
