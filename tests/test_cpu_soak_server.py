"""The short soak on the CPU runtime with a real server (slow, `server` marker): ``tests/support/soak.py`` for
3 minutes of mixed traffic (RAG, multi-turn sessions, client disconnects; retraction, also forced every 40 steps by
SGLang's ``SGLANG_TEST_RETRACT``; HiCache eviction and load-back, the L3 file store, records) with a probe every
45 s, then the drain. The same acceptance as ``make soak``'s
30 minutes: no failed request (client aborts aside), every probe equal to HF's greedy tokens, every
``sglang:replayssm_*`` gauge back to idle, the scheduler's RSS growth over the second half under 2%.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import soak


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    from sglang_replayssm.models import make_models

    return make_models(names=("tiny-gdn",), log=lambda *a: None)


@pytest.mark.server
@pytest.mark.timeout(900)
def test_a_short_soak_serves_right_and_leaves_nothing_behind(models, tmp_path):
    report = soak.run(models["tiny-gdn"], tmp_path, seconds=180, workers=4, probe_every_s=45, sample_every_s=5,
                      retract_every=40)
    brief = {k: v for k, v in report.items() if k != "samples"}
    assert report["ok"] > 0 and len(report["probes"]) >= 4, brief  # probes: during the traffic, after the drain
    assert soak.problems(report, min_retractions=1) == [], brief


def test_a_probe_may_differ_only_at_a_near_tie():
    """The read-copy arm's probes (``probe_match``): equal tokens pass; a first difference passes only where
    HF's own top-2 logit gap there is under the tie tolerance; without margins (exact arms) any difference fails."""
    want = [5, 6, 7, 8]
    gaps = [3.0, 0.01, 2.0, 0.02]
    assert soak.probe_match([5, 6, 7, 8], want, None, 0.0)
    assert soak.probe_match([5, 9, 1, 1], want, gaps, 0.05)  # flipped at a near tie, diverged after
    assert not soak.probe_match([5, 6, 9, 8], want, gaps, 0.05)  # flipped where HF was sure
    assert not soak.probe_match([5, 9, 1, 1], want, None, 0.05) and not soak.probe_match(None, want, gaps, 0.05)
    assert not soak.probe_match([5, 6], want, gaps, 0.05)  # cut short where HF was sure (index 2)
