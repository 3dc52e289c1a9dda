"""The OpenAI-compatible model: one chat call with tools, retries of transient failures, usage.

It uses the official `openai` client's request API (`client.post`), which keeps the client's auth,
base URL, retries with backoff (429, 5xx, timeouts, connection resets) and error types, but skips
`chat.completions.create`'s parameter transform, which walks the whole conversation on every call.
Each message is encoded to JSON once and reused in every later request of the conversation.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..errors import ConfigError, ProviderError


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

    def __init__(self, config: ModelConfig, base_url: str | None, api_key: str) -> None:
        import openai

        self.config = config
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=config.max_retries,
            timeout=config.request_timeout,
            http_client=_http_client(),
        )
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
            model = cls(config.model_copy(update={"max_retries": 0}), url, "script")
            model._script_url = url
            return model
        base_url = config.base_url or os.environ.get("OPENAI_BASE_URL")
        if not config.api_key_env:
            return cls(config, base_url, "none")
        key = os.environ.get(config.api_key_env)
        if not key:
            raise ProviderError(
                f"model {config.name}: no API key: the environment variable {config.api_key_env} is not set "
                "(set it, put it in .env at the project root, or give `api_key_env: null` for an endpoint "
                "that needs no key)"
            )
        return cls(config, base_url, key)

    async def aclose(self) -> None:
        await self.client.close()
        if self._script_url:
            from .. import testing

            testing.shared_server().close_session(self._script_url)

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **extra: Any
    ) -> Reply:
        """One completion. Raises ProviderError with a clear message once the client's retries are spent."""
        import openai

        try:
            raw = await self.client.post("/chat/completions", cast_to=bytes, content=self._body(messages, tools, extra))
        except openai.AuthenticationError as exc:
            raise ProviderError(f"model {self.config.name}: the provider refused the API key: {_detail(exc)}") from None
        except openai.NotFoundError as exc:
            raise ProviderError(
                f"model {self.config.name}: not found at {self.client.base_url}: {_detail(exc)}"
            ) from None
        except openai.APITimeoutError:
            raise ProviderError(
                f"model {self.config.name}: no answer from {self.client.base_url} within "
                f"{self.config.request_timeout:g}s after {self.config.max_retries} retries"
            ) from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ProviderError(
                f"model {self.config.name}: cannot connect to {self.client.base_url} ({cause}) "
                f"after {self.config.max_retries} retries"
            ) from None
        except openai.APIStatusError as exc:
            raise ProviderError(
                f"model {self.config.name}: the provider answered {exc.status_code}: {_detail(exc)}"
            ) from None
        try:
            data = json.loads(raw)
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ProviderError(f"model {self.config.name}: the provider's answer is not a chat completion") from None
        return Reply(_protocol_message(message), choice.get("finish_reason"), data.get("usage") or {})

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


def _http_client() -> Any:
    """An HTTP client for one Model, sharing one TLS context with every other.

    Loading the CA bundle costs ~40 ms of CPU; a daemon starting 200 goals at once would spend 8 s
    on it. One connection pool per model keeps the pool small (httpcore scans every connection of a
    pool on every request, which is quadratic when 200 runs share one).
    """
    global _ssl_context
    import httpx2
    import openai

    if _ssl_context is None:
        _ssl_context = httpx2.create_ssl_context()
    return openai.DefaultAsyncHttpxClient(verify=_ssl_context)


def _protocol_message(message: dict[str, Any]) -> dict[str, Any]:
    """Keep what the protocol needs sent back; drop provider-only fields such as reasoning_content."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{i}",
                "type": "function",
                "function": {
                    "name": (call.get("function") or {}).get("name") or "",
                    "arguments": (call.get("function") or {}).get("arguments") or "",
                },
            }
            for i, call in enumerate(calls)
        ]
    return out


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return body["message"]
    return str(getattr(exc, "message", exc))
