"""The read copy on real CPU servers (opt-in: SGLANG_REPLAYSSM_SLOW=1; six servers, ~10 min on 2 cores):
tiny-gdn and tiny-kda (fp32), ``SGLANG_REPLAYSSM_READ_COPY=bf16|fp8`` against ``off``, long greedy
generations through the radix cache (extra_buffer, a shared 100-token prefix): the copy is attached, the
greedy tokens agree with the fp32 ring above a threshold per format, and every request's cached tokens
(hit rates) equal ``off``'s exactly. (Measured margins: notes/read-copy-e2e-cpu.json, docs/BENCHMARKS.md.)
"""

from __future__ import annotations

import os

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.testing.read_copy_e2e import compare, run_arm

pytestmark = [
    pytest.mark.server,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(os.environ.get("SGLANG_REPLAYSSM_SLOW") != "1",
                       reason="opt-in (six CPU servers, ~10 min): SGLANG_REPLAYSSM_SLOW=1"),
]

#: Greedy agreement with the fp32 ring, per copy format (4 prompts x 128 tokens).
MIN_AGREEMENT = {"bf16": 0.95, "fp8": 0.80}


@pytest.mark.parametrize("model_name", ["tiny-gdn", "tiny-kda"])
def test_read_copy_agrees_with_fp32_ring_and_keeps_hits(model_name, tmp_path):
    model = make_models(names=[model_name], log=lambda *a: None)[model_name]
    kw = dict(n_prompts=4, new_tokens=128, ring_len=16, top_k=5)
    ref = run_arm(model, "off", tmp_path / "off.log", **kw)
    assert not ref["read_copy_in_log"]
    assert min(r["cached_tokens"] for r in ref["results"][1:]) >= 64  # the shared prefix hits
    for mode, floor in MIN_AGREEMENT.items():
        got = run_arm(model, mode, tmp_path / f"{mode}.log", **kw)
        row = compare(ref, got)
        assert got["read_copy_in_log"], mode
        assert row["cached_equal_off"], (mode, row["cached_tokens"])
        assert row["greedy_agreement"] >= floor, (mode, row)
