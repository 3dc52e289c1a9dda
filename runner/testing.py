"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests and offline runs.

    with ScriptedServer([{"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]},
                         {"content": "Done."}]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        ...
        server.requests[0]["messages"]      # what the client sent, parsed

It speaks real HTTP/1.1 with keep-alive. Each response leaves in one write on a TCP_NODELAY socket
(a server that sends headers and body apart stalls ~40 ms per request on delayed ACKs), and a request
is kept as bytes and parsed only when a test reads it, so the server measures the client, not itself.

A reply is a mapping:
    content: str                    the assistant's text
    tool_calls: [{name, arguments, id?}]   arguments a mapping, or a string sent as it is (bad JSON)
    reasoning_content: str          a provider-only field the client must not send back
    finish_reason: str              default "tool_calls" when there are tool calls, else "stop"
    usage: {prompt_tokens, completion_tokens}
    status: int, error: str         answer with an HTTP error instead
    delay: seconds                  wait before answering
    drop: true                      close the connection without an answer (a reset)
    raw: JSON value or str          answer 200 with this body instead of a completion (a malformed reply)
or a callable taking the request (a dict) and returning such a mapping.

Sessions: `/v1/...` serves the server's own script; `/s/SID/v1/...` serves session SID's script
with its own cursor, so that many runs in one process replay one script each (the `script:` model).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .errors import ConfigError

Reply = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]
REPLY_FIELDS = {
    "content",
    "tool_calls",
    "reasoning_content",
    "finish_reason",
    "usage",
    "status",
    "error",
    "delay",
    "drop",
    "raw",
}


class Session:
    def __init__(self, replies: Iterable[Reply], name: str = "script") -> None:
        self.replies = list(replies)
        self.name = name
        self.cursor = 0
        self.raw_requests: list[bytes] = []

    def next_reply(self) -> Reply | None:
        if self.cursor >= len(self.replies):
            return None
        self.cursor += 1
        return self.replies[self.cursor - 1]


class ScriptedServer:
    """An OpenAI-compatible server that answers from a script; run it with `with` or start()/stop()."""

    def __init__(
        self,
        replies: Iterable[Reply] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Iterable[str] | None = None,
        api_key: str | None = None,
        latency: float = 0.0,
        record: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.models = set(models) if models is not None else None
        self.api_key = api_key
        self.latency = latency
        self.record = record
        self.sessions: dict[str, Session] = {"": Session(replies)}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._parsed: list[dict[str, Any]] = []

    # the test-facing API
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def add(self, *replies: Reply) -> None:
        self.sessions[""].replies.extend(replies)

    def session(self, replies: Iterable[Reply], name: str = "script") -> str:
        """Open a session with its own script and cursor; returns its base URL."""
        sid = uuid.uuid4().hex[:12]
        self.sessions[sid] = Session(replies, name)
        return f"http://{self.host}:{self.port}/s/{sid}/v1"

    def close_session(self, base_url: str) -> None:
        self.sessions.pop(base_url.rstrip("/").split("/")[-2], None)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The chat requests of the default session, parsed, in arrival order."""
        raw = self.sessions[""].raw_requests
        while len(self._parsed) < len(raw):
            self._parsed.append(json.loads(raw[len(self._parsed)]))
        return self._parsed

    @property
    def remaining(self) -> int:
        session = self.sessions[""]
        return len(session.replies) - session.cursor

    # lifecycle
    def start(self) -> ScriptedServer:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            server = asyncio.start_server(self._handle, self.host, self.port, backlog=1024)
            self._server = self._loop.run_until_complete(server)
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="scripted-openai-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        loop, server = self._loop, self._server

        async def shutdown() -> None:
            if server is not None:
                server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:  # a reply still waiting out its delay, a connection kept alive
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            loop.stop()

        loop.call_soon_threadsafe(lambda: loop.create_task(shutdown()))
        if self._thread is not None:
            self._thread.join(5)
        if not loop.is_running():
            loop.close()
        self._loop = None

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                status, payload = await self._answer(method, path, headers, body)
                if payload is None:
                    return  # a dropped connection: closed with no answer
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                writer.write(
                    b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, b"OK" if status == 200 else b"ERROR", len(data), data)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        sid = ""
        if path.startswith("/s/"):
            sid, _, path = path[3:].partition("/")
            path = "/" + path
        session = self.sessions.get(sid)
        if session is None:
            return 404, _error(f"no session {sid}", "not_found")
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, _error("Incorrect API key provided", "invalid_api_key")
        if path.rstrip("/") == "/v1/models":
            return 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in sorted(self.models or [])]}
        if method != "POST" or path.rstrip("/") != "/v1/chat/completions":
            return 404, _error(f"no route {method} {path}", "not_found")
        if self.record:
            session.raw_requests.append(body)
        request: dict[str, Any] | None = None
        if self.models is not None:
            request = json.loads(body)
            if request.get("model") not in self.models:
                return 404, _error(f"The model `{request.get('model')}` does not exist", "model_not_found")
        reply = session.next_reply()
        if reply is None:
            return 400, _error(
                f"{session.name} has no reply left: all {len(session.replies)} replies were used",
                "script_exhausted",
            )
        if callable(reply):
            reply = reply(request if request is not None else json.loads(body))
        delay = reply.get("delay", self.latency)
        if delay:
            await asyncio.sleep(delay)
        if reply.get("drop"):
            return 0, None
        if "status" in reply:
            return reply["status"], _error(reply.get("error", "scripted error"), "scripted")
        if "raw" in reply:
            raw = reply["raw"]
            return 200, raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else json.dumps(raw).encode()
        return 200, completion(reply, prompt_bytes=len(body))


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def completion(reply: dict[str, Any], prompt_bytes: int = 0) -> dict[str, Any]:
    """A chat.completion object for one scripted reply."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    calls = reply.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{uuid.uuid4().hex[:10]}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": call["arguments"]
                    if isinstance(call.get("arguments"), str)
                    else json.dumps(call.get("arguments") or {}),
                },
            }
            for call in calls
        ]
    if "reasoning_content" in reply:
        message["reasoning_content"] = reply["reasoning_content"]
    usage = reply.get("usage") or {}
    prompt = usage.get("prompt_tokens", prompt_bytes // 4)
    done = usage.get("completion_tokens", len(json.dumps(message)) // 4)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": reply.get("finish_reason") or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done},
    }


def load_script(path: Path, shown: str | None = None) -> list[dict[str, Any]]:
    """Read a YAML script: a list of replies. Errors name the file, the line and the field."""
    from .config.yamlfile import read_yaml

    doc = read_yaml(path)
    if shown:
        doc.shown = shown
    if not isinstance(doc.data, list) or not doc.data:
        raise ConfigError(doc.problem((), "expected a list of replies (`- content: ...` or `- tool_calls: [...]`)"))
    for i, reply in enumerate(doc.data):
        if not isinstance(reply, dict):
            raise ConfigError(doc.problem((i,), "expected a mapping with `content:` or `tool_calls:`"))
        unknown = set(reply) - REPLY_FIELDS
        if unknown:
            raise ConfigError(doc.problem((i, sorted(unknown)[0]), f"unknown field; expected {sorted(REPLY_FIELDS)}"))
        for j, call in enumerate(reply.get("tool_calls") or []):
            if not isinstance(call, dict) or "name" not in call:
                raise ConfigError(doc.problem((i, "tool_calls", j), "expected {name: TOOL, arguments: {...}}"))
    return doc.data


_shared: ScriptedServer | None = None
_shared_lock = threading.Lock()


def shared_server() -> ScriptedServer:
    """The process-wide server behind `script:` models, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ScriptedServer(record=False).start()
        return _shared


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Serve a YAML script as an OpenAI-compatible endpoint.")
    parser.add_argument("script", type=Path)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--repeat", type=int, default=1, help="serve the script this many times over")
    args = parser.parse_args()
    server = ScriptedServer(load_script(args.script) * args.repeat, port=args.port, latency=args.latency, record=False)
    server.start()
    print(server.base_url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
