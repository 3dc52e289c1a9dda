"""The store: an interface (`Store`) and its implementations; `open_store` picks one from runner.yaml."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import RUN_FIELDS, Store, TranscriptWriter, now, pid_alive
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from ..config import Project

__all__ = ["RUN_FIELDS", "SqliteStore", "Store", "TranscriptWriter", "now", "open_store", "pid_alive"]


def open_store(project: Project) -> Store:
    """The project's store: `store:` in runner.yaml, default `.runner/runs.db`."""
    if project.settings.store.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStore

        return PostgresStore(project.settings.store)
    return SqliteStore(project.state, timeout=project.settings.daemon.store_timeout)
