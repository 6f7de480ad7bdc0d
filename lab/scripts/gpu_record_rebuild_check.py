"""The product's ``record_rebuild.rebuild`` on CUDA (the device box has no SGLang: its kernels are
loaded by path from ``.devcarry``, its pools are stood in by plain per-layer tensors of SGLang's
layout). Run from the repository root there, not under pytest:

    SGLANG_REPLAYSSM_SGLANG_ROOT=$PWD/.devcarry python3 lab/scripts/gpu_record_rebuild_check.py

Two steps of rebuilds, Qwen3-Next GDN shard shapes (H=16, HV=32, K=V=128, conv 4, bf16 records, fp32
states), each batching spans from the root, from a tree state and from an interval state (conv lead):
one whose spans are all short (the sequential fold, SGLang's Triton decode kernel) and one with long
spans (the chunk kernels). Every rebuilt state is checked against the fp64 recurrence of its whole
token path and every conv window against the path's last inputs, bit for bit.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab
from tests.support.sglang_prefill_kernels import load_prefill_kernels  # noqa: E402

kern = load_prefill_kernels(Path(os.environ.get("SGLANG_REPLAYSSM_SGLANG_ROOT", ".devcarry")))
linear = types.ModuleType("sglang.srt.layers.attention.linear")
gdn_backend = types.ModuleType("sglang.srt.layers.attention.linear.gdn_backend")
gdn_backend.causal_conv1d_fn = kern.causal_conv1d_fn  # type: ignore[attr-defined]
linear.gdn_backend = gdn_backend  # type: ignore[attr-defined]
for name in ("sglang.srt.layers", "sglang.srt.layers.attention"):
    sys.modules.setdefault(name, types.ModuleType(name))
sys.modules["sglang.srt.layers.attention.linear"] = linear
sys.modules["sglang.srt.layers.attention.linear.gdn_backend"] = gdn_backend

from sglang_replayssm.kernels.naive import (  # noqa: E402
    compute_beta_fp64,
    compute_gate_fp64,
    recurrence_fp64,
    unpack_mixed_qkv,
)
from sglang_replayssm.radix.records.interval_states import IntervalStates  # noqa: E402
from sglang_replayssm.radix.records.match import Rebuild  # noqa: E402
from sglang_replayssm.radix.records.pool import RecordPool  # noqa: E402
from sglang_replayssm.radix.records.rebuild import DEFAULT_SEQUENTIAL_TOKENS, rebuild  # noqa: E402

dev = torch.device("cuda")
H, HV, K, V, W, LAYERS, SLOTS = 16, 32, 128, 128, 4, 2, 40
D = 2 * H * K + HV * V
gen = torch.Generator(device=dev).manual_seed(0)


def layer(i: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        layer_id=i, conv_weights=(0.3 * torch.randn(D, W, device=dev, generator=gen)).bfloat16(), bias=None,
        activation="silu", A_log=torch.log(0.02 + 0.2 * torch.rand(HV, device=dev, generator=gen)),
        dt_bias=-2.0 + 0.5 * torch.randn(HV, device=dev, generator=gen), q_dim=H * K, k_dim=H * K, v_dim=HV * V,
        num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V)


layers = [layer(i) for i in range(LAYERS)]
conv = {i: torch.randn(SLOTS, D, W - 1, device=dev, generator=gen).bfloat16() for i in range(LAYERS)}
ssm = {i: torch.randn(SLOTS, HV, V, K, device=dev, generator=gen) for i in range(LAYERS)}


def extend(q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **unused):  # TritonGDNKernel.extend
    return kern.chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=ssm_states,
                                       initial_state_indices=cache_indices, cu_seqlens=query_start_loc,
                                       head_first=False, use_qk_l2norm_in_kernel=True)


backend = types.SimpleNamespace(_prefill_gates=lambda ly, a, b: kern.fused_gdn_gating(ly.A_log, a, b, ly.dt_bias),
                                kernel_dispatcher=types.SimpleNamespace(extend=extend),
                                requires_contiguous_prefill_state=False)


class MambaPool:
    def clear_slots(self, idx: torch.Tensor) -> None:
        for i in range(LAYERS):
            conv[i][idx.long()] = 0
            ssm[i][idx.long()] = 0


class ReqPool:
    mamba_pool = MambaPool()

    def translate_mamba_indices(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def copy_mamba_state(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for i in range(LAYERS):
            conv[i][dst.long()] = conv[i][src.long()]
            ssm[i][dst.long()] = ssm[i][src.long()]

    def mamba2_layer_cache(self, i: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(conv=[conv[i]], temporal=ssm[i])


def oracle(ly: types.SimpleNamespace, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, n: int,
           round_beta: bool) -> torch.Tensor:
    """fp64 state after the first n tokens from zero (conv output rounded to bf16, as SGLang's conv)."""
    xp = torch.cat([torch.zeros(W - 1, D, dtype=torch.float64, device=dev), x[:n].double()])
    w = ly.conv_weights.double()
    c = sum(xp[j : j + n] * w[:, j] for j in range(W))
    c = F.silu(c).bfloat16().double()
    q, k, v = unpack_mixed_qkv(c, H, K, HV, V)
    g = compute_gate_fp64(a[:n], ly.A_log, ly.dt_bias, is_kda=False)
    beta = compute_beta_fp64(b[:n], round_to_input_dtype=round_beta)
    state = torch.zeros(1, HV, V, K, dtype=torch.float64, device=dev)
    return recurrence_fp64(state, q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None])[1][0]


def step(spans: list[tuple[str, int, int]], sequential: bool) -> float:
    """Rebuild one job per ``(start kind, start depth s, depth n)`` in one call; the worst rel error."""
    total = sum(n for _, _, n in spans)
    pool = RecordPool(kv_size=total + 1, capacity=total, device=dev)
    pool.sequential_tokens = DEFAULT_SEQUENTIAL_TOKENS
    kv = torch.randperm(total, device=dev, generator=gen)
    pool.assign(kv)
    inputs = []
    for ly in layers:
        x = torch.randn(total, D, device=dev, generator=gen).bfloat16()
        a = (0.5 * torch.randn(total, HV, device=dev, generator=gen)).bfloat16()
        b = torch.randn(total, HV, device=dev, generator=gen).bfloat16()
        pool.write(ly, backend, kv, x, a, b)
        inputs.append((x, a, b))
    pool.states = IntervalStates(kv_size=total + 1, capacity=len(spans) + 1, interval=64, device=dev)
    jobs, paths, slot = [], [], 0
    start = 0
    for j, (kind, s, n) in enumerate(spans):
        path = kv[start : start + n]
        rows = torch.arange(start, start + n, device=dev)
        paths.append(rows)
        start += n
        dst = torch.tensor([slot], device=dev)
        src = None
        if kind == "tree":  # an exact tree state at depth s (window = the 3 inputs before s)
            src = torch.tensor([slot + 1], device=dev)
            for ly, (x, a, b) in zip(layers, inputs):
                ssm[ly.layer_id][slot + 1] = oracle(ly, x[rows], a[rows], b[rows], s, True).float()
                win = torch.cat([torch.zeros(W - 1, D, device=dev).bfloat16(), x[rows][:s]])[-(W - 1):]
                conv[ly.layer_id][slot + 1] = win.T
            jobs.append(Rebuild(dst=dst, src=src, slots=pool.slots(path[s:n])))
        elif kind == "interval":  # a kept prefill state at depth s, its conv window from 3 lead records
            pool.states.owner[j] = path[s - 1]
            pool.states.state_of[path[s - 1]] = j
            for ly, (x, a, b) in zip(layers, inputs):
                kept = pool.states.ssm.setdefault(ly.layer_id, torch.zeros(len(spans) + 1, HV, V, K, device=dev))
                kept[j] = oracle(ly, x[rows], a[rows], b[rows], s, True).float()
            jobs.append(Rebuild(dst=dst, src=None, slots=pool.slots(path[s - (W - 1) : n]), state=j, lead=W - 1))
        else:  # from the root
            jobs.append(Rebuild(dst=dst, src=None, slots=pool.slots(path[:n])))
        slot += 2
    rebuild(pool, ReqPool(), jobs)
    torch.cuda.synchronize()
    worst = 0.0
    for job, rows, (kind, s, n) in zip(jobs, paths, spans):
        for ly, (x, a, b) in zip(layers, inputs):
            want = oracle(ly, x[rows], a[rows], b[rows], n, not sequential)
            got = ssm[ly.layer_id][job.dst[0]].double()
            rel = float((got - want).norm() / want.norm())
            worst = max(worst, rel)
            win = torch.cat([torch.zeros(W - 1, D, device=dev).bfloat16(), x[rows][:n]])[-(W - 1):]
            assert torch.equal(conv[ly.layer_id][job.dst[0]], win.T), (kind, s, n, ly.layer_id)
            assert torch.isfinite(got).all() and rel <= 1e-2, (kind, s, n, ly.layer_id, rel)
            print(f"  {'sequential' if sequential else 'chunk':10} {kind:8} s={s:3} n={n:3} layer {ly.layer_id}: "
                  f"state rel vs fp64 {rel:.2e}")
    return worst


short = [("root", 0, 1), ("root", 0, 5), ("tree", 40, 41), ("tree", 9, 41), ("interval", 64, 70), ("interval", 64, 96)]
long = [("root", 0, 3), ("root", 0, 200), ("tree", 37, 101), ("tree", 64, 130), ("interval", 128, 129), ("interval", 64, 319)]
assert max(n - s for _, s, n in short) <= DEFAULT_SEQUENTIAL_TOKENS < max(n - s for _, s, n in long)
w1 = step(short, sequential=True)
w2 = step(long, sequential=False)
print(f"OK: record_rebuild.rebuild on CUDA, sequential step worst {w1:.2e}, chunk step worst {w2:.2e}; "
      "conv windows bit-equal")
