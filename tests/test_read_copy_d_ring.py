"""The read copy's ``d~`` / ``v`` records carved out of SGLang's dead ``replayssm_d`` (fix
``read_copy_d_ring``, radix/read_copy/store.py) on SGLang 0.5.23's real pools (CPU, the Sim's kit pools with a
bf16 io dtype and fp32 states):

* on: ``rc.d`` / ``rc.v`` are disjoint views inside ``replayssm_d`` (per slot ``[2, HV, L, V]`` of bf16,
  slot stride ``2 * HV * L * V``, contiguous within a slot, 16-byte aligned), writes through them land in
  SGLang's ring bytes, and the read copy's own bytes drop by exactly the records' (``replayssm_d.nbytes``);
  off: separate allocations. fp32 io never carves (a slot's fp32 ring holds half of two fp32 records).
* the carved per-layer views pass the CUDA wrapper's layout checks (``check_fused_layout``,
  ``check_read_copy_args``) and the strides it hands ``read_copy.cu``, whose addressing is
  ``slot * s_v + (hv * L + m) * V + sigma``;
* the budget's per-slot charge drops by the records (SGLang's auto-fit sizing then admits more slots:
  tests/test_radix_budget.py).

Exactness with carved views (states through the movers, outputs bit-equal to allocated records):
tests/test_read_copy_wiring.py.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.read_copy.store import bytes_per_slot, read_copy_of
from tests.support.simulate import Sim, SimConfig
from tests.support.simulate_fixture import cache_params
from tests.support.simulate_model import ToyModel

ON_OFF = pytest.mark.parametrize("d_ring", [True, False], ids=["d_ring-on", "d_ring-off"])


@pytest.fixture(scope="module", autouse=True)
def _adapter(radix_adapter):
    return radix_adapter


def _sim(mode: str, d_ring: bool, io_dtype: torch.dtype = torch.bfloat16, kind: str = "gdn") -> Sim:
    with config.override(True, read_copy_d_ring=d_ring), config.override_read_copy(mode):
        return Sim(SimConfig(kind=kind, strategy="no_buffer", ring_len=4, head_dim=16, io_dtype=io_dtype))


def _span(t: torch.Tensor) -> tuple[int, int]:
    """``[first byte, one past the last byte)`` a (strided) tensor can address."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _inside(inner: tuple[int, int], outer: tuple[int, int]) -> bool:
    return outer[0] <= inner[0] and inner[1] <= outer[1]


def _disjoint(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[1] <= b[0] or b[1] <= a[0]


@ON_OFF
@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_records_alias_replayssm_d(d_ring, kind, mode):
    sim = _sim(mode, d_ring, kind=kind)
    rc = read_copy_of(sim.mamba_pool)
    ring = sim.mamba_pool.mamba_cache.replayssm_d
    assert rc is not None and ring.dtype == torch.float32 and rc.d.dtype == rc.v.dtype == torch.bfloat16
    layers, slots, hv, L, V = ring.shape
    assert rc.d.shape == rc.v.shape == ring.shape
    assert rc.records_carved == d_ring
    assert _disjoint(_span(rc.d), _span(rc.v)) or d_ring  # carved: interleaved per slot, checked below
    assert _inside(_span(rc.d), _span(ring)) == d_ring and _inside(_span(rc.v), _span(ring)) == d_ring
    if not d_ring:
        assert _disjoint(_span(rc.d), _span(ring)) and _disjoint(_span(rc.v), _span(ring))
        return
    assert rc.d.stride() == rc.v.stride() == (slots * 2 * hv * L * V, 2 * hv * L * V, L * V, V, 1)
    assert rc.v.data_ptr() - rc.d.data_ptr() == hv * L * V * 2 and rc.v.data_ptr() % 16 == 0
    # every (layer, slot): d~ the first half of SGLang's slot bytes, v the second; no overlap
    rc.d[1, 3].fill_(1.5)
    rc.v[1, 3].fill_(-2.0)
    raw = ring[1, 3].view(torch.bfloat16).reshape(2, hv, L, V)
    assert bool((raw[0] == 1.5).all()) and bool((raw[1] == -2.0).all())
    assert bool((rc.d[1, 3] == 1.5).all()) and bool((rc.v[1, 3] == -2.0).all())
    assert int(torch.count_nonzero(ring)) == ring[1, 3].numel()  # nothing outside that slot was touched


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_carving_drops_the_records_bytes(mode):
    on, off = (read_copy_of(_sim(mode, d_ring).mamba_pool) for d_ring in (True, False))
    assert on is not None and off is not None and on.records_carved and not off.records_carved
    ring = _sim("off", True).mamba_pool.mamba_cache.replayssm_d
    assert off.records_nbytes == ring.nbytes  # the records are exactly SGLang's fp32 ring's bytes
    assert on.nbytes == off.nbytes - off.records_nbytes


def test_fp32_io_allocates_the_records():
    rc = read_copy_of(_sim("bf16", True, io_dtype=torch.float32).mamba_pool)
    assert rc is not None and not rc.records_carved and rc.d.dtype == torch.float32 and rc.d.is_contiguous()


def test_carved_views_pass_the_cuda_layout_checks():
    """What ``read_copy_decode_cuda`` checks before it launches, on one carved layer (CPU tensors), and
    the slot strides it passes: ``read_copy.cu`` addresses ``d`` / ``v`` as ``slot * s + (hv * L + m) * V + sigma``."""
    from sglang_replayssm.kernels.read_copy_ref import check_read_copy_args
    from sglang_replayssm.kernels.ring_decode_args import (
        check_fused_layout,
        check_ring_decode_args,
        prepare_step,
    )

    sim = _sim("bf16", True)
    rc = read_copy_of(sim.mamba_pool)
    assert rc is not None and rc.records_carved
    layer = rc.layer(1)
    cache = sim.mamba_pool.mamba_cache
    state, k_ring, g_ring = cache.temporal[1], cache.replayssm_k[1], cache.replayssm_g[1]
    slots, HV, V, K = state.shape
    H, L = k_ring.shape[1], k_ring.shape[2]
    B = 3
    bf = torch.bfloat16
    qkv = torch.zeros(B, 2 * H * K + HV * V, dtype=bf)
    a, b = torch.zeros(B, HV, dtype=bf), torch.zeros(B, HV, dtype=bf)
    A_log, dt_bias = torch.zeros(HV), torch.zeros(HV)
    out = torch.empty(B, 1, HV, V, dtype=bf)
    idx, wp = torch.tensor([1, 2, 5]), torch.zeros(B, dtype=torch.int32)
    shape = check_ring_decode_args(qkv, a, b, A_log, dt_bias, state, layer.d, k_ring, g_ring, out, idx, wp, None, False)
    check_read_copy_args(layer.copy, layer.scales, layer.v, layer.beta, state, shape.L, False)
    check_fused_layout(shape, qkv, a, b, dt_bias, state, layer.d, k_ring, g_ring, out, False)
    step = prepare_step(shape, qkv, a, b, A_log, dt_bias, 0.25, state, layer.d, k_ring, g_ring, out, idx, wp, None,
                        True, False)  # fmt: skip
    s_d = step.strides[4]
    assert s_d == layer.v.stride(0) == 2 * HV * L * V and layer.d[0].is_contiguous() and layer.v[0].is_contiguous()
    for t in (layer.d, layer.v):
        for slot, hv, m, sigma in ((0, 0, 0, 0), (slots - 1, HV - 1, L - 1, V - 1), (4, 1, 2, 7)):
            assert t[slot, hv, m, sigma].data_ptr() == t.data_ptr() + 2 * (slot * s_d + (hv * L + m) * V + sigma)


def _params(io_dtype: torch.dtype, ring_len: int = 16):
    cfg = SimConfig(kind="gdn", ring_len=ring_len, io_dtype=io_dtype)
    return cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers)))


def test_bytes_per_slot_leave_out_carved_records():
    params = _params(torch.bfloat16)
    hv, v_dim, _ = params.shape.temporal
    records = 2 * hv * 16 * v_dim * 2 * len(params.layers)
    for mode in ("bf16", "fp8"):
        with config.override(True, read_copy_d_ring=True):
            on = bytes_per_slot(params, 16, mode, 2)
        with config.override(True, read_copy_d_ring=False):
            off = bytes_per_slot(params, 16, mode, 2)
        assert off - on == records
    with config.override(True, read_copy_d_ring=True):  # fp32 io: nothing to carve
        assert bytes_per_slot(_params(torch.float32), 16, "bf16", 4) > bytes_per_slot(params, 16, "bf16", 2)


def _same_runs(got, ref) -> bool:
    return torch.equal(got.out, ref.out) and len(got.flushed) == len(ref.flushed) > 0 and all(
        (t, r) == (t2, r2) and torch.equal(c, c2) for (t, r, c), (t2, r2, c2) in zip(got.flushed, ref.flushed))


@pytest.mark.parametrize("is_kda", [False, True])
@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_torch_step_on_carved_records_equals_dense(fmt, is_kda):
    """The torch read-copy step (the CPU decode) over staggered cursors and forced flushes, NaN in every
    record not yet written: ``d~`` / ``v`` as the two halves of one fp32 ring's slots give bit-equal outputs
    and flushed checkpoints to dense rings."""
    from tests.support.read_copy_bench_drift import make_inputs, run_copy

    H, HV, L = (2, 2, 4) if is_kda else (1, 2, 4)
    inp = make_inputs(2 * L + 3, 6, H, HV, 16, 16, is_kda, seed=3)
    dense = run_copy(inp, fmt, L, d_dtype=torch.bfloat16)  # type: ignore[arg-type]
    carved = run_copy(inp, fmt, L, d_dtype=torch.bfloat16, records_in_ring=True)  # type: ignore[arg-type]
    assert _same_runs(carved, dense)
