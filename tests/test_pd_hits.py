"""The PD decode server's own prefix hits (radix/pd/hits.py, fix ``pd_hits``): the registered hook on
``DecodePreallocQueue._pre_alloc`` logs one line per admission with the decode tree's hit, the host
hit, the mamba-lost hit and the running hit rate; with the fix off it logs and counts nothing
(SGLang reports no decode-side hit at all). The server run is in tests/test_pd_server.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sglang_replayssm.radix import config, hooks, metrics
from sglang_replayssm.radix.pd import hits as pd_hits


def _hook():
    (hook,) = [h for h in hooks.HOOKS if h.name == "count_decode_hits"]
    assert hook.target.endswith("DecodePreallocQueue._pre_alloc") and hook.fix == "pd_hits"
    return hook.fn


def _req(n: int, *, kv_hit: int = 0, state_depth: int = 0) -> SimpleNamespace:
    """A request of ``n`` prompt tokens whose decode-side match found ``kv_hit`` KV tokens, of which
    ``state_depth`` have a mamba state (recorded as the lost_hit_metric hook does on the match)."""
    req = SimpleNamespace(origin_input_ids=list(range(n)))
    metrics.record_match(SimpleNamespace(req=req), SimpleNamespace(full_kv_hit_length=kv_hit,
                                                                  device_prefix_len=state_depth, host_hit_length=0))
    return req


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_each_decode_admission_logs_its_own_hit_and_the_rate(fix_on, caplog):
    fn, before = _hook(), pd_hits.totals()
    with config.override(True, pd_hits=fix_on), caplog.at_level(logging.INFO, logger=pd_hits.__name__):
        fn(None, object(), _req(100))  # first turn: nothing cached, SGLang's positional call
        fn(None, object(), _req(300, kv_hit=300, state_depth=0), None, 0, 0)  # KV hit, no state: lost
        fn(None, object(), _req(400, kv_hit=348, state_depth=348), "indices", 348, 348)  # a next turn
        fn(None, object(), _req(200, kv_hit=64, state_depth=64), prefix_indices="i", prefix_len=64,
           total_prefix_len=96)  # 32 more promised from the decode side's host cache
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(pd_hits.LOG_PREFIX)]
    after = pd_hits.totals()
    if not fix_on:
        assert lines == [] and after == before
        return
    assert (after.requests - before.requests, after.prompt_tokens - before.prompt_tokens,
            after.hit_tokens - before.hit_tokens, after.host_hit_tokens - before.host_hit_tokens,
            after.lost_hit_tokens - before.lost_hit_tokens) == (4, 1000, 412, 32, 300)
    assert lines[1].startswith("PD decode admission: #prompt-token: 300, #decode-hit-token: 0, "
                               "#decode-host-hit-token: 0, #mamba-lost-hit-token: 300, decode hit rate: ")
    assert "#prompt-token: 400, #decode-hit-token: 348, #decode-host-hit-token: 0, #mamba-lost-hit-token: 0" in lines[2]
    assert "#decode-hit-token: 64, #decode-host-hit-token: 32" in lines[3]
    assert lines[3].endswith(f"decode hit rate: {after.hit_tokens}/{after.prompt_tokens} = {100 * after.rate:.1f}%")


def test_the_rate_of_no_admission_is_zero():
    assert pd_hits.DecodeHits().rate == 0.0
