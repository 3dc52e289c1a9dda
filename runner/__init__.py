"""runner: LLM agents in three nested loops - work (ReAct), verify (acceptance checks), schedule (daemon).

The public face: what users' scripts and tests may import. Everything else may move.

    from runner import load_project, load_goal, run_goal, open_store
    project = load_project()
    result = asyncio.run(run_goal(load_goal(project, "haiku"), open_store(project)))
    print(result.outcome)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import loader

if TYPE_CHECKING:
    from .config import Catalog, Check, Entry, Goal, Project, load_goal, load_project
    from .errors import ConfigError, ProviderError, RunnerError, StoreError
    from .store import Store, open_store
    from .testing import ScriptedServer, load_script
    from .verify import RunResult, run_goal
    from .vocabulary import Event, Outcome, StopReason

# The public names load their modules when first used: `runner --help` or `runner runs` does not pay for the
# pydantic models, the model client and the loops (a second of CPU on a slow machine).
__getattr__ = loader(
    __name__,
    {
        "config": ["Catalog", "Check", "Entry", "Goal", "Project", "load_goal", "load_project"],
        "errors": ["ConfigError", "ProviderError", "RunnerError", "StoreError"],
        "store": ["Store", "open_store"],
        "testing": ["ScriptedServer", "load_script"],
        "verify": ["RunResult", "run_goal"],
        "vocabulary": ["Event", "Outcome", "StopReason"],
    },
)

__all__ = [
    "Catalog",
    "Check",
    "ConfigError",
    "Entry",
    "Event",
    "Goal",
    "Outcome",
    "Project",
    "ProviderError",
    "RunResult",
    "RunnerError",
    "ScriptedServer",
    "StopReason",
    "Store",
    "StoreError",
    "load_goal",
    "load_project",
    "load_script",
    "open_store",
    "run_goal",
]
