"""Who may use the dashboard: loopback by default, a token anywhere else, a CSRF token on every change.

- Bound to a loopback address, requests must name a loopback host (a page on another site that
  rebinds its DNS name to 127.0.0.1 is refused).
- With `daemon.ui.token` set, every request needs it: `?token=...` once (a cookie then carries a
  digest of it), or `Authorization: Bearer ...`.
- A POST must carry the `csrf` form field equal to the `runner_csrf` cookie (double submit; the
  cookie is SameSite=Strict), and an Origin, when sent, naming this host.
- Every value a template prints passes through a `Masker` first: no secret reaches a page.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from ..errors import ConfigError

TOKEN_COOKIE = "runner_ui_token"
CSRF_COOKIE = "runner_csrf"
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)
"""The names `scrub_env` keeps from tools and checks; their values never appear on a page."""
MASK = "[secret]"


class Masker:
    """Replaces every secret value known to this process (and any given) by `[secret]`."""

    def __init__(self, extra: Iterable[str | None] = ()) -> None:
        values = {v for k, v in os.environ.items() if SECRET_NAME.search(k)} | {v for v in extra if v}
        longest_first = sorted((v for v in values if len(v) >= 6), key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None

    def __call__(self, text: str) -> str:
        return self.pattern.sub(MASK, text) if self.pattern and text else text

    def shown(self, value: Any) -> Any:
        """Jinja's `finalize`: a plain string printed by a template is masked (markup built by a macro was
        masked piece by piece already)."""
        return self(value) if type(value) is str else value


def is_loopback(host: str) -> bool:
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve beyond this machine without a token."""
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"runner ui: {host} is not a loopback address; set daemon.ui.token in runner.yaml "
            "(every request must then carry it) or bind 127.0.0.1"
        )


def same(given: str | None, expected: str | None) -> bool:
    return bool(given and expected) and hmac.compare_digest(given.encode(), expected.encode())  # type: ignore[union-attr]


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


class Guard:
    """ASGI middleware: the host check, the token and the security headers on every response."""

    def __init__(self, app: Any, token: str | None, loopback: bool) -> None:
        self.app, self.token, self.loopback = app, token, loopback

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.loopback and _hostname(headers.get("host", "")) not in LOOPBACK_NAMES:
            await _plain(send, 403, "this dashboard answers only to localhost / 127.0.0.1")
            return
        if self.token and not self._allowed(scope, headers):
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
            if same(query.get("token"), self.token):
                await _login(scope, send, query, self.token)
            else:
                await _plain(send, 401, "this dashboard needs its token: open it once as /?token=THE_TOKEN")
            return

        async def secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, secured)

    def _allowed(self, scope: dict[str, Any], headers: dict[str, str]) -> bool:
        bearer = headers.get("authorization", "").removeprefix("Bearer ").strip()
        return same(bearer, self.token) or same(_cookies(headers).get(TOKEN_COOKIE), cookie_of(self.token))


def cookie_of(token: str) -> str:
    """What the browser keeps instead of the token itself (any characters, and not the secret in the clear)."""
    return hashlib.sha256(b"runner ui cookie\0" + token.encode()).hexdigest()


def origin_ok(headers: Any) -> bool:
    """A POST's Origin, when the browser sends one, names the host it was sent to."""
    origin = headers.get("origin")
    if origin is None:
        return True
    return origin.split("://", 1)[-1].rstrip("/") == headers.get("host", "")


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host.split("]")[0] + "]"
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    pairs = (part.strip().partition("=") for part in headers.get("cookie", "").split(";"))
    return {name: value for name, _, value in pairs if name}


async def _login(scope: dict[str, Any], send: Any, query: dict[str, str], token: str) -> None:
    """`?token=` once: keep it in a cookie and send the browser to the same page without it in the address."""
    rest = urlencode({k: v for k, v in query.items() if k != "token"})
    location = scope["path"] + (f"?{rest}" if rest else "")
    cookie = f"{TOKEN_COOKIE}={cookie_of(token)}; HttpOnly; SameSite=Strict; Path=/"
    await send(
        {
            "type": "http.response.start",
            "status": 303,
            "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()), *HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": b""})


async def _plain(send: Any, status: int, text: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": text.encode() + b"\n"})
