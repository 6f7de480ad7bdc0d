"""The rebuild benchmark's own pieces on CPU (the GPU numbers in docs/BENCHMARKS.md rest on them):
its fold (the call sequence of ``record_rebuild._fold_gdn_layer``) run on the CPU runtime's torch
stand-ins of SGLang's kernels agrees with its fp64 oracle, GDN and KDA, from a state and across a
64-token chunk; the bytes floor counts what it says."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.rebuild_bench import (
    MODELS,
    RebuildProblem,
    default_counts,
    floor_bytes,
    record_bytes,
)
from tests.support.sglang_prefill_kernels import PrefillKernels

SMALL = {"H": 2, "HV": 4, "K": 16, "V": 16}


def _cpu_kernels() -> PrefillKernels:
    from sglang_replayssm.cpu import kda
    from sglang_replayssm.cpu.standin import ops

    def conv(x: Any, weight: Any, bias: Any, activation: str, conv_states: Any, has_initial_state: Any,
             cache_indices: Any, query_start_loc: Any, seq_lens_cpu: Any) -> Any:
        return ops.causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices,
                                         has_initial_state, activation == "silu")

    def chunk_gdn(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, initial_state_indices: Any,
                  cu_seqlens: Any, head_first: bool, use_qk_l2norm_in_kernel: bool) -> Any:
        return ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, False, cu_seqlens, head_first,
                                              use_qk_l2norm_in_kernel, initial_state_indices)

    def chunk_kda(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, initial_state_indices: Any,
                  cu_seqlens: Any, A_log: Any, dt_bias: Any, beta_is_raw: bool, **unused: Any) -> Any:
        return kda.chunk_kda(q, k, v, g, beta, ssm_states=initial_state, cache_indices=initial_state_indices,
                             query_start_loc=cu_seqlens, A_log=A_log, dt_bias=dt_bias, beta_is_raw=beta_is_raw,
                             return_intermediate_states=False, track_state=None, track_chunk_idx=None)

    def gates(A_log: Any, a: Any, b: Any, dt_bias: Any) -> Any:  # SGLang's Triton kernel rounds beta to b.dtype
        g, beta = ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
        return g, beta.to(b.dtype).float()

    def recurrent(**kwargs: Any) -> Any:  # SGLang's own decode kernel, interpreted
        from tests.support.sglang_triton import interpreted_stdlib, load_sglang_triton_module

        mod = load_sglang_triton_module("sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent")
        with interpreted_stdlib():
            return mod.fused_sigmoid_gating_delta_rule_update(**kwargs)

    return PrefillKernels(causal_conv1d_fn=conv, fused_gdn_gating=gates, chunk_gated_delta_rule=chunk_gdn,
                          chunk_kda=chunk_kda, fused_sigmoid_gating_delta_rule_update=recurrent,
                          source="cpu stand-ins")


@pytest.mark.parametrize("model", ["gdn", "kda"])
@pytest.mark.parametrize("n", [1, 3, 70])
def test_bench_fold_on_the_cpu_standins_matches_its_oracle(model: str, n: int) -> None:
    pb = RebuildProblem(_cpu_kernels(), model, B=3, n_max=70, sets=2, seed=n, device="cpu", shape=SMALL)
    pb.prepare(n)
    res = pb.check(1)
    assert res["finite"] and res["window_equal"]
    assert res["state_rel"] < 1e-5 < res["state_change_rel"]
    if n <= 3:  # the sequential fold (decode kernel) of the same spans
        res = pb.check(0, sequential=True)
        assert res["finite"] and res["window_equal"]
        assert res["state_rel"] < 1e-5 < res["state_change_rel"]


def test_floor_counts_records_state_and_window() -> None:
    p = MODELS["gdn"]
    assert record_bytes(p) == 2 * (2 * 16 * 128 + 32 * 128 + 32 + 32)  # x, a, b in bf16: 16.5 KB
    state, window = 4 * 32 * 128 * 128, 2 * 8192 * 3
    assert floor_bytes(p, 64, 10) == 64 * (10 * record_bytes(p) + 2 * state + 2 * window)
    assert record_bytes(MODELS["kda"]) == 2 * (3 * 32 * 128 + 32 * 128 + 32)
    counts = default_counts()
    assert counts[:16] == list(range(1, 17)) and counts[-1] == 255 and all(c % 8 == 0 for c in counts[16:-1])
