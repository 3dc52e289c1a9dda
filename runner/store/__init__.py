"""The store: an interface (`Store`) and its implementations; `open_store` picks one from runner.yaml."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import StoreError
from .base import RUN_FIELDS, Store, TranscriptWriter, now, pid_alive
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from ..config import Project
    from .postgres import PostgresStore

__all__ = [
    "RUN_FIELDS",
    "SqliteStore",
    "Store",
    "TranscriptWriter",
    "now",
    "open_postgres",
    "open_store",
    "pid_alive",
]


def open_store(project: Project) -> Store:
    """The project's store: `store:` in runner.yaml, default `.runner/runs.db`."""
    if project.on_postgres:
        return open_postgres(project)
    return SqliteStore(project.state, timeout=project.store_timeout)


def open_postgres(project: Project, check_schema: bool = True) -> PostgresStore:
    """The project's PostgreSQL store; a server out of reach or a schema behind is named as runner.yaml's `store`."""
    from .postgres import PostgresStore

    try:
        return PostgresStore(project.store, check_schema=check_schema)
    except StoreError as exc:
        raise StoreError(f"{project.root / 'runner.yaml'}: store: {exc}") from None
