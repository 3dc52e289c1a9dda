"""What a reply costs in US dollars: `model.price` when the goal gives one, else genai-prices' offline table.

genai-prices ships its price table inside the package; runner never asks it to update over the network.
A model on a local endpoint (127.0.0.1, localhost, a `script:` model) or one the table does not know has
no price: its usage is counted in tokens only, and `Pricer.unknown` says why, once per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..config import ModelConfig, Price

OPENAI_URL = "https://api.openai.com/v1"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


@dataclass(frozen=True)
class Pricer:
    """Prices the usage of one model's replies."""

    model: str
    price: Price | None = None
    """Dollars per million tokens given in the goal (`model.price`); wins over the table."""
    provider_url: str | None = None
    """The endpoint genai-prices knows the model by; None when it does not know it."""
    unknown: str | None = None
    """Why the price is unknown (the cost is then counted in tokens only), or None."""

    @classmethod
    def for_model(cls, config: ModelConfig, base_url: str | None) -> Pricer:
        if config.price is not None:
            return cls(config.name, price=config.price)
        url = (base_url or OPENAI_URL).rstrip("/")
        key = (config.name, url)
        if key not in _looked_up:
            _looked_up[key] = _look_up(config.name, url)
        return _looked_up[key]

    @property
    def known(self) -> bool:
        return self.unknown is None

    def cost(self, usage: dict[str, Any]) -> float | None:
        """The dollars of one reply's usage (OpenAI's `usage` object), or None when the price is unknown."""
        input_tokens = int(usage.get("prompt_tokens") or 0)
        output_tokens = int(usage.get("completion_tokens") or 0)
        if self.price is not None:
            return (input_tokens * self.price.input + output_tokens * self.price.output) / 1_000_000
        if self.provider_url is None:
            return None
        from genai_prices import Usage, calc_price

        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
        counted = Usage(input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cached or None)
        return float(calc_price(counted, self.model, provider_api_url=self.provider_url).total_price)


_looked_up: dict[tuple[str, str], Pricer] = {}


def _look_up(name: str, url: str) -> Pricer:
    host = urlsplit(url).hostname or ""
    hint = "give `model.price: {input: ..., output: ...}` (dollars per million tokens) to count dollars"
    if name.startswith("script:") or host in LOCAL_HOSTS:
        return Pricer(name, unknown=f"model {name} at {url} is local and has no price; {hint}")
    from genai_prices import Usage, calc_price

    try:
        calc_price(Usage(input_tokens=0, output_tokens=0), name, provider_api_url=url)
    except LookupError:
        return Pricer(name, unknown=f"genai-prices does not know model {name} at {url}; {hint}")
    return Pricer(name, provider_url=url)
