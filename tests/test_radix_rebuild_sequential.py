"""The sequential rebuild (``radix/records/rebuild.py``, spans of at most ``pool.sequential_tokens``):
the recurrence runs through SGLang's own Triton decode kernel ``fused_sigmoid_gating_delta_rule_update``
(here under the Triton interpreter, as on CUDA compiled),
varlen over the spans, into SGLang's real pools. Checked against the fp64 recurrence of each token
path (GDN and KDA; from the root, a tree state and an interval state with its conv lead), and the
plan keeps the chunk kernels when any span is longer than the limit.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.radix.records import rebuild as record_rebuild
from sglang_replayssm.radix.records.match import Rebuild
from sglang_replayssm.radix.records.rebuild import rebuild
from tests.support.sglang_triton import interpreted_stdlib, load_sglang_triton_module
from tests.test_radix_records import _check, _kda_oracle, _oracle, _setup_rebuild, _tree_jobs

_RECURRENT = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"


@pytest.fixture
def calls(monkeypatch) -> list[int]:
    """SGLang's Triton kernel, interpreted, in place of the compiled one; records each launch's span count."""
    kernel = load_sglang_triton_module(_RECURRENT).fused_sigmoid_gating_delta_rule_update
    seen: list[int] = []

    def interpreted(**kwargs):
        seen.append(int(kwargs["cu_seqlens"].numel()) - 1)
        with interpreted_stdlib():
            return kernel(**kwargs)

    monkeypatch.setattr(record_rebuild, "_decode_kernel", lambda: interpreted)
    return seen


def _no_extend(*args, **kwargs):
    raise AssertionError("the chunk kernels ran on a step whose spans are all short")


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_sequential_rebuild_matches_the_fp64_recurrence(kind, calls, radix_adapter):
    kda = kind == "kda"
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(40, seed=5, kind=kind)
    backend.kernel_dispatcher = types.SimpleNamespace(extend=_no_extend)
    pool.sequential_tokens = 12
    spans = [(0, 1), (0, 5), (9, 21), (30, 31)]  # root spans (zeroed slot), tree-state spans
    oracle = _kda_oracle if kda else None
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans, oracle=oracle, kda=kda)
    want = [n for _, n in spans]
    if not kda:  # and one from an interval state: the lead records make the window, 7 are folded
        from sglang_replayssm.radix.records.interval_states import IntervalStates

        pool.states = IntervalStates(kv_size=512, capacity=4, interval=64, device=torch.device("cpu"))
        pool.states.owner[0] = kv[19]
        pool.states.state_of[kv[19]] = 0
        for layer, (x, a, b) in zip(layers, inputs):
            pool.states.ssm.setdefault(layer.layer_id, torch.zeros(5, model.HV, model.V, model.K))[0] = (
                _oracle(layer, model, x, a, b, 20).float())
        lead = model.win
        jobs.append(Rebuild(dst=req_pool.mamba_allocator.alloc(1), src=None, slots=pool.slots(kv[20 - lead:27]),
                            state=0, lead=lead))
        want.append(27)
    rebuild(pool, req_pool, jobs)
    assert calls == [len(jobs)] * len(layers)  # one varlen launch per layer, every span in it
    _check(model, req_pool, layers, inputs, jobs, want, oracle=oracle, kda=kda)


def test_a_long_span_keeps_the_chunk_kernels(calls, radix_adapter):
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(40, seed=6)
    pool.sequential_tokens = 12
    spans = [(0, 3), (0, 13)]  # 13 records > 12: the whole step takes the chunk path
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans)
    rebuild(pool, req_pool, jobs)
    assert calls == []
    _check(model, req_pool, layers, inputs, jobs, [n for _, n in spans])


def test_sequential_tokens_from_env(monkeypatch):
    monkeypatch.delenv(record_rebuild.SEQUENTIAL_ENV, raising=False)
    assert record_rebuild.sequential_tokens_from_env() == record_rebuild.DEFAULT_SEQUENTIAL_TOKENS
    monkeypatch.setenv(record_rebuild.SEQUENTIAL_ENV, "0")
    assert record_rebuild.sequential_tokens_from_env() == 0
    monkeypatch.setenv(record_rebuild.SEQUENTIAL_ENV, "short")
    with pytest.raises(ValueError, match="SGLANG_REPLAYSSM_REBUILD_SEQUENTIAL_TOKENS.*number of tokens"):
        record_rebuild.sequential_tokens_from_env()
