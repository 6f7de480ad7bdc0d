"""Every GDN layer's rebuild extend as one call over the pool's state stack (``radix/records/fold_stack.py``).

CPU: which layouts count as a stack. CUDA (skips without it): SGLang's Triton gates and chunk extend over the
stack give each layer's own calls' states bit for bit (Qwen3-Next shard GDN shapes, spans from 1 to 150
records, padding slots and other layers' slots untouched).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.radix.records.fold_stack import extend_stacked, stacked_states


def _caches(temporal: torch.Tensor, layer_ids: list[int]) -> dict[int, types.SimpleNamespace]:
    return {lid: types.SimpleNamespace(temporal=temporal[i]) for i, lid in enumerate(layer_ids)}


def test_rows_of_one_contiguous_stack_are_found_with_their_rows():
    temporal = torch.zeros(4, 6, 2, 3, 3)
    stack = stacked_states({7: types.SimpleNamespace(temporal=temporal[2]), 3: types.SimpleNamespace(temporal=temporal[0])})
    assert stack is not None and stack.rows == {7: 2, 3: 0} and stack.slots == 6
    assert stack.flat.shape == (24, 2, 3, 3) and stack.flat.data_ptr() == temporal.data_ptr()
    stack.flat[2 * 6 + 5].fill_(1.0)
    assert temporal[2, 5].eq(1.0).all() and temporal.sum() == 18


def test_layouts_that_are_not_one_stack_are_refused():
    own = {0: types.SimpleNamespace(temporal=torch.zeros(6, 2, 3, 3)), 1: types.SimpleNamespace(temporal=torch.zeros(6, 2, 3, 3))}
    assert stacked_states(own) is None  # one tensor per layer
    page_major = torch.zeros(6, 4, 2, 3, 3).transpose(0, 1)  # [L, slots, ...] viewed from slot-major storage
    assert stacked_states(_caches(page_major, [0, 1])) is None
    other = torch.zeros(4, 6, 2, 3, 3)
    assert stacked_states({0: types.SimpleNamespace(temporal=torch.zeros(4, 6, 2, 3, 3)[0]),
                           1: types.SimpleNamespace(temporal=other[1])}) is None  # rows of two stacks
    assert stacked_states({0: types.SimpleNamespace(temporal=other[0, :3])}) is None  # a part of a row
    assert stacked_states({}) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_stacked_extend_gives_every_layers_own_calls_bit_for_bit():
    from sglang.kernels.ops.attention.linear.fused_gdn_gating import fused_gdn_gating
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    dev, gen = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(3)
    H, HV, K, V, L, SLOTS = 16, 32, 128, 128, 4, 12
    layers = [types.SimpleNamespace(
        layer_id=10 + i, A_log=torch.log(0.02 + 0.2 * torch.rand(HV, device=dev, generator=gen)),
        dt_bias=-2.0 + 0.5 * torch.randn(HV, device=dev, generator=gen), q_dim=H * K, k_dim=H * K, v_dim=HV * V,
        num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=K, head_k_dim=K, head_v_dim=V) for i in range(L)]
    backend = types.SimpleNamespace(kernel_dispatcher=TritonGDNKernel(),
                                    _prefill_gates=lambda lay, a, b: fused_gdn_gating(lay.A_log, a, b, lay.dt_bias))
    lens = [1, 150, 37, 64]
    n = sum(lens)
    dst = torch.tensor([3, 7, 0, 11], dtype=torch.int32, device=dev)
    prefix = torch.tensor([1, 1, 0, 1], dtype=torch.int32, device=dev)
    mixed = [torch.randn(n, 2 * H * K + HV * V, device=dev, generator=gen).bfloat16() for _ in layers]
    a = torch.randn(L, n, HV, device=dev, generator=gen).bfloat16()
    b = torch.randn(L, n, HV, device=dev, generator=gen).bfloat16()
    start = 0.05 * torch.randn(L + 1, SLOTS, HV, V, K, device=dev, generator=gen)
    start[:, 0] = 0.0  # the span from the root starts from zeros
    rows = [3, 0, 2, 4]  # the layers' rows in the stack (row 1 is a layer without records)
    keep = torch.arange(5, 5 + n, device=dev)  # five lead rows before every layer's extended rows

    stacked = start.clone()
    caches = {lay.layer_id: types.SimpleNamespace(temporal=stacked[r]) for lay, r in zip(layers, rows)}
    stack = stacked_states(caches)
    assert stack is not None and [stack.rows[lay.layer_id] for lay in layers] == rows
    extend_stacked(backend, layers, [torch.cat([m[:5], m]) for m in mixed], keep, a, b, stack, dst, lens, prefix)

    own = start.clone()
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    for i, (lay, r) in enumerate(zip(layers, rows)):
        q, k, v = torch.split(mixed[i], [lay.q_dim, lay.k_dim, lay.v_dim], dim=-1)
        g, beta = backend._prefill_gates(lay, a[i], b[i])
        backend.kernel_dispatcher.extend(
            q=q.reshape(1, n, H, K), k=k.reshape(1, n, H, K), v=v.reshape(1, n, HV, V), g=g, beta=beta,
            ssm_states=own[r], cache_indices=dst, query_start_loc=cu)
    torch.cuda.synchronize()
    assert not torch.equal(own, start)  # the spans were folded
    assert torch.equal(stacked, own)  # every layer's slots as its own calls left them, the rest untouched


def test_a_gpu_gdn_backend_over_contiguous_pools_takes_the_stack(monkeypatch):
    """SGLang's GDN backend asks for contiguous prefill states (``requires_contiguous_prefill_state``); the
    rows of the pool's stacks are, so the stacked extend applies; GDN only."""
    import sglang.srt.utils

    from sglang_replayssm.radix.records import rebuild as rb

    monkeypatch.setattr(sglang.srt.utils, "is_cpu", lambda: False)
    temporal, conv = torch.zeros(3, 5, 2, 3, 3), torch.zeros(3, 5, 4, 3)
    caches = {i: types.SimpleNamespace(temporal=temporal[i], conv=[conv[i]]) for i in range(3)}
    backend = types.SimpleNamespace(requires_contiguous_prefill_state=True)
    pool = types.SimpleNamespace(layers={i: types.SimpleNamespace(kda=False, backend=backend) for i in range(3)})
    assert rb._stack_of(pool, caches) is not None
    pool.layers[1].kda = True
    assert rb._stack_of(pool, caches) is None
    pool.layers[1].kda = False
    caches[2].conv = [torch.zeros(5, 3, 4).transpose(1, 2)]  # a strided conv window: work copies, layer by layer
    assert rb._stack_of(pool, caches) is None


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the platform conv is CUDA's")),
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_the_stacked_conv_gives_every_layers_own_conv_bit_for_bit(device):
    """One depthwise conv over every layer's channels side by side: each layer's outputs and updated windows
    as its own call leaves them (SGLang's platform conv), with roots and resumed windows, other slots untouched."""
    from sglang.srt.layers.attention.linear import gdn_backend

    from sglang_replayssm.radix.records.fold_stack import conv_stacked

    dev, gen = torch.device(device), torch.Generator(device=device).manual_seed(5)
    L, R, DIM, W, SLOTS = 3, 40, 64, 4, 9
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layers = [types.SimpleNamespace(layer_id=20 + i, conv_weights=torch.randn(DIM, W, device=dev, generator=gen).to(dtype),
                                    bias=None, activation="silu") for i in range(L)]
    xs = torch.randn(L, R + 1, DIM, device=dev, generator=gen).to(dtype)
    conv = torch.randn(L + 1, SLOTS, DIM, W - 1, device=dev, generator=gen).to(dtype)
    rows = {20: 2, 21: 0, 22: 3}  # row 1: a layer without records
    lens = [5, 17, 1]
    slots = torch.randperm(R, device=dev, generator=gen)[:sum(lens)]
    dst = torch.tensor([4, 8, 1], dtype=torch.int32, device=dev)
    init = torch.tensor([True, False, True], device=dev)
    cu = torch.tensor([0, 5, 22, 23], dtype=torch.int32, device=dev)

    stacked = conv.clone()
    out = conv_stacked(layers, xs, stacked, rows, slots, dst, init, cu, lens)
    own, outs = conv.clone(), []
    for i, lay in enumerate(layers):
        x = xs[i][slots]
        outs.append(gdn_backend.causal_conv1d_fn(
            x.transpose(0, 1), lay.conv_weights, None, activation="silu", conv_states=own[rows[lay.layer_id]],
            has_initial_state=init, cache_indices=dst, query_start_loc=cu, seq_lens_cpu=lens).transpose(0, 1)[:x.shape[0]])
    assert torch.equal(out, torch.cat(outs))
    assert not torch.equal(own, conv) and torch.equal(stacked, own)


def test_the_stacked_conv_compiles_one_variant_for_any_count_of_jobs_up_to_its_bucket(monkeypatch):
    """SGLang's Triton conv compiles a variant per row count of ``conv_states`` (a constexpr): the stacked conv's
    work windows come in buckets (:func:`work_rows`), so 1 to 16 jobs in a step give the conv one row count; the
    windows it leaves are the jobs' own (the bit-for-bit test above checks them against each layer's conv)."""
    from sglang.srt.layers.attention.linear import gdn_backend

    from sglang_replayssm.radix.records.fold_stack import CONV_WORK_ROWS, conv_stacked, work_rows

    assert [work_rows(n) for n in (0, 1, 16, 17, 32, 33, 100)] == [16, 16, 16, 32, 32, 64, 128]
    seen: list[int] = []
    real = gdn_backend.causal_conv1d_fn

    def spy(*args, **kwargs):
        seen.append(int(kwargs["conv_states"].shape[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(gdn_backend, "causal_conv1d_fn", spy)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the platform's conv: CUDA's where there is one
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(7)
    L, R, DIM, W, SLOTS = 2, 64, 32, 4, 20

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, generator=gen).to(dtype)

    layers = [types.SimpleNamespace(layer_id=i, conv_weights=randn(DIM, W), bias=None, activation="silu")
              for i in range(L)]
    xs = randn(L, R + 1, DIM)
    for jobs in (1, 3, 16):
        conv = randn(L, SLOTS, DIM, W - 1)
        before = conv.clone()
        lens = [2] * jobs
        dst = torch.arange(1, jobs + 1, dtype=torch.int32, device=dev)
        init = torch.ones(jobs, dtype=torch.bool, device=dev)
        cu = torch.arange(0, 2 * jobs + 1, 2, dtype=torch.int32, device=dev)
        conv_stacked(layers, xs, conv, {0: 0, 1: 1}, torch.arange(2 * jobs, device=dev), dst, init, cu, lens)
        untouched = torch.tensor([s for s in range(SLOTS) if s not in dst.tolist()], device=dev)
        assert torch.equal(conv[:, untouched], before[:, untouched]) and not torch.equal(conv, before)
    assert seen == [CONV_WORK_ROWS] * 3


def test_the_layers_rows_reach_the_device_once():
    """The stacked fold's layout lists (each layer's row in the stacks: the same at every rebuild) are copied to the
    device once and reused; other values or dtypes get their own tensor."""
    from sglang_replayssm.radix.records import fold_stack

    dev = torch.device("cpu")
    first = fold_stack._layout([2, 0, 1], torch.int64, dev)
    assert first.tolist() == [2, 0, 1] and fold_stack._layout([2, 0, 1], torch.int64, dev) is first
    assert fold_stack._layout([2, 0, 1], torch.int32, dev) is not first
    assert fold_stack._layout([0, 1, 2], torch.int64, dev).tolist() == [0, 1, 2]
