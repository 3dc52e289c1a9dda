"""What triggered a run reaches it (DESIGN 10): `trigger.json` in the run's folder, named by
`RUNNER_TRIGGER_FILE` for tools and checks, and a fenced block appended to the first prompt.

A trigger's context is a JSON object: `kind` (cron, every, at, watch, webhook, after, manual, catch_up),
`entry`, `fired`, and what the kind adds (a webhook's body and chosen headers, a watch's changed paths,
an `after`'s upstream run id and outcome, who triggered by hand and their payload). The prompt says the
payload is data, not instructions; a block over `PROMPT_CAP` bytes is cut (the file keeps it whole).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import prompts
from ..store import Store

PROMPT_CAP = 8_000
"""Bytes of the context's JSON that reach the prompt."""
FILE_NAME = "trigger.json"


def write_context(store: Store, run_id: str, context: dict[str, Any], root: Path) -> Path:
    """Write trigger.json into the run's folder (beside a transcript file, else ROOT/.runner/runs/RUN_ID)."""
    location = Path(store.transcript_location(run_id))
    folder = location.parent if location.is_absolute() else root / ".runner" / "runs" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_text(json.dumps(context, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    return path


def prompt_block(context: dict[str, Any], cap: int = PROMPT_CAP) -> str:
    """The context as the model reads it: a fenced JSON block that says it is data, cut at `cap` bytes."""
    text = json.dumps(context, indent=1, ensure_ascii=False, default=str)
    cut = ""
    if len(text.encode()) > cap:
        text = text.encode()[:cap].decode("utf-8", errors="ignore") + "\n[... cut]"
        cut = prompts.TRIGGER_CUT.format(cap=cap)
    fence = "```"
    while fence in text:  # a payload cannot close the block early
        fence += "`"
    return prompts.TRIGGER.format(kind=context.get("kind", "unknown"), cut=cut, fence=fence, context=text)
