"""The read copy wired into the decode ring (issue 15, deliverable 2) on SGLang 0.5.23's real pools
(CPU tensors, SGLang's unit-test kit through :class:`tests.support.simulate.Sim`).

* exactness: with ``SGLANG_REPLAYSSM_READ_COPY=bf16|fp8`` every slot's full state (checkpoint replayed
  over its pending records) equals the fp32 ring decode's (mode off) after every step, through
  copy-on-write hits, a CPU retraction backup + resume and a MIXED extend over pending records
  (rel <= 1e-6); with ``read_copy_exact_fold`` off the movers fold copy-based deltas and it fails;
  with a bf16 io dtype too, the records carved out of SGLang's ``replayssm_d`` (fix ``read_copy_d_ring``)
  or allocated (the fix off);
* stale refresh: after each writer of a checkpoint (alloc + prefill, copy-on-write, load_cpu_copy,
  extend fold) the next decode step reads a copy equal to ``quantize(checkpoint)``; fails with
  ``read_copy_refresh`` off;
* off is today's path (no buffers; the CPU hook's output bit-equal to ``ring_decode_torch``);
* the startup validator refuses in one line.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.read_copy_format import quantize
from sglang_replayssm.radix import config
from sglang_replayssm.radix.read_copy.store import read_copy_of, refusal
from sglang_replayssm.radix.ring.pool import ring_pool
from tests.support.simulate import Sim, SimConfig

EXACT = 1e-6
KINDS = pytest.mark.parametrize("kind", ["gdn", "kda"])
#: io dtype of the simulated model -> (its dtype, fix ``read_copy_d_ring``): fp32 io never carves the
#: records; bf16 io carves them out of SGLang's fp32 ``replayssm_d``, or allocates them with the fix off.
IO = {"fp32": (torch.float32, True), "bf16": (torch.bfloat16, True), "bf16-allocated": (torch.bfloat16, False)}


@pytest.fixture(scope="module", autouse=True)
def _adapter(radix_adapter):
    return radix_adapter


def _full_states(sim: Sim, slots: list[int]) -> torch.Tensor:
    """``[layers, n, HV, V, K]``: each slot's checkpoint with its pending records folded (the product fold)."""
    view = ring_pool(sim.mamba_pool)
    assert view is not None
    idx = torch.tensor(slots)
    folded = view.folded_temporal(idx)
    return view.temporal[:, idx].clone() if folded is None else folded


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def _scenario(kind: str, mode: str, strategy: str = "no_buffer", check: bool = False, io: str = "fp32",
              **fixes: bool) -> list[list[torch.Tensor]]:  # fmt: skip
    """One request lifecycle mix; the full state of every running slot after every step (with ``check``,
    also every radix node's and running slot's state against the fp64 oracle, :meth:`Sim.check`).
    ``io``: a key of :data:`IO`."""
    io_dtype, d_ring = IO[io]
    with config.override(True, read_copy_d_ring=d_ring, **fixes), config.override_read_copy(mode):
        sim = Sim(SimConfig(kind=kind, strategy=strategy, ring_len=4, head_dim=16, io_dtype=io_dtype))
        rc = read_copy_of(sim.mamba_pool)
        assert (rc is not None) == (mode != "off")
        assert rc is None or rc.records_carved == (io == "bf16")
        seen: list[list[torch.Tensor]] = []

        def step(reqs):
            sim.decode(reqs)
            live = [r for r in reqs if r in sim.running]
            seen.append([_full_states(sim, [int(r.req.kv.mamba_pool_idx)]) for r in live])
            if check:
                sim.check()

        a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5])
        for _ in range(6):
            step([a])
        b = sim.admit([1, 2, 3, 4, 5, 6, 7], [8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1])  # a prefix hit: copy-on-write
        for _ in range(3):
            step([a, b])
        sim.retract(a, backup=True)  # CPU backup of a slot with pending records, then resume
        sim.resume(a)
        for _ in range(2):
            step([a, b])
        sim.extend_running([(b, [3, 4])], mode="MIXED")  # an extend over pending records
        for _ in range(5):
            step([a, b])
        return seen


@KINDS
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
@pytest.mark.parametrize("strategy", ["no_buffer", "extra_buffer"])
@pytest.mark.parametrize("io", list(IO))
def test_states_equal_fp32_ring_decode_through_movers(kind, mode, strategy, io):
    ref = _scenario(kind, "off", strategy, io=io)
    got = _scenario(kind, mode, strategy, check=True, io=io)
    assert len(ref) == len(got) and all(len(x) == len(y) for x, y in zip(ref, got))
    worst = max(_rel(g, r) for gs, rs in zip(got, ref) for g, r in zip(gs, rs))
    assert worst <= EXACT, worst


@pytest.mark.parametrize("io", ["fp32", "bf16"])
def test_exact_fold_off_folds_copy_rounding(io):
    ref = _scenario("gdn", "off", io=io)
    got = _scenario("gdn", "fp8", read_copy_exact_fold=False, io=io)
    worst = max(_rel(g, r) for gs, rs in zip(got, ref) for g, r in zip(gs, rs))
    assert worst > 1e-4, worst


@KINDS
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_carved_records_change_no_output(kind, mode, monkeypatch):
    """The states above check only what the flush replays (``v``); the non-flush outputs also read ``d~``.
    With the records carved out of ``replayssm_d`` every decode output and state is bit-equal to the
    allocated records' (a carving that let ``d~`` and ``v`` overlap fails here)."""
    from sglang_replayssm.kernels import read_copy_ref

    outputs: list[torch.Tensor] = []
    decode = read_copy_ref.read_copy_decode_torch

    def recorded(*args, **kwargs):
        result = decode(*args, **kwargs)
        outputs.append(result[0].clone())
        return result

    monkeypatch.setattr(read_copy_ref, "read_copy_decode_torch", recorded)
    allocated = _scenario(kind, mode, io="bf16-allocated")
    out_allocated, outputs[:] = list(outputs), []
    carved = _scenario(kind, mode, io="bf16")
    assert len(outputs) == len(out_allocated) > 0
    assert all(torch.equal(x, y) for x, y in zip(outputs, out_allocated))
    assert all(torch.equal(g, r) for gs, rs in zip(carved, allocated) for g, r in zip(gs, rs))


def _copy_matches(sim: Sim, slot: int, mode: str) -> bool:
    rc = read_copy_of(sim.mamba_pool)
    assert rc is not None
    temporal = sim.mamba_pool.mamba_cache.temporal
    for li in range(temporal.shape[0]):
        q, sc = quantize(temporal[li, slot], mode, False)  # type: ignore[arg-type]
        if not torch.equal(rc.copy[li, slot].float(), q.float()):
            return False
        if sc is not None and not torch.equal(rc.scales[li, slot], sc):  # type: ignore[index]
            return False
    return True


@pytest.mark.parametrize("mover", ["alloc", "cow", "cpu_load", "extend"])
@pytest.mark.parametrize("refresh", [True, False], ids=["refresh-on", "refresh-off"])
def test_stale_copy_refreshed_after_each_mover(mover, refresh):
    """After a checkpoint write by ``mover``, the next (non-flush) step reads ``quantize(checkpoint)``."""
    mode = "bf16"
    with config.override(True, read_copy_refresh=refresh), config.override_read_copy(mode):
        # ring 8 and no track boundary (forced flush) before the checked step: it reads the copy
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_len=8, head_dim=16, track_interval=32))
        a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
        target = a
        if mover == "cow":
            for _ in range(2):
                sim.decode([a])
            target = sim.admit([1, 2, 3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2])
        elif mover == "cpu_load":
            for _ in range(3):
                sim.decode([a])
            sim.retract(a, backup=True)
            sim.resume(a)
        elif mover == "extend":
            for _ in range(3):
                sim.decode([a])
            sim.extend_running([(a, [4, 5])], mode="MIXED")
        slot = int(target.req.kv.mamba_pool_idx)
        assert int(sim.mamba_pool.replayssm_write_pos[slot]) == 0  # the next step reads the copy alone
        sim.decode([target])
        assert _copy_matches(sim, slot, mode) == refresh


def test_off_is_todays_path():
    from sglang_replayssm.cpu.decode import gdn_packed_decode
    from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch

    with config.override(True), config.override_read_copy("off"):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_len=4, head_dim=16))
        assert read_copy_of(sim.mamba_pool) is None
    gen = torch.Generator().manual_seed(3)
    H, HV, K, V, L, n = 1, 2, 16, 16, 4, 3
    qkv = torch.randn(n, 2 * H * K + HV * V, generator=gen)
    a, b = torch.randn(n, HV, generator=gen), torch.randn(n, HV, generator=gen)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    state = torch.randn(5, HV, V, K, generator=gen)
    rings = [torch.randn(5, HV, L, V, generator=gen), torch.randn(5, H, L, K, generator=gen),
             -torch.rand(5, HV, L, generator=gen)]  # fmt: skip
    idx, wp = torch.tensor([1, 2, 4]), torch.tensor([0, 2, 3], dtype=torch.int32)
    s1, r1 = state.clone(), [r.clone() for r in rings]
    got = gdn_packed_decode(None, None, qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=0.25, ssm_states=s1,
                            cache_indices=idx, num_v_heads=HV, head_v_dim=V, replayssm_d=r1[0], replayssm_k=r1[1],
                            replayssm_g=r1[2], replayssm_write_pos=wp)  # fmt: skip
    s2, r2 = state.clone(), [r.clone() for r in rings]
    out = qkv.new_empty(n, 1, HV, V)
    ring_decode_torch(qkv, a, b, A_log, dt_bias, 0.25, s2, *r2, out, idx, wp, None, use_qk_l2norm_in_kernel=True)
    assert torch.equal(got, out.transpose(0, 1)) and torch.equal(s1, s2)
    assert all(torch.equal(x, y) for x, y in zip(r1, r2))


def test_validator_refuses_in_one_line():
    ok = dict(ssm_dtype="float32", decode_ring=True, spec_ring=False, speculative=False)
    assert refusal("bf16", **ok) is None and refusal("off", **{**ok, "decode_ring": False}) is None
    assert refusal("bf16", **ok, decode_backend="triton") is None
    for bad in ({"ssm_dtype": "bfloat16"}, {"ssm_dtype": torch.bfloat16}, {"decode_ring": False},
                {"spec_ring": True}, {"speculative": True}, {"decode_backend": "helion"}):  # fmt: skip
        why = refusal("fp8", **{**ok, **bad})
        assert why is not None and "\n" not in why and "SGLANG_REPLAYSSM_READ_COPY=fp8" in why
    import os

    saved = os.environ.get(config.READ_COPY_ENV)
    os.environ[config.READ_COPY_ENV] = "fp4"
    try:
        config.reload()
        with pytest.raises(ValueError, match="expected one of off, bf16, fp8"):
            config.read_copy_mode()
    finally:
        if saved is None:
            os.environ.pop(config.READ_COPY_ENV)
        else:
            os.environ[config.READ_COPY_ENV] = saved
        config.reload()


def test_helion_decode_backend_refused_at_startup():
    """KDA's Helion decode runs SGLang's own ReplaySSM kernel on ``replayssm_d`` (kda_helion.py:83-102),
    never the copy's step: refused in one line; Triton (explicit or the default) is admitted."""
    from types import SimpleNamespace

    from sglang_replayssm.radix.admission import ReplaySSMArgsError
    from sglang_replayssm.radix.read_copy.startup import check_read_copy

    args = SimpleNamespace(enable_linear_replayssm=True, enable_linear_replayssm_spec=False, mamba_ssm_dtype=None,
                           speculative_algorithm=None, linear_attn_backend="triton", linear_attn_decode_backend=None)
    with config.override_read_copy("bf16"):
        check_read_copy(args)
        for field in ("linear_attn_decode_backend", "linear_attn_backend"):
            bad = SimpleNamespace(**{**vars(args), field: "helion"})
            with pytest.raises(ReplaySSMArgsError, match="Triton linear-attention decode backend only"):
                check_read_copy(bad)
    with config.override_read_copy("off"):
        check_read_copy(SimpleNamespace(**{**vars(args), "linear_attn_backend": "helion"}))


def test_non_fp32_pool_refused_at_attach():
    from sglang_replayssm.radix.read_copy.store import attach

    with config.override(True), config.override_read_copy("off"):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_len=4, head_dim=16))
    cache = sim.mamba_pool.mamba_cache
    object.__setattr__(cache, "temporal", cache.temporal.to(torch.bfloat16))
    with pytest.raises(ValueError, match="needs an fp32 checkpoint"):
        attach(sim.mamba_pool, "bf16", torch.float32)


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
@pytest.mark.parametrize("io", list(IO))
def test_budget_prices_what_attach_allocates(mode, io):
    """``budget`` charges per slot exactly the bytes ``attach`` allocates beside the ring (carved
    records are SGLang's ring, charged with it)."""
    from sglang_replayssm.radix.read_copy.store import bytes_per_slot
    from tests.support.simulate_fixture import cache_params

    io_dtype, d_ring = IO[io]
    with config.override(True, read_copy_d_ring=d_ring), config.override_read_copy(mode):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_len=4, head_dim=16, io_dtype=io_dtype))
        rc = read_copy_of(sim.mamba_pool)
        assert rc is not None and rc.fmt == mode and rc.v.dtype == io_dtype
        slots = sim.mamba_pool.mamba_cache.temporal.shape[1]
        params = cache_params(sim.cfg, sim.model, list(range(sim.cfg.mamba_layers)))
        assert rc.nbytes == slots * bytes_per_slot(params, 4, mode, rc.v.element_size())


def test_kda_safe_gate_with_a_read_copy_is_refused(monkeypatch):
    """SGLang's kernel would run the safe gate without the copy's records: one clear error, not a stale copy."""
    from sglang_replayssm.radix.ring import kernel_binding as kernel_binding

    calls = []
    monkeypatch.setattr(kernel_binding, "layer_of", lambda kernel, states: object())
    x = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="does not cover the KDA safe gate"):
        kernel_binding.ring_packed_decode(lambda *a, **k: calls.append(1), None, x, x, x, is_kda=True,
                                          ssm_states=x, lower_bound=-5.0)  # fmt: skip
    kernel_binding.ring_packed_decode(lambda *a, **k: calls.append(1), None, x, x, x, is_kda=True, ssm_states=x)
    assert calls == [1]  # no safe gate, CPU tensors: SGLang's method


def test_the_decode_kernel_reaches_its_pools_read_copy():
    """The packed-decode hooks find a layer's copy through the kernel SGLang calls: the backend's build links
    its decode kernel to its pool (``link_decode_kernel``), the pool's state holds the copy, the layer is the
    ``ssm_states`` view's place in the pool's checkpoints; no link, another tensor: no copy."""
    from types import SimpleNamespace

    from sglang_replayssm.radix.read_copy.store import layer_of
    from sglang_replayssm.radix.ring.hooks import link_decode_kernel

    with config.override(True), config.override_read_copy("bf16"):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_len=4, head_dim=16))
        rc = read_copy_of(sim.mamba_pool)
        kernel = SimpleNamespace()
        backend = SimpleNamespace(kernel_dispatcher=SimpleNamespace(decode_kernel=kernel),
                                  req_to_token_pool=SimpleNamespace(mamba_pool=sim.mamba_pool))  # fmt: skip
        assert rc is not None and layer_of(kernel, sim.mamba_pool.mamba_cache.temporal[0]) is None
        link_decode_kernel(None, backend)
    temporal = sim.mamba_pool.mamba_cache.temporal
    for li in range(temporal.shape[0]):
        layer = layer_of(kernel, temporal[li])
        assert layer is not None and layer.copy.is_set_to(rc.copy[li]) and layer.stale.is_set_to(rc.stale[li])
    assert layer_of(kernel, temporal[0].clone()) is None and layer_of(kernel, temporal[0, 1:]) is None
    assert layer_of(SimpleNamespace(), temporal[0]) is None and layer_of(None, temporal[0]) is None
    other = SimpleNamespace()
    link_decode_kernel(None, SimpleNamespace(kernel_dispatcher=SimpleNamespace(decode_kernel=other),
                                             req_to_token_pool=SimpleNamespace(mamba_pool=None)))  # fmt: skip
    assert layer_of(other, temporal[0]) is None  # no pool: never linked
