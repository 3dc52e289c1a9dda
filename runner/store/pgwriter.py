"""The PostgreSQL store's writer: a thread of its own that sends the statements a run records, in batches."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..errors import StoreError
from .pgconnect import first_line, psycopg_module, reconnected

TRANSCRIPT_INSERT = "INSERT INTO runner_transcripts (run_id, event) VALUES (%s, %s)"
"""A transcript row as queued for the writer, which sends a batch of them with TRANSCRIPT_COPY instead."""
TRANSCRIPT_COPY = "COPY runner_transcripts (run_id, event) FROM STDIN"
"""How the writer sends a batch's transcript rows: a quarter of the client CPU of the same rows as INSERTs."""


class Writer(threading.Thread):
    """Writes that return nothing, in order, on a connection of their own, many per round trip (a pipeline):
    the event loop that records a step never waits for the database. Every read of the store waits for the
    writes before it (`flush`), so a process always reads what it wrote.

    A busy daemon records thousands of rows a second, a few at a time: the writer lets a burst gather for
    LINGER seconds (unless a reader waits), then sends the burst's transcript rows first (append-only, read
    by run id) as one COPY, and the rest in the order they came in one pipeline, one `executemany` per run
    of identical statements.
    """

    LINGER = 0.005
    MAX_BATCH = 1000

    def __init__(self, connect: Callable[[], Any], where: str) -> None:
        super().__init__(name="runner-store-writer", daemon=True)
        self.connect, self.where = connect, where
        self.db = connect()
        self.queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self.failure: str | None = None
        self.waited = threading.Event()
        """Set while a reader waits in `flush`: the writer sends what it has without lingering."""

    def run(self) -> None:
        stop = False
        while not stop:
            batch = [self.queue.get()]
            if batch[0] is not None:
                self.waited.wait(self.LINGER)
            while len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            self._write([item for item in batch if item is not None])
            for _ in batch:
                self.queue.task_done()

    def _write(self, batch: list[tuple[str, tuple[Any, ...]]]) -> None:
        psycopg = psycopg_module()
        transcript = [args for sql, args in batch if sql == TRANSCRIPT_INSERT]
        rest = [(sql, args) for sql, args in batch if sql != TRANSCRIPT_INSERT]
        try:
            self.db = reconnected(self.db, self.connect)  # after a restart of the server
            with self.db.cursor() as cursor:
                if transcript:
                    with cursor.copy(TRANSCRIPT_COPY) as copy:
                        for row in transcript:
                            copy.write_row(row)
                if rest:
                    with self.db.pipeline():
                        for sql, group in itertools.groupby(rest, key=lambda item: item[0]):
                            cursor.executemany(sql, [args for _, args in group])
        except (psycopg.Error, StoreError) as exc:
            self.failure = f"run store {self.where}: {first_line(exc)}"

    def flush(self) -> None:
        self.waited.set()
        try:
            self.queue.join()
        finally:
            self.waited.clear()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise StoreError(failure)
