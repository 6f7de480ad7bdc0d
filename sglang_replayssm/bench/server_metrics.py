"""The server's own prefix-cache counters, read from its Prometheus ``/metrics`` page: prompt and cached tokens
(SGLang's), and the plugin's lost-hit tokens (KV matched, no mamba state at that depth: recomputed)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_replayssm.radix.metrics import PROMETHEUS_NAME as LOST_HIT_TOKENS

CACHED_TOKENS = "sglang:cached_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def metric_sums(text: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets (comments and bad lines skipped)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        sums[m.group("name")] = sums.get(m.group("name"), 0.0) + value
    return sums


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose label sets include every ``key="value"`` of ``labels``
    (0.0 when none matches)."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group("name") == name and all(f'{k}="{v}"' in line for k, v in labels.items()):
            try:
                total += float(m.group("value"))
            except ValueError:
                continue
    return total


@dataclass(frozen=True)
class CacheCounters:
    cached_tokens: float | None  # None: the page lacks the counter
    prompt_tokens: float | None
    lost_hit_tokens: float | None = None  # None: no lost-hit series (a server without the plugin, or none lost yet)

    @classmethod
    def parse(cls, text: str) -> CacheCounters:
        sums = metric_sums(text)
        prompt = sums.get(PROMPT_TOKENS)
        # SGLang creates the cached-token series on the first hit, so no series means zero hits.
        cached = sums.get(CACHED_TOKENS, 0.0 if prompt is not None else None)
        return cls(cached, prompt, sums.get(LOST_HIT_TOKENS))


def server_hit_rate(before: CacheCounters | None, after: CacheCounters | None) -> dict[str, float | None]:
    """Cached / prompt tokens the server counted between two snapshots, and the lost-hit tokens over the prompt
    tokens (None where unknown; a lost-hit series that appeared in between started at 0)."""
    out: dict[str, float | None] = {"cached_tokens": None, "prompt_tokens": None, "hit_rate": None,
                                    "lost_hit_tokens": None, "lost_hit_rate": None}
    if before is None or after is None:
        return out
    if after.cached_tokens is not None and before.cached_tokens is not None:
        out["cached_tokens"] = after.cached_tokens - before.cached_tokens
    if after.prompt_tokens is not None and before.prompt_tokens is not None:
        out["prompt_tokens"] = after.prompt_tokens - before.prompt_tokens
    if out["cached_tokens"] is not None and out["prompt_tokens"]:
        out["hit_rate"] = out["cached_tokens"] / out["prompt_tokens"]
    if after.lost_hit_tokens is not None:
        lost = after.lost_hit_tokens - (before.lost_hit_tokens or 0.0)
        out["lost_hit_tokens"] = lost
        if out["prompt_tokens"]:
            out["lost_hit_rate"] = lost / out["prompt_tokens"]
    return out
