"""Issue 3 end to end: ReplaySSM + radix adapter + extra_buffer keeps every prefix hit of ReplaySSM off.

Real servers on the CPU runtime, tiny fp32 models. A shared-prefix stream (3 groups x 3 prompts,
sent one at a time) must get the same greedy tokens as the ReplaySSM-off extra_buffer server, with
ring lengths that do (4) and do not (5) divide the 64-token track interval, and per request at least
its `cached_tokens`. With records (issue 12) every hit reaches the attention-only ceiling (the whole
shared prefix, not its 64-token grid floor), for GDN and KDA.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.testing.serve import cpu_server, generate

pytestmark = [pytest.mark.server, pytest.mark.timeout(1200)]

NEW_TOKENS = 12


def _stream(seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(3):
        system = [rng.randrange(10, 2000) for _ in range(150)]  # crosses two 64-token boundaries
        out += [system + [rng.randrange(10, 2000) for _ in range(7 + 5 * j)] for j in range(3)]
    return out


def _ceiling(prompts: list[list[int]], results: list[dict]) -> list[int]:
    """Per request: the longest prefix an attention-only cache holds (earlier prompt + answer but its
    last token, which has no KV)."""
    out = []
    for i, p in enumerate(prompts):
        best = 0
        for q, r in zip(prompts[:i], results[:i]):
            seen = q + r["output_ids"][:-1]
            n = 0
            while n < min(len(p) - 1, len(seen)) and p[n] == seen[n]:
                n += 1
            best = max(best, n)
        out.append(best)
    return out


def _run(model: Path, flags: list[str], log: Path) -> list[dict]:
    base = ["--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", "64"]
    with cpu_server(model, base + flags, log) as url:
        return [generate(url, p, NEW_TOKENS) for p in _stream()]


@pytest.mark.parametrize("model_name", ["tiny-gdn", "tiny-kda"])
def test_ring_with_adapter_keeps_every_prefix_hit(tmp_path, model_name):
    model = make_models(names=[model_name], log=lambda *a: None)[model_name]
    reference = _run(model, [], tmp_path / "off.log")
    ref_cached = [r["cached_tokens"] for r in reference]
    # The stream really exercises the cache: every non-first prompt of a group hits >= 128 tokens.
    assert all(c >= 128 for i, c in enumerate(ref_cached) if i % 3), ref_cached
    for ring_len in (4, 5):
        ring = _run(model, ["--enable-linear-replayssm", "--linear-replayssm-cache-len", str(ring_len)],
                    tmp_path / f"ring{ring_len}.log")
        cached = [r["cached_tokens"] for r in ring]
        assert all(c >= r for c, r in zip(cached, ref_cached)), f"L={ring_len}: {cached} < {ref_cached}"
        assert cached == _ceiling(_stream(), ring), f"L={ring_len}"
        assert cached != ref_cached, "records add no hit over the 64-token grid on this stream"
        for i, (a, b) in enumerate(zip(reference, ring)):
            assert a["output_ids"] == b["output_ids"], f"L={ring_len}: request {i} differs"
