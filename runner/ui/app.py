"""The dashboard's ASGI app (Starlette): the pages, the live stream of a run and the actions.

Every page is rendered on the server from the store and the project's files; the only script is
static/live.js, which swaps in a running run's page as the server sends it (server-sent events).
Store calls are short indexed queries made where the request is handled; each thread opens its own
store (a SQLite connection serves only the thread that opened it).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..config import Project
from ..errors import ConfigError, RunnerError, UnknownRun
from ..store import Store, open_store
from ..verify.approval import answer
from .outcomes import CHOICES, LIVE, group_of, label, symbol
from .pages import PAGE_SIZE, Catalogs, RunFilter, goal_charts, goal_rows, read, runs_page
from .security import CSRF_COOKIE, Guard, Masker, is_loopback, new_csrf, origin_ok, same

HERE = Path(__file__).parent
NOTE_COOKIE = "runner_note"
LIVE_POLL = 0.25
"""Seconds between two looks at a running run's transcript and row."""


def create_app(project: Project, token: str | None = None, host: str = "127.0.0.1") -> Any:
    """The dashboard for one project, guarded for the address it will be served on."""
    board = Dashboard(project, token)
    routes = [
        Route("/", board.goals),
        Route("/goals/{goal}/trigger", board.trigger, methods=["POST"]),
        Route("/goals/{goal}/charts", board.charts),
        Route("/entries/{name:path}/pause", partial(board.pause, paused=True), methods=["POST"]),
        Route("/entries/{name:path}/resume", partial(board.pause, paused=False), methods=["POST"]),
        Route("/runs", board.runs),
        Route("/runs/{run_id}", board.run),
        Route("/runs/{run_id}/live", board.live),
        Route("/runs/{run_id}/transcript.jsonl", board.raw),
        Route("/runs/{run_id}/{decision:str}", board.decide, methods=["POST"]),
        Route("/approvals", board.approvals),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: board.error, RunnerError: board.error})
    return Guard(app, token, is_loopback(host))


class Dashboard:
    """The handlers of one project's dashboard, with its store, its catalog of goals and its templates."""

    def __init__(self, project: Project, token: str | None) -> None:
        self.project = project
        self._local = threading.local()
        self.catalogs = Catalogs(project)
        self.mask = Masker([token, project.settings.daemon.webhook.secret])
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True),
            auto_reload=False,
            finalize=self.mask.shown,
        )
        self.templates.globals.update(symbol=symbol, label=label, group=group_of)
        self.templates.filters.update(when=_when, number=_number, money=_money, duration=_duration)

    @property
    def store(self) -> Store:
        """This thread's store (a SQLite connection serves only the thread that opened it)."""
        if getattr(self._local, "store", None) is None:
            self._local.store = open_store(self.project)
        return self._local.store

    # pages
    async def goals(self, request: Request) -> Response:
        catalog, problems = self.catalogs.get()
        rows = goal_rows(catalog, self.store) if catalog else []
        return self.render(request, "goals.html", rows=rows, problems=problems)

    async def runs(self, request: Request) -> Response:
        chosen = RunFilter.of(request.query_params)
        rows, total = runs_page(self.store, chosen)
        catalog, _ = self.catalogs.get()
        names = sorted(catalog.goals) if catalog else []
        last = max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1)
        return self.render(
            request,
            "runs.html",
            rows=rows,
            total=total,
            chosen=chosen,
            last=last,
            goals=names,
            outcomes=CHOICES,
        )

    async def run(self, request: Request) -> Response:
        return self.render(request, "run.html", **self._run_context(request.path_params["run_id"]))

    async def approvals(self, request: Request) -> Response:
        rows = self.store.find_runs(outcome="awaiting_approval", limit=200)
        return self.render(request, "approvals.html", rows=rows)

    async def charts(self, request: Request) -> Response:
        goal = request.path_params["goal"]
        return self.render(request, "charts.html", goal=goal, charts=goal_charts(self.store, goal))

    async def raw(self, request: Request) -> Response:
        run = self.store.run(request.path_params["run_id"])
        events = self.store.transcript_events(run["id"])
        return PlainTextResponse(self.mask("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events)))

    async def live(self, request: Request) -> Response:
        """Server-sent events: the run's page body each time it changes, then `end` once the run is over."""
        run_id = self.store.run(request.path_params["run_id"])["id"]
        csrf = request.cookies.get(CSRF_COOKIE, "")
        return StreamingResponse(
            self._follow(run_id, csrf), media_type="text/event-stream", headers={"cache-control": "no-store"}
        )

    async def _follow(self, run_id: str, csrf: str) -> AsyncIterator[str]:
        seen: tuple[Any, ...] = ()
        while True:
            started = time.perf_counter()
            run = self.store.run(run_id)
            stamp = (self._transcript_stamp(run_id), run["outcome"], run["ended"], len(run["checks"]))
            if stamp != seen:
                seen = stamp
                context = self._run_context(run_id, run)
                body = self.templates.get_template("run_body.html").render(**context, csrf=csrf)
                yield _event("run", body)
            if run["outcome"] not in LIVE:
                yield _event("end", run["outcome"])
                return
            # a long transcript costs more to render: wait longer, so one reader never takes more than ~1/5 of a core
            await asyncio.sleep(max(LIVE_POLL, 4 * (time.perf_counter() - started)))

    def _transcript_stamp(self, run_id: str) -> Any:
        """What changes when the transcript grows: a file's size where the store keeps files, else its events."""
        location = Path(self.store.transcript_location(run_id))
        try:
            return location.stat().st_size
        except OSError:
            return len(self.store.transcript_events(run_id))

    def _run_context(self, run_id: str, run: dict[str, Any] | None = None) -> dict[str, Any]:
        run = run or self.store.run(run_id)
        events = self.store.transcript_events(run["id"])
        reading = read(run, events)
        return {"run": run, "reading": reading, "live": run["outcome"] in LIVE}

    # actions
    async def trigger(self, request: Request) -> Response:
        await self.checked_form(request)
        goal = request.path_params["goal"]
        catalog, problems = self.catalogs.get()
        if catalog is None or goal not in catalog.goals:
            raise HTTPException(404, problems[0] if problems else f"no goal named {goal!r}")
        self.store.send_command("trigger", goal)
        from ..schedule.daemon import daemon_pid

        pid = daemon_pid(self.project)
        if pid:
            return self.back(request, "/", f"triggered {goal}: the daemon (pid {pid}) runs it as soon as it is free")
        return self.back(request, "/", f"queued {goal}: no daemon is running here now; it runs when one starts")

    async def pause(self, request: Request, paused: bool) -> Response:
        """Like `runner pause` / `runner resume`: every entry of a goal, or one entry by id."""
        await self.checked_form(request)
        name, action = request.path_params["name"], "pause" if paused else "resume"
        catalog, problems = self.catalogs.get()
        entries = [e for e in (catalog.entries if catalog else []) if name in (e.goal, e.id)]
        if not entries:
            raise HTTPException(404, problems[0] if problems else f"no schedule entry for {name!r}")
        for entry in entries:
            self.store.update_entry(entry.id, paused=int(paused), failures=0)
            self.store.log_event(f"{action}d", entry.goal, entry.id, "from the dashboard")
        return self.back(request, "/", f"{action}d {', '.join(e.id for e in entries)}")

    async def decide(self, request: Request) -> Response:
        form = await self.checked_form(request)
        decision = request.path_params["decision"]
        if decision not in ("approve", "reject"):
            raise HTTPException(404, f"no action {decision!r}")
        run_id = self.store.run(request.path_params["run_id"])["id"]
        reason = str(form.get("reason") or "").strip() or None
        if decision == "reject" and not reason:
            raise HTTPException(400, "a rejection needs a reason (it goes back into the run's record)")
        said = await answer(self.project, run_id, decision, reason or "approved from the dashboard")
        return self.back(request, f"/runs/{run_id}", said)

    async def checked_form(self, request: Request) -> Any:
        form = await request.form()
        if not origin_ok(request.headers) or not same(str(form.get("csrf") or ""), request.cookies.get(CSRF_COOKIE)):
            raise HTTPException(403, "refused: the form's CSRF token is missing or stale; reload the page and retry")
        return form

    # responses
    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        note = unquote(request.cookies.get(NOTE_COOKIE, "")) or None
        html = self.templates.get_template(name).render(request=request, csrf=csrf, note=note, **context)
        response = HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})
        if request.cookies.get(CSRF_COOKIE) != csrf:
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        if note:
            response.delete_cookie(NOTE_COOKIE)
        return response

    def back(self, request: Request, to: str, note: str) -> Response:
        response = RedirectResponse(to, status_code=303)
        response.set_cookie(NOTE_COOKIE, quote(note), httponly=True, samesite="strict", max_age=60)
        return response

    async def error(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status, message = exc.status_code, exc.detail
        else:
            status = 404 if isinstance(exc, UnknownRun) else 409 if isinstance(exc, ConfigError) else 500
            message = str(exc)
        return self.render(request, "error.html", status=status, message=message, code=status)


def _event(name: str, data: str) -> str:
    return f"event: {name}\n" + "".join(f"data: {line}\n" for line in data.splitlines() or [""]) + "\n"


def _when(stamp: str | None) -> str:
    return stamp[:19].replace("T", " ") if stamp else "-"


def _duration(run: dict[str, Any]) -> str:
    if not run.get("started") or not run.get("ended"):
        return "-"
    seconds = (datetime.fromisoformat(run["ended"]) - datetime.fromisoformat(run["started"])).total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:,}"


def _money(value: Any) -> str:
    return "-" if value is None else f"${value:.4f}" if value < 0.1 else f"${value:.2f}"
