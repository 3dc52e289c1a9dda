"""Runs left `running` by a process that is gone: marked `interrupted`, and what they started killed.

Kept apart from the loop so that `runner runs` and the daemon's start can settle them without loading it.
"""

from __future__ import annotations

from ..store import Store


def settle_interrupted(store: Store) -> list[str]:
    """Runs whose process is gone become `interrupted`, and whatever they left running is killed (the tools'
    package, which loads asyncio, only when there is such a run: `runner runs` starts 50 ms sooner)."""
    interrupted = store.mark_interrupted()
    if interrupted:
        from ..work.tools.sandbox import kill_leftovers

        for run_id in interrupted:
            kill_leftovers(run_id)
    return interrupted
