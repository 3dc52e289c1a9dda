"""The OpenAI-compatible model: one chat call with tools, retries of transient failures, usage.

It uses the official `openai` client's request API (`client.post`), which keeps the client's auth,
base URL, retries with backoff (429, 5xx, timeouts, connection resets) and error types, but skips
`chat.completions.create`'s parameter transform, which walks the whole conversation on every call.
Each message is encoded to JSON once and reused in every later request of the conversation.

Secrets: the key's variable is never passed to tools or checks, and its value is blanked in the process's
initial environment block (what /proc/PID/environ shows to other processes);
a password in `base_url` and the key are scrubbed from every message this module raises. A reply that
is not a well-formed chat completion is a ProviderError, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ..config import ModelConfig
from ..errors import ConfigError, ProviderError
from .tools.process import HIDDEN_NAMES

MAX_USAGE = 10**12
"""A usage count above this is not believed (a malformed reply), so that limits still hold."""
SURROGATE = re.compile("[\ud800-\udfff]")
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass
class Reply:
    """One assistant turn: the message to append (protocol fields only), why it ended, and its usage."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, int] = field(default_factory=dict)

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def tokens(self) -> int:
        return int(self.usage.get("total_tokens") or 0)


class Model:
    """A chat-completions endpoint. Build it with `Model.open(config, root)`; close it with `aclose()`."""

    def __init__(self, config: ModelConfig, base_url: str | None, api_key: str, *, secret: bool = True) -> None:
        import openai

        self.config = config
        self._secrets = [s for s in (api_key if secret else None, *_url_secrets(base_url)) if s and len(s) >= 4]
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=config.max_retries,
            timeout=config.request_timeout,
            http_client=_http_client(),
        )
        if _platform is not None:  # else the client learns it at its first request, in a thread of its own
            self.client._platform = _platform
        self._encoded: dict[int, tuple[dict[str, Any], bytes]] = {}
        self._script_url: str | None = None

    @classmethod
    def open(cls, config: ModelConfig, root: Path) -> Model:
        """Resolve the endpoint and key; a `script:PATH` model is served by runner.testing on 127.0.0.1."""
        if config.name.startswith("script:"):
            from .. import testing

            path = (root / config.name.removeprefix("script:")).resolve()
            if not path.is_file():
                raise ConfigError(f"model: script:{path} does not exist (expected a YAML list of replies)")
            server = testing.shared_server()
            url = server.session(testing.load_script(path), name=f"script {config.name.removeprefix('script:')}")
            model = cls(config.model_copy(update={"max_retries": 0}), url, "script", secret=False)
            model._script_url = url
            return model
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL")
        refused = refused_on_this_machine(base_url)
        if refused:
            raise ProviderError(f"model {config.name}: {refused}")
        if not config.api_key_env:
            return cls(config, base_url, "none", secret=False)
        key = take_key(config.api_key_env)
        if not key:
            raise ProviderError(
                f"model {config.name}: no API key: the environment variable {config.api_key_env} is not set "
                "(set it, put it in .env at the project root, or give `api_key_env: null` for an endpoint "
                "that needs no key)"
            )
        return cls(config, base_url, key)

    @property
    def url(self) -> str:
        """The endpoint as people may see it: a password in it replaced by ***."""
        return redact_url(str(self.client.base_url))

    async def aclose(self) -> None:
        await self.client.close()
        if self._script_url:
            from .. import testing

            testing.shared_server().close_session(self._script_url)

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **extra: Any
    ) -> Reply:
        """One completion. Raises ProviderError with a clear message once the client's retries are spent."""
        try:
            raw = await self._post(self._body(messages, tools, extra))
            return _reply(raw)
        except ProviderError as exc:
            raise ProviderError(f"model {self.config.name}: {self._scrub(str(exc))}") from None

    async def _post(self, body: bytes) -> bytes:
        import openai

        try:
            return await self.client.post("/chat/completions", cast_to=bytes, content=body)
        except openai.AuthenticationError as exc:
            raise ProviderError(f"the provider refused the API key: {_detail(exc)}") from None
        except openai.NotFoundError as exc:
            raise ProviderError(f"not found at {self.url}: {_detail(exc)}") from None
        except openai.APITimeoutError:
            raise ProviderError(
                f"no answer from {self.url} within {self.config.request_timeout:g}s "
                f"after {self.config.max_retries} retries"
            ) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ProviderError(
                f"cannot connect to {self.url} ({cause}) after {self.config.max_retries} retries"
            ) from None
        except openai.APIStatusError as exc:
            raise ProviderError(f"the provider answered {exc.status_code}: {_detail(exc)}") from None

    def _scrub(self, text: str) -> str:
        """`text` without the key or a password of the endpoint, and without lone surrogates."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return clean(text)

    def _body(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, extra: dict[str, Any]) -> bytes:
        head: dict[str, Any] = {"model": self.config.name}
        if self.config.temperature is not None:
            head["temperature"] = self.config.temperature
        if tools:
            head["tools"] = tools
        head.update(self.config.extra_body)
        head.update(extra)
        encoded = b",".join(self._encode(m) for m in messages)
        return json.dumps(head).encode()[:-1] + b', "messages": [' + encoded + b"]}"

    def _encode(self, message: dict[str, Any]) -> bytes:
        cached = self._encoded.get(id(message))
        if cached is not None and cached[0] is message:
            return cached[1]
        data = json.dumps(message, ensure_ascii=False).encode()
        self._encoded[id(message)] = (message, data)
        return data


_ssl_context: Any = None
_platform: Any = None
"""The platform the client names in its headers, learnt once by `warm_up` (None: each client learns it)."""


def warm_up() -> None:
    """Load what the first run of a daemon would otherwise load while the runs beside it wait: the client,
    the shared TLS context and the tools' argument validator (together over a second of CPU); and learn the
    platform the client names in its headers, which each new client would otherwise learn at its first
    request in a thread of its own (a thread hop per run, 5% of a daemon's CPU while it starts 100 runs)."""
    global _platform
    import anyio._backends._asyncio  # noqa: F401  (what the client's first request under asyncio loads)
    import jsonschema  # noqa: F401
    import openai  # noqa: F401

    _tls()
    try:
        from openai._base_client import get_platform
    except ImportError:  # a release without it: each client learns the platform itself, as before
        return
    _platform = get_platform()


def _tls() -> Any:
    global _ssl_context
    import httpx2

    if _ssl_context is None:
        _ssl_context = httpx2.create_ssl_context()
    return _ssl_context


def _http_client() -> Any:
    """An HTTP client for one Model, sharing one TLS context with every other.

    Loading the CA bundle costs ~40 ms of CPU; a daemon starting 200 goals at once would spend 8 s
    on it. One connection pool per model keeps the pool small (httpcore scans every connection of a
    pool on every request, which is quadratic when 200 runs share one).
    """
    import openai

    return openai.DefaultAsyncHttpxClient(verify=_tls())


class Malformed(ProviderError):
    """A reply that is not a well-formed chat completion."""


def _reply(raw: bytes) -> Reply:
    """The Reply of a raw chat completion; Malformed (a ProviderError) saying what is wrong with it."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise Malformed("the provider's answer is not a chat completion (not JSON)") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Malformed("the provider's answer is not a chat completion (no choices)")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise Malformed(f"malformed reply: `message` is {_kind(message)}, expected an object")
    finish = choice.get("finish_reason")
    return Reply(_protocol_message(message), clean(finish) if isinstance(finish, str) else None, _usage(data))


def _protocol_message(message: dict[str, Any]) -> dict[str, Any]:
    """Keep what the protocol needs sent back; drop provider-only fields such as reasoning_content."""
    out: dict[str, Any] = {"role": "assistant", "content": _content(message.get("content"))}
    calls = message.get("tool_calls")
    if calls is None or calls == []:
        return out
    if not isinstance(calls, list):
        raise Malformed(f"malformed reply: `tool_calls` is {_kind(calls)}, expected a list")
    out["tool_calls"] = [_tool_call(i, call) for i, call in enumerate(calls)]
    return out


def _content(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return clean(content) if content else content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return clean("".join(p["text"] for p in content))  # content parts, as some providers send them
    raise Malformed(f"malformed reply: `content` is {_kind(content)}, expected a string or null")


def _tool_call(i: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise Malformed(f"malformed reply: tool call {i} is {_kind(call)}, expected an object with `function`")
    name, arguments, call_id = function.get("name"), function.get("arguments"), call.get("id")
    if not isinstance(name, str) or not name:
        raise Malformed(f"malformed reply: tool call {i} has no function name")
    if arguments is not None and not isinstance(arguments, str):
        raise Malformed(
            f"malformed reply: the arguments of tool call {i} ({clean(name)}) are {_kind(arguments)}, "
            "expected a JSON string"
        )
    if call_id is not None and not isinstance(call_id, str):
        raise Malformed(f"malformed reply: the id of tool call {i} is {_kind(call_id)}, expected a string")
    return {
        "id": clean(call_id) if call_id else f"call_{i}",
        "type": "function",
        "function": {"name": clean(name), "arguments": _clean_json(clean(arguments or ""))},
    }


def _clean_json(text: str) -> str:
    """JSON text whose escapes decode to lone surrogates, re-encoded with U+FFFD in their place."""
    if not SURROGATE_ESCAPE.search(text):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text  # the model reads the JSON error
    return json.dumps(_clean_value(value), ensure_ascii=False)


def _clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, list):
        return [_clean_value(v) for v in value]
    if isinstance(value, dict):
        return {clean(k): _clean_value(v) for k, v in value.items()}
    return value


def _usage(data: dict[str, Any]) -> dict[str, int]:
    usage = data.get("usage")
    if usage is None:
        return {}
    if not isinstance(usage, dict):
        raise Malformed(f"malformed reply: `usage` is {_kind(usage)}, expected an object")
    counts: dict[str, int] = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(name)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_USAGE:
            raise Malformed(f"malformed reply: usage.{name} is {_kind(value)}, expected a whole number of tokens")
        counts[name] = value
    if "total_tokens" not in counts and counts:
        counts["total_tokens"] = counts.get("prompt_tokens", 0) + counts.get("completion_tokens", 0)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool) and 0 <= cached <= MAX_USAGE:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}  # type: ignore[assignment]
    return counts


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, int, float)):
        return f"{type(value).__name__} {str(value)[:20]}"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def clean(text: str) -> str:
    """Text that can be encoded as UTF-8: lone surrogates (valid in JSON, not in UTF-8) become U+FFFD."""
    return SURROGATE.sub("\ufffd", text)


def take_key(name: str) -> str | None:
    """The key in variable `name`, from now on never passed to a process runner starts, and blanked in the
    process's initial environment block, which other processes read as /proc/PID/environ."""
    HIDDEN_NAMES.add(name)
    _blank_initial(name)
    return os.environ.get(name)


def _blank_initial(name: str) -> None:
    """Overwrite the value of `name` where the initial environment block (the process's stack) holds it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(libc, "environ")
        prefix = name.encode() + b"="
        i = 0
        while environ[i]:
            entry = ctypes.string_at(environ[i])
            if entry.startswith(prefix) and len(entry) > len(prefix):
                ctypes.memset(environ[i] + len(prefix), 0, len(entry) - len(prefix))
            i += 1
    except (OSError, ValueError, AttributeError):
        pass


LOOPBACK = ("127.0.0.1", "localhost", "::1")


LISTENING_FOR = 5.0
"""Seconds a loopback endpoint found listening is not asked again (a burst of runs probes it once)."""
_listening: dict[tuple[str, int], float] = {}


def refused_on_this_machine(base_url: str | None) -> str | None:
    """Why a loopback endpoint cannot be reached, if it refuses connections: nothing listens, so retrying
    with backoff only delays the same answer (a remote endpoint keeps its retries). One that answered in
    the last LISTENING_FOR seconds is taken to listen still."""
    import socket

    parts = urlsplit(base_url or "")
    if parts.hostname not in LOOPBACK:
        return None
    try:
        where = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        if time.monotonic() - _listening.get(where, -LISTENING_FOR) < LISTENING_FOR:
            return None
        socket.create_connection(where, timeout=1).close()
    except ConnectionRefusedError:
        url = redact_url(base_url or "")
        return f"cannot connect to {url}: nothing listens there (connection refused; 0 retries: it is this machine)"
    except (OSError, ValueError):
        return None
    _listening[where] = time.monotonic()
    return None


def redact_url(url: str) -> str:
    """`url` with the password of its userinfo replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _url_secrets(url: str | None) -> list[str]:
    try:
        password = urlsplit(url or "").password
    except ValueError:
        return []
    return [password, unquote(password)] if password else []


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(getattr(exc, "message", exc))
