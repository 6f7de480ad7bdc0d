"""The sequential rebuild (``radix/record_rebuild.py``, spans of at most ``pool.sequential_tokens``):
the recurrence runs through the backend's decode kernel, SGLang's own
``fused_sigmoid_gating_delta_rule_update`` (here under the Triton interpreter, as on CUDA compiled),
varlen over the spans, into SGLang's real pools. Checked against the fp64 recurrence of each token
path (GDN and KDA; from the root, a tree state and an interval state with its conv lead), and the
plan keeps the chunk kernels when any span is longer than the limit.
"""

from __future__ import annotations

import types

import pytest
import torch
from test_radix_records import _check, _kda_oracle, _oracle, _setup_rebuild, _tree_jobs

from sglang_replayssm.radix import record_rebuild
from sglang_replayssm.radix.record_match import Rebuild
from sglang_replayssm.radix.record_rebuild import rebuild
from sglang_replayssm.testing.sglang_triton import interpreted_stdlib, load_sglang_triton_module

_RECURRENT = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"


def _decode(is_kda: bool, calls: list[int]):
    """What ``TritonGDNKernel.decode`` / ``kda_triton``'s decode call, on SGLang's Triton kernel."""
    kernel = load_sglang_triton_module(_RECURRENT).fused_sigmoid_gating_delta_rule_update

    def decode(q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices, query_start_loc, lower_bound=None):
        calls.append(int(query_start_loc.numel()) - 1)
        with interpreted_stdlib():
            return kernel(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=ssm_states,
                          initial_state_indices=cache_indices, cu_seqlens=query_start_loc,
                          use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0, is_kda=is_kda,
                          lower_bound=lower_bound)

    return decode


def _no_extend(*args, **kwargs):
    raise AssertionError("the chunk kernels ran on a step whose spans are all short")


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_sequential_rebuild_matches_the_fp64_recurrence(kind, radix_adapter):
    kda = kind == "kda"
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(40, seed=5, kind=kind)
    calls: list[int] = []
    backend.kernel_dispatcher = types.SimpleNamespace(decode=_decode(kda, calls), extend=_no_extend)
    pool.sequential_tokens = 12
    spans = [(0, 1), (0, 5), (9, 21), (30, 31)]  # root spans (zeroed slot), tree-state spans
    oracle = _kda_oracle if kda else None
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans, oracle=oracle, kda=kda)
    want = [n for _, n in spans]
    if not kda:  # and one from an interval state: the lead records make the window, 7 are folded
        from sglang_replayssm.radix.interval_states import IntervalStates

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


def test_a_long_span_keeps_the_chunk_kernels(radix_adapter):
    model, req_pool, layers, backend, pool, kv, inputs = _setup_rebuild(40, seed=6)
    extend = backend.kernel_dispatcher.extend
    backend.kernel_dispatcher = types.SimpleNamespace(decode=_no_extend, extend=extend)
    pool.sequential_tokens = 12
    spans = [(0, 3), (0, 13)]  # 13 records > 12: the whole step takes the chunk path
    jobs = _tree_jobs(model, req_pool, layers, inputs, pool, kv, spans)
    rebuild(pool, req_pool, jobs)
    _check(model, req_pool, layers, inputs, jobs, [n for _, n in spans])


def test_sequential_tokens_from_env(monkeypatch):
    monkeypatch.delenv(record_rebuild.SEQUENTIAL_ENV, raising=False)
    assert record_rebuild.sequential_tokens_from_env() == record_rebuild.DEFAULT_SEQUENTIAL_TOKENS
    monkeypatch.setenv(record_rebuild.SEQUENTIAL_ENV, "0")
    assert record_rebuild.sequential_tokens_from_env() == 0
    monkeypatch.setenv(record_rebuild.SEQUENTIAL_ENV, "short")
    with pytest.raises(ValueError, match="SGLANG_REPLAYSSM_REBUILD_SEQUENTIAL_TOKENS.*number of tokens"):
        record_rebuild.sequential_tokens_from_env()
