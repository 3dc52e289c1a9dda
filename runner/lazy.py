"""Package names that load their module when first used (PEP 562), so that a command pays only for what it uses:
`runner --help` does not load pydantic's models, `runner runs` does not load the loops."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def loader(package: str, homes: dict[str, list[str]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: each name of `homes` (module -> names) imported on first use."""
    home = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home[name]}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
