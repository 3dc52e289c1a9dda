"""The work loop (inner): the model, the tools, and the ReAct loop that joins them.

Its names load their modules when first used: the sandbox or the tools' paths alone do not load the loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Observer, WorkLoop, WorkResult, ignore
    from .model import Model, Reply, warm_up
    from .tools import Toolbox

_HOMES = {
    "loop": ["Observer", "WorkLoop", "WorkResult", "ignore"],
    "model": ["Model", "Reply", "warm_up"],
    "tools": ["Toolbox"],
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["Model", "Observer", "Reply", "Toolbox", "WorkLoop", "WorkResult", "ignore", "warm_up"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
