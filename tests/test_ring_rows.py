"""Decode rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``, radix/ring/rows.py), on SGLang's real
pools: the ring has one row per request row, a slot reads its records at its request's row, every kernel and
fold with a row map equals the slot-keyed one, the budget charges the rows, and what rows do not cover is
refused in one line. The random request streams (copies, finishes, evictions, retraction, HiCache, records)
run in tests/test_radix_property.py (``-ring-rows`` configurations)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.kernels.materialize import materialize
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.admission import ReplaySSMArgsError
from sglang_replayssm.radix.ring import rows
from sglang_replayssm.radix.ring.alloc_reset import linked_write_pos
from sglang_replayssm.radix.ring.pool import ring_pool
from sglang_replayssm.settings import RING_ROWS
from tests.support.simulate import Sim, SimConfig


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed():
    hooks.install()


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_the_pool_holds_one_ring_per_request_row_and_maps_each_slot_to_its_row(kind):
    with config.override(True):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", ring_rows=True, mamba_slots=24, max_reqs=5))
        pool, req_pool = sim.mamba_pool, sim.req_pool
        cache = pool.mamba_cache
        n_rows, slots = req_pool.req_to_token.shape[0], pool.size + 1
        assert n_rows == 6 and slots == 25
        assert cache.replayssm_d.shape[1] == cache.replayssm_k.shape[1] == cache.replayssm_g.shape[1] == n_rows
        assert cache.replayssm_g.dim() == (5 if kind == "kda" else 4)
        assert pool.replayssm_write_pos.shape == (slots,) and pool.enable_linear_replayssm
        # The allocator's cursor link runs after the rows are allocated (the cursor choke point holds).
        assert linked_write_pos(req_pool.mamba_allocator) is pool.replayssm_write_pos
        view = ring_pool(pool)
        assert view is not None and view.rows is not None and view.rows.shape == (slots,)
        a = sim.admit([1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7])
        b = sim.admit([5, 4, 3], [1, 2, 3, 4, 5, 6, 7])
        for sreq in (a, b):
            slot, row = int(sreq.req.kv.mamba_pool_idx), int(sreq.req.kv.req_pool_idx)
            assert int(view.rows[slot]) == row
        sim.decode()
        sim.decode()
        sim.check()
        # Records land at the request's ring row, never at the slot's index.
        slot, row = int(a.req.kv.mamba_pool_idx), int(a.req.kv.req_pool_idx)
        assert int(pool.replayssm_write_pos[slot]) > 0
        assert bool(cache.replayssm_g[:, row].ne(0).any())


def test_without_the_setting_the_pool_keeps_a_ring_per_slot_and_says_what_rows_would_take(caplog):
    with config.override(True), caplog.at_level(logging.INFO):
        sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", ring_rows=False))
        cache = sim.mamba_pool.mamba_cache
        assert cache.replayssm_d.shape[1] == sim.mamba_pool.size + 1
        assert ring_pool(sim.mamba_pool).rows is None  # type: ignore[union-attr]
    rings = [cache.replayssm_d, cache.replayssm_k, cache.replayssm_g]
    per_slot = sum(t.numel() * t.element_size() for t in rings)
    rows = sim.req_pool.req_to_token.shape[0]
    line = next(r.getMessage() for r in caplog.records if "rings per request row would take" in r.getMessage())
    assert f"{per_slot / 2**20:.2f} MiB" in line and f"{per_slot / rings[0].shape[1] * rows / 2**20:.2f} MiB" in line


def _decode_args(kind: str, B: int, slots: int, n_rows: int, L: int = 4, seed: int = 0, dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    H, HV, K, V = (1, 2, dim, dim) if kind == "gdn" else (2, 2, dim, dim)
    kda = kind == "kda"
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    args = dict(
        mixed_qkv=r(B, 2 * H * K + HV * V), a=r(B, HV, K) if kda else r(B, HV), b=r(B, HV), A_log=r(HV),
        dt_bias=r(HV, K) if kda else r(HV), scale=K**-0.5, initial_state=r(slots, HV, V, K),
        d_cache=r(n_rows, HV, L, V), k_cache=r(n_rows, H, L, K),
        g_cache=-r(n_rows, HV, L, K).abs() if kda else -r(n_rows, HV, L).abs(),
    )  # fmt: skip
    return args


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_ring_decode_with_a_row_map_equals_the_slot_keyed_decode(kind):
    """Rows [flush, non-flush, padding, non-flush]: the row-keyed ring (rows permuted) gives the same output,
    checkpoint and written records as the ring keyed by slot."""
    slots, n_rows, L = 7, 4, 4
    slot_of = torch.tensor([5, 2, -1, 3])
    row_of_slot = torch.zeros(slots, dtype=torch.int32)
    row_of_slot[torch.tensor([5, 2, 3])] = torch.tensor([1, 3, 2], dtype=torch.int32)
    args = _decode_args(kind, 4, slots, n_rows, L)
    by_slot = {**args, "d_cache": torch.zeros(slots, *args["d_cache"].shape[1:]),
               "k_cache": torch.zeros(slots, *args["k_cache"].shape[1:]),
               "g_cache": torch.zeros(slots, *args["g_cache"].shape[1:])}  # fmt: skip
    for s in (5, 2, 3):
        for name in ("d_cache", "k_cache", "g_cache"):
            by_slot[name][s] = args[name][int(row_of_slot[s])]
    by_row = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    write_pos = torch.tensor([L - 1, 1, 0, 2], dtype=torch.int32)
    outs = []
    for kw, ring_map in ((by_slot, None), (by_row, row_of_slot)):
        out = torch.empty(4, 1, 2, 8)
        ring_decode_torch(**kw, out=out, ssm_state_indices=slot_of, write_pos=write_pos, force_flush=None,
                          use_qk_l2norm_in_kernel=True, is_kda=kind == "kda", ring_map=ring_map)  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(by_slot["initial_state"], by_row["initial_state"])
    for s in (2, 3):  # the non-flush rows wrote their record at their ring row
        for name in ("d_cache", "k_cache", "g_cache"):
            assert torch.equal(by_slot[name][s], by_row[name][int(row_of_slot[s])])
    bad = row_of_slot.clone()
    bad[3] = bad[2]  # two live slots on one ring row: they would race
    with pytest.raises(ValueError, match="ring row appears in two valid rows"):
        ring_decode_torch(**by_row, out=torch.empty(4, 1, 2, 8), ssm_state_indices=slot_of, write_pos=write_pos,
                          is_kda=kind == "kda", ring_map=bad)  # fmt: skip


def _row_pool(kind: str, head_dim: int, seed: int, layers: int = 2, slots: int = 6, n_rows: int = 3, HV: int = 2,
              L: int = 4) -> tuple[torch.Tensor, ...]:
    """``(temporal [layers, slots, ...], d, k, g [layers, n_rows, ...])``: checkpoints per slot, rings per row."""
    g = torch.Generator().manual_seed(seed)
    K = V = head_dim
    temporal = torch.randn(layers, slots, HV, V, K, generator=g)
    d = torch.randn(layers, n_rows, HV, L, V, generator=g)
    k = torch.randn(layers, n_rows, 1, L, K, generator=g)
    gate = -torch.rand((layers, n_rows, HV, L, K) if kind == "kda" else (layers, n_rows, HV, L), generator=g)
    return temporal, d, k, gate


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_materialize_reads_each_rows_records_at_its_ring_row(kind):
    layers, slots = 2, 6
    temporal, d, k, gate = _row_pool(kind, 4, seed=1)
    src, dst, cnt, ring = (torch.tensor(x) for x in ([4, 1, 2], [5, 1, 3], [3, 2, 0], [2, 0, 1]))
    want = temporal.clone()
    by_slot = [torch.zeros(layers, slots, *t.shape[2:]) for t in (d, k, gate)]
    for s, r in zip(src.tolist(), ring.tolist()):
        for full, rows_t in zip(by_slot, (d, k, gate)):
            full[:, s] = rows_t[:, r]
    materialize(want, *by_slot, src, dst, cnt, is_kda=kind == "kda")
    got = temporal.clone()
    materialize(got, d, k, gate, src, dst, cnt, is_kda=kind == "kda", ring_src=ring)
    assert torch.equal(got, want) and not torch.equal(got, temporal)
    with pytest.raises(ValueError, match="ring row 3 outside"):
        materialize(temporal.clone(), d, k, gate, src, dst, cnt, is_kda=kind == "kda", ring_src=torch.tensor([3, 0, 1]))


def _server_args(**kw):
    base = dict(enable_linear_replayssm=True, disaggregation_mode="null", speculative_algorithm=None,
                enable_linear_replayssm_spec=False, linear_attn_decode_backend=None,
                linear_attn_backend="triton")  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(("change", "env", "fix_off", "match"), [
    ({"linear_attn_decode_backend": "helion"}, {}, None, "Triton linear-attention decode backend only"),
    ({}, {"SGLANG_REPLAYSSM_READ_COPY": "bf16"}, None, "SGLANG_REPLAYSSM_READ_COPY"),
    ({}, {}, "retract_backup", "needs the fixes retract_backup"),
])  # fmt: skip
def test_what_rows_do_not_cover_is_refused_in_one_line(monkeypatch, change, env, fix_off, match):
    monkeypatch.setenv(RING_ROWS.name, "on")
    with config.override(True):
        rows.check_args(_server_args())  # the plain case is admitted
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with config.override(True, **({fix_off: False} if fix_off else {})):
        with pytest.raises(ReplaySSMArgsError, match=match) as err:
            rows.check_args(_server_args(**change))
        assert "\n" not in str(err.value) and "SGLANG_REPLAYSSM_RING_ROWS=on" in str(err.value)
        monkeypatch.setenv(RING_ROWS.name, "off")
        rows.check_args(_server_args(**change))  # off: nothing to refuse


@pytest.mark.parametrize("change", [{"disaggregation_mode": "decode"}, {"speculative_algorithm": "NEXTN"},
                                    {"speculative_algorithm": "EAGLE", "disaggregation_mode": "decode"}])
def test_a_pd_decode_server_and_speculative_decoding_take_rows(monkeypatch, caplog, change):
    """Covered (tests/test_pd_decode_ring.py builds the decode pool with rows; tests/test_ring_rows_server.py
    serves NEXTN with them): ``on`` is admitted, ``auto`` resolves to rows without a line."""
    monkeypatch.setenv(RING_ROWS.name, "on")
    with config.override(True), caplog.at_level("WARNING"):
        rows.check_args(_server_args(**change))
        monkeypatch.setenv(RING_ROWS.name, "auto")
        rows.check_args(_server_args(**change))
    assert RING_ROWS.value() == "auto:on" and rows.rows_on() and not caplog.records


@pytest.mark.parametrize(("change", "env", "fix_off"), [
    ({"linear_attn_decode_backend": "helion"}, {}, None),
    ({}, {"SGLANG_REPLAYSSM_READ_COPY": "fp8"}, None),
    ({}, {}, "cursor_reset"),
])  # fmt: skip
def test_auto_takes_rows_where_covered_and_a_ring_per_slot_with_one_line_elsewhere(
        monkeypatch, caplog, change, env, fix_off):
    monkeypatch.setenv(RING_ROWS.name, "auto")
    assert not rows.rows_on()  # unresolved: a ring per slot
    with config.override(True):
        rows.check_args(_server_args())
    assert RING_ROWS.value() == "auto:on" and rows.rows_on() and not caplog.records
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with config.override(True, **({fix_off: False} if fix_off else {})), caplog.at_level("WARNING"):
        rows.check_args(_server_args(**change))  # never refused
    assert RING_ROWS.value() == "auto:off" and not rows.rows_on()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "per mamba slot" in line and "RING_ROWS=auto" in line and "\n" not in line
    monkeypatch.setenv(RING_ROWS.name, "auto")
    rows.check_args(_server_args(enable_linear_replayssm=False))
    assert RING_ROWS.value() == "auto"  # without the decode ring nothing is resolved


@pytest.mark.parametrize(("hf", "gated"), [
    ({"kda_safe_gate": True}, True),
    ({"linear_attn_config": {"kda_layers": [1], "gate_lower_bound": -5.0}}, True),
    ({"linear_attn_config": {"kda_layers": [1]}}, False),
    ({}, False),
])  # fmt: skip
def test_the_kda_safe_gate_is_refused_with_on_and_falls_back_with_auto(monkeypatch, hf, gated):
    from sglang.srt.arg_groups import overrides

    monkeypatch.setattr(overrides, "model_config_of", lambda args: SimpleNamespace(hf_config=SimpleNamespace(**hf)))
    monkeypatch.setenv(RING_ROWS.name, "on")
    with config.override(True):
        if gated:
            with pytest.raises(ReplaySSMArgsError, match="KDA safe gate"):
                rows.check_args(_server_args())
        else:
            rows.check_args(_server_args())
        monkeypatch.setenv(RING_ROWS.name, "auto")
        rows.check_args(_server_args())
    assert RING_ROWS.value() == ("auto:off" if gated else "auto:on")


def test_the_setting_reads_auto_and_the_flag_words(monkeypatch):
    for text, value in (("auto", "auto"), ("AUTO", "auto"), ("auto:on", "auto:on"), ("1", "on"), ("on", "on"),
                        ("no", "off"), ("", RING_ROWS.default)):
        monkeypatch.setenv(RING_ROWS.name, text)
        assert RING_ROWS.value() == value
    monkeypatch.setenv(RING_ROWS.name, "sometimes")
    with pytest.raises(ValueError, match="expected auto or one of"):
        RING_ROWS.value()


def test_the_pool_refuses_the_spec_ring_before_allocating(monkeypatch):
    monkeypatch.setenv(RING_ROWS.name, "on")
    called = []
    with pytest.raises(ValueError, match="--enable-linear-replayssm-spec"):
        rows.rows_pool(lambda *a, **k: called.append(1), None, enable_linear_replayssm=True,
                       enable_linear_replayssm_spec=True)  # fmt: skip
    assert not called
    rows.rows_pool(lambda *a, **k: called.append(1), None, enable_linear_replayssm=False)
    assert called == [1]  # no decode ring asked for: SGLang's pool as it is


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("explicit_size", [None, 100], ids=["auto-fit", "max-mamba-cache-size"])
def test_the_budget_charges_one_ring_per_request_row(monkeypatch, kind, explicit_size):
    """Each slot pays ``ceil(ring / ratio)`` + its cursor and map entry, the padding row comes out of the rest:
    the rows SGLang can then allocate (``max_mamba_cache_size // ratio + 1``) fit what was charged, and more
    slots fit than with a ring per slot."""
    from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot, ring_row_bytes
    from tests.test_radix_budget import GIB, _pool_bytes_per_slot, _publish, _sizing

    ring_len, rest_gib = 16, 0.02
    params, per_slot, _ = _pool_bytes_per_slot(kind, ring_len)
    sizes, lefts = [], []
    for on in ("off", "on"):
        monkeypatch.setenv(RING_ROWS.name, on)
        schedule = _publish(enable_linear_replayssm=True, linear_replayssm_cache_len=ring_len,
                            max_mamba_cache_size=explicit_size)  # fmt: skip
        sizing = _sizing(params, kda=kind == "kda")
        with config.override(True, record_hits=False):
            lefts.append(sizing._handle_max_mamba_cache(rest_gib))
            ratio = sizing._calculate_mamba_ratio()
        sizes.append(schedule.max_mamba_cache_size)
    row = ring_row_bytes(params, ring_len)
    priced = params.mamba_cache_per_req + -(-row // ratio) + 8
    size = sizes[1]
    if explicit_size is None:
        assert sizes[1] > sizes[0]  # the ring bytes of slots that never decode went to more slots
        budget = rest_gib * schedule.mamba_full_memory_ratio / (1 + schedule.mamba_full_memory_ratio) * GIB
        real = (size + 1) * (params.mamba_cache_per_req + 8) + (size // ratio + 1) * row
        assert real <= budget + row  # the padding row is the one charged to the rest
    assert lefts[1] == pytest.approx(rest_gib - (size + 1) * priced / GIB - row / GIB, rel=1e-12)
    assert decode_ring_bytes_per_slot(params, ring_len) == row + 4


_TRITON_CONFIGS = {
    "regs": dict(block_v=4, v_split=2, num_warps=1, prefetch=2, split=False),
    "split": dict(block_v=8, v_split=1, num_warps=1, prefetch=1, split=True, row_major=True),
    "slices": dict(block_v=8, v_split=1, num_warps=1, prefetch=1, split=True, engine="slices", slice_k=8,
                   flush_block_v=8, row_major=True),
}  # fmt: skip


@pytest.mark.interpret
@pytest.mark.parametrize("engine", list(_TRITON_CONFIGS))
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_triton_ring_decode_with_a_row_map_equals_the_reference(kind, engine):
    """sglang-replayssm's Triton engines (interpreted on CPU, compiled on CUDA) read and write a slot's records at
    its ring row: output, checkpoint and rings equal the torch reference with the same map."""
    from sglang_replayssm.kernels.ring_decode import RingDecodeConfig

    _check_mapped_decode(kind, RingDecodeConfig(**_TRITON_CONFIGS[engine]), dim=8)


#: the CUDA launch pick_config takes at serving batch sizes, forced at the test's 4 rows: one launch (its default
#: register budget), and the two passes on two streams
_CUDA_CONFIGS = {
    "fused": dict(block_v=8, v_split=1, num_warps=1, prefetch=1, split=True, engine="cuda", cuda_warps=2,
                  cuda_stages=3, cuda_flush_stages=3, cuda_flush_waves=1, cuda_tail=4, cuda_overlap=True, cuda_fused=3),
    "two-pass": dict(block_v=8, v_split=1, num_warps=1, prefetch=1, split=True, engine="cuda", cuda_warps=2,
                     cuda_stages=3, cuda_flush_stages=3, cuda_flush_waves=1, cuda_tail=4, cuda_overlap=True),
}  # fmt: skip


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA passes need a CUDA device (and nvcc)")
@pytest.mark.parametrize("launch", list(_CUDA_CONFIGS))
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_cuda_passes_with_a_row_map_equal_the_reference(kind, launch):
    """The CUDA passes' row-map build (``RR_RING_MAP``) reads and writes a slot's records at its ring row, at their
    compiled shape (K = V = 128): output, checkpoint and rings equal the torch reference with the same map."""
    from sglang_replayssm.kernels.ring_decode import RingDecodeConfig

    _check_mapped_decode(kind, RingDecodeConfig(**_CUDA_CONFIGS[launch]), dim=128)


def test_a_mapped_step_takes_the_cuda_passes_only_where_the_registry_says(monkeypatch):
    """With the registry entry (``MAPPED_DEFAULT``) off the default launch keeps a mapped step off the CUDA passes,
    with the reason logged; a forced ``engine="cuda"`` or the entry on (measured: the default) lets the build decide."""
    from sglang_replayssm.kernels import ring_decode_cuda
    from sglang_replayssm.kernels.ring_decode import checked_step, cuda_unfit

    args = _decode_args("gdn", 2, 4, 3)
    slots, wp = torch.tensor([1, 3]), torch.tensor([1, 2], dtype=torch.int32)
    step = checked_step(**args, out=torch.empty(2, 1, 2, 8), ssm_state_indices=slots, write_pos=wp, force_flush=None,
                        use_qk_l2norm_in_kernel=True, is_kda=False, ring_map=torch.tensor([0, 2, 0, 1], dtype=torch.int32))
    plain = checked_step(**{**args, "d_cache": args["d_cache"].new_zeros(4, 2, 4, 8),
                            "k_cache": args["k_cache"].new_zeros(4, 1, 4, 8), "g_cache": args["g_cache"].new_zeros(4, 2, 4)},
                         out=torch.empty(2, 1, 2, 8), ssm_state_indices=slots, write_pos=wp, force_flush=None,
                         use_qk_l2norm_in_kernel=True, is_kda=False)  # fmt: skip
    monkeypatch.setattr(ring_decode_cuda, "MAPPED_DEFAULT", False)
    assert "SGLANG_REPLAYSSM_RING_ROWS" in cuda_unfit(step, forced=False)
    assert cuda_unfit(step, forced=True) == cuda_unfit(plain, forced=True)  # forced: only what the build needs
    monkeypatch.setattr(ring_decode_cuda, "MAPPED_DEFAULT", True)
    assert cuda_unfit(step, forced=False) == cuda_unfit(plain, forced=False)


def _check_mapped_decode(kind: str, config, dim: int) -> None:
    """Two steps (a flush, a forced flush, a padded row; then a row that reads the record written before) with
    ``config`` against the torch reference, both through the same slot -> ring row map."""
    from sglang_replayssm.kernels.ring_decode import ring_decode

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    slots, n_rows, L, B = 7, 5, 4, 4
    raw = _decode_args(kind, B, slots, n_rows, L, dim=dim)
    args = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in raw.items()}
    ring_map = torch.tensor([0, 0, 3, 1, 0, 4, 0], dtype=torch.int32, device=dev)
    slot_of = torch.tensor([5, 2, -1, 3], device=dev)
    write_pos = torch.tensor([L - 1, 1, 0, 2], dtype=torch.int32, device=dev)
    force = torch.tensor([0, 0, 0, 1], dtype=torch.int32, device=dev)  # a forced flush too
    got = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    out_ref, out = torch.empty(B, 1, 2, dim, device=dev), torch.empty(B, 1, 2, dim, device=dev)
    for rows_write in (0, 1):  # non-flush row 1's record at ring row 3, then the next step reads it
        wp = write_pos + rows_write * torch.tensor([0, 1, 0, 0], dtype=torch.int32, device=dev)
        wp = torch.where(wp > L - 1, torch.zeros_like(wp), wp)
        ring_decode_torch(**args, out=out_ref, ssm_state_indices=slot_of, write_pos=wp, force_flush=force,
                          use_qk_l2norm_in_kernel=True, is_kda=kind == "kda", ring_map=ring_map)  # fmt: skip
        ring_decode(**got, out=out, ssm_state_indices=slot_of, write_pos=wp, force_flush=force,
                    use_qk_l2norm_in_kernel=True, is_kda=kind == "kda", ring_map=ring_map, config=config)  # fmt: skip
        tol = dict(rtol=1e-5, atol=1e-6) if dim <= 8 else dict(rtol=1e-4, atol=1e-4)  # fp32 sums of 128 terms
        torch.testing.assert_close(out, out_ref, **tol)
        for name in ("initial_state", "d_cache", "k_cache", "g_cache"):
            torch.testing.assert_close(got[name], args[name], **tol, msg=name)


@pytest.mark.interpret
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_triton_materialize_reads_each_rows_records_at_its_ring_row(kind):
    from sglang_replayssm.kernels.materialize_ref import check_materialize_args, materialize_torch
    from sglang_replayssm.kernels.materialize_triton import materialize_triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    temporal, d, k, gate = (t.to(dev) for t in _row_pool(kind, 8, seed=2))
    src, dst, cnt, ring = (torch.tensor(x, device=dev) for x in ([4, 1, -1, 2], [5, 1, 0, 3], [3, 2, 1, 4], [2, 0, 0, 1]))
    want, got = temporal.clone(), temporal.clone()
    materialize_torch(check_materialize_args(want, d, k, gate, src, dst, cnt, is_kda=kind == "kda", ring_src=ring))
    materialize_triton(check_materialize_args(got, d, k, gate, src, dst, cnt, is_kda=kind == "kda", ring_src=ring))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, temporal)
