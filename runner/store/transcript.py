"""The transcript of a run: `.runner/runs/RUN_ID/transcript.jsonl`, one line per message or event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from .base import now


class Transcript:
    """An append-only JSONL file: one line per message or event, flushed as written."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8")

    def append(self, kind: str, data: dict[str, Any]) -> None:
        self._file.write(json.dumps({"at": now(), "kind": kind, **data}, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_transcript(path: Path) -> list[dict[str, Any]]:
    """The events of a transcript file; a line that is not a JSON object (a torn last write) is skipped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
