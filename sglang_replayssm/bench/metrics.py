"""Per-arm numbers from request records: hit rate, latency percentiles, throughput, agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sglang_replayssm.bench.records import RequestRecord


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def hit_rate(records: Sequence[RequestRecord]) -> float | None:
    """Sum of cached tokens over sum of prompt tokens, over requests that completed."""
    done = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in done)
    return sum(r.cached_tokens for r in done) / prompt if prompt else None


@dataclass(frozen=True)
class Agreement:
    reference: str  # the arm compared against
    requests: int  # requests both arms completed
    requests_equal: int
    tokens: int  # reference output tokens of those requests
    tokens_matched: int  # leading output tokens equal to the reference, summed
    first_diff_rid: str | None  # first differing request in workload order
    first_diff_token: int | None  # index of its first differing output token

    @property
    def token_fraction(self) -> float | None:
        return self.tokens_matched / self.tokens if self.tokens else None

    @property
    def request_fraction(self) -> float | None:
        return self.requests_equal / self.requests if self.requests else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "token_fraction": self.token_fraction,
                "request_fraction": self.request_fraction}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(reference_name: str, reference: Sequence[RequestRecord],
              records: Sequence[RequestRecord]) -> Agreement:
    """Greedy outputs of ``records`` against ``reference``, matched by request id.

    Token agreement counts each request's outputs up to its first difference (a longer or shorter
    output differs at the shorter length); later tokens of a diverged request do not count.
    """
    ref = {r.rid: r for r in reference if r.ok}
    n = equal = tokens = matched = 0
    first_rid: str | None = None
    first_tok: int | None = None
    for rec in records:
        other = ref.get(rec.rid)
        if other is None or not rec.ok:
            continue
        n += 1
        tokens += len(other.output_ids)
        common = common_prefix(other.output_ids, rec.output_ids)
        matched += min(common, len(other.output_ids))
        if list(other.output_ids) == list(rec.output_ids):
            equal += 1
        elif first_rid is None:
            first_rid, first_tok = rec.rid, common
    return Agreement(reference_name, n, equal, tokens, matched, first_rid, first_tok)


def spec_acceptance(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """Speculative decoding over the completed requests that verified: ``spec_accept_length_mean``,
    output tokens per verify forward (SGLang's ``spec_accept_length``: accepted drafts + the bonus
    token), and ``spec_accepted_drafts_mean``, accepted draft tokens per verify; None without spec."""
    spec = [r for r in records if r.ok and r.spec_verify_ct > 0]
    verify = sum(r.spec_verify_ct for r in spec)
    if not verify:
        return {"spec_accept_length_mean": None, "spec_accepted_drafts_mean": None}
    return {"spec_accept_length_mean": sum(r.completion_tokens for r in spec) / verify,
            "spec_accepted_drafts_mean": sum(r.spec_correct_drafts for r in spec) / verify}


def summarize(records: Sequence[RequestRecord], wall_s: float) -> dict[str, Any]:
    """Client-side numbers of one arm's measured run (``wall_s``: its duration)."""
    done = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    e2e = [r.e2e_s for r in done if r.e2e_s is not None]
    out_tokens = sum(r.completion_tokens for r in done)
    return {
        "requests_total": len(records),
        "requests_ok": len(done),
        "requests_failed": len(records) - len(done),
        "prompt_tokens": sum(r.prompt_tokens for r in done),
        "cached_tokens": sum(r.cached_tokens for r in done),
        "output_tokens": out_tokens,
        "hit_rate": hit_rate(records),
        "ttft_mean_s": mean(ttft),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_mean_s": mean(e2e),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p90_s": percentile(e2e, 90),
        "e2e_p99_s": percentile(e2e, 99),
        "output_tok_s": out_tokens / wall_s if wall_s > 0 else None,
        "wall_s": wall_s,
        **spec_acceptance(records),
    }
