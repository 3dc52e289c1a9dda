"""The work loop (inner): the model, the tools, and the ReAct loop that joins them.

Its names load their modules when first used: the sandbox or the tools' paths alone do not load the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import loader

if TYPE_CHECKING:
    from .loop import Observer, WorkLoop, WorkResult, ignore
    from .model import Model, Reply, warm_up
    from .tools import Toolbox

__all__ = ["Model", "Observer", "Reply", "Toolbox", "WorkLoop", "WorkResult", "ignore", "warm_up"]

__getattr__ = loader(
    __name__,
    {
        "loop": ["Observer", "WorkLoop", "WorkResult", "ignore"],
        "model": ["Model", "Reply", "warm_up"],
        "tools": ["Toolbox"],
    },
)
