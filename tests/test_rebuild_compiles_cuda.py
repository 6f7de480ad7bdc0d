"""After the startup warm-up's rebuild steps (``radix/records/warmup.py``), a rebuild step of any job count up to the
pool's most jobs and any span lengths compiles no Triton kernel (a compile is 0.1-0.3 s the scheduler waits): SGLang's
Triton conv and GDN chunk extend, as the stacked rebuild calls them, at Qwen3-Next's GDN head shape (CUDA only)."""

from __future__ import annotations

import gc
import types

import pytest
import torch

from sglang_replayssm.radix.records.fold_stack import conv_stacked, extend_stacked, stacked_states
from sglang_replayssm.radix.records.warmup import CHUNK_RECORDS, SEQUENTIAL_RECORDS, bucket_spans

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _variants() -> int:
    """Compiled variants held by every Triton JIT function of the process."""
    from triton.runtime.jit import JITFunction

    return sum(len(cache[0]) for f in gc.get_objects() if isinstance(f, JITFunction)
               for cache in f.device_caches.values())


def test_after_the_warm_up_steps_no_rebuild_step_compiles():
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    dev, gen = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(11)
    H, HV, K, V, L, SLOTS, R, W, MAX_JOBS = 16, 32, 128, 128, 4, 48, 4096, 4, 40
    dim = 2 * H * K + HV * V
    layers = [types.SimpleNamespace(
        layer_id=i, A_log=torch.log(0.02 + 0.2 * torch.rand(HV, device=dev, generator=gen)),
        dt_bias=-2.0 + 0.5 * torch.randn(HV, device=dev, generator=gen), q_dim=H * K, k_dim=H * K, v_dim=HV * V,
        num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V,
        conv_weights=torch.randn(dim, W, device=dev, generator=gen).bfloat16(), bias=None, activation="silu")
        for i in range(L)]
    backend = types.SimpleNamespace(kernel_dispatcher=TritonGDNKernel(),
                                    _prefill_gates=lambda lay, a, b: fused_gdn_gating(lay.A_log, a, b, lay.dt_bias))
    xs = torch.randn(L, R + 1, dim, device=dev, generator=gen).bfloat16()
    ab = torch.randn(2, L, R + 1, HV, device=dev, generator=gen).bfloat16()
    temporal = torch.zeros(L, SLOTS, HV, V, K, device=dev)
    conv = torch.zeros(L, SLOTS, dim, W - 1, device=dev).bfloat16()
    stack = stacked_states({lay.layer_id: types.SimpleNamespace(temporal=temporal[i], conv=[conv[i]])
                            for i, lay in enumerate(layers)})
    assert stack is not None and stack.conv is not None

    def step(lens: list[int], dst: list[int]) -> None:
        """One stacked rebuild step as ``rebuild`` runs it: the conv over every layer, then one extend."""
        n = sum(lens)
        slots = torch.randint(0, R, (n,), device=dev, generator=gen)
        d = torch.tensor(dst, dtype=torch.int32, device=dev)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        mixed = conv_stacked(layers, xs, stack.conv, stack.rows, slots, d, torch.zeros(len(lens), dtype=torch.bool,
                             device=dev), cu, lens)
        extend_stacked(backend, layers, mixed, None, ab[0][:, slots], ab[1][:, slots], stack, d, lens,
                       torch.zeros(len(lens), dtype=torch.int32, device=dev))

    # the warm-up's steps (all into slot 0, as into the padding slot)
    for lens in [[n] for n in (*CHUNK_RECORDS, SEQUENTIAL_RECORDS, 1)] + bucket_spans(max(MAX_JOBS, 33)):
        step(lens, [0] * len(lens))
    torch.cuda.synchronize()
    warmed = _variants()
    probes = [[1], [5, 300], [64] * 3, [7] * 16, [9, 130, 2] * 6, [8] * 20, [3] * 31 + [100], [70] * 40, [1] * 33]
    for lens in probes:
        step(lens, [1 + i % (SLOTS - 1) for i in range(len(lens))])
    torch.cuda.synchronize()
    assert _variants() == warmed
