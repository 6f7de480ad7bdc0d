"""The attention-only prefix-hit ceiling of a run: what a token-granular prefix cache could reuse.

For each request, the longest common prefix of its prompt with any sequence the cache could hold when
it was sent: the prompt of every request sent before it, plus that request's output but its last
token once it had finished (an attention-only model keeps the KV of both; the last sampled token is
never fed back, so no server has its KV), capped at ``len(prompt) - 1`` (SGLang always computes the
last prompt token). Order is the client's send order (``start_s``), so the ceiling of a
concurrent run is that of what had really been sent. Prompts are rebuilt from the workload and the
arm's own outputs (a later turn's prompt is the history plus its new tokens), as the client built them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_replayssm.bench.metrics import common_prefix
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.workload import Conversation


def prompts(conversations: Sequence[Conversation], records: Sequence[RequestRecord]) -> dict[str, list[int]]:
    """Each completed request's prompt ids, by request id."""
    by_rid = {r.rid: r for r in records}
    out: dict[str, list[int]] = {}
    for conv in conversations:
        history: list[int] = []
        for t, turn in enumerate(conv.turns):
            rec = by_rid.get(conv.rid(t))
            if rec is None or not rec.ok:
                break
            prompt = history + list(turn.new_ids)
            out[rec.rid] = prompt
            history = prompt + list(rec.output_ids)
    return out


def ceiling_tokens(conversations: Sequence[Conversation], records: Sequence[RequestRecord]) -> dict[str, int]:
    """Per completed request: the most prompt tokens an attention-only prefix cache could have hit."""
    ids = prompts(conversations, records)
    sent = sorted((r for r in records if r.rid in ids), key=lambda r: r.start_s)  # stable: workload order
    out: dict[str, int] = {}
    for i, rec in enumerate(sent):
        prompt = ids[rec.rid]
        best = 0
        for earlier in sent[:i]:
            seq = ids[earlier.rid]
            done = earlier.e2e_s is not None and earlier.start_s + earlier.e2e_s <= rec.start_s
            if done:
                seq = seq + list(earlier.output_ids)[:-1]
            best = max(best, common_prefix(prompt, seq))
        out[rec.rid] = min(best, max(len(prompt) - 1, 0))
    return out


def ceiling_hit_rate(ceiling: dict[str, int], records: Sequence[RequestRecord]) -> float | None:
    """Ceiling tokens over prompt tokens, over the same requests as ``metrics.hit_rate``."""
    done = [r for r in records if r.ok and r.rid in ceiling]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(ceiling[r.rid] for r in done) / prompt if prompt else None
