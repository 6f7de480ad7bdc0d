"""Deliverable 5: the decode ring is charged to SGLang's mamba memory budget.

``KVCacheConfigurator._handle_max_mamba_cache`` (SGLang's real method) sizes the mamba pool from
``mamba_cache_per_req`` (conv + temporal); with ``--enable-linear-replayssm`` every slot also
carries a ring that ``MambaPool`` allocates afterwards. With the adapter the per-slot price is
exactly the bytes a real ``MambaPool`` allocates per slot.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot
from sglang_replayssm.radix.records import budget as record_budget
from sglang_replayssm.state import peek
from tests.support.simulate import SimConfig, ToyModel, build_fixture
from tests.support.simulate_fixture import cache_params

GIB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed():
    hooks.install()


def _pool_bytes_per_slot(kind: str, ring_len: int):
    """Build a real decode-ring MambaPool; return (cache params, its bytes per slot, ring part)."""
    cfg = SimConfig(kind=kind, ring_len=ring_len, mamba_slots=7)
    model = ToyModel(cfg)
    _, _, req_pool = build_fixture(cfg, model)
    pool = req_pool.mamba_pool
    cache = pool.mamba_cache
    slots = pool.size + 1
    ring = cache.replayssm_d.nbytes + cache.replayssm_k.nbytes + cache.replayssm_g.nbytes
    ring += pool.replayssm_write_pos.nbytes
    state = sum(c.nbytes for c in cache.conv) + cache.temporal.nbytes
    assert (ring + state) % slots == 0 and ring % slots == 0
    return cache_params(cfg, model, list(range(cfg.mamba_layers))), (ring + state) // slots, ring // slots


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("ring_len", [4, 16])
def test_ring_bytes_per_slot_match_the_real_pool(kind, ring_len):
    params, per_slot, ring = _pool_bytes_per_slot(kind, ring_len)
    assert decode_ring_bytes_per_slot(params, ring_len) == ring
    # What SGLang prices per slot leaves the ring out; with it, the price is the allocation.
    assert params.mamba_cache_per_req + ring == per_slot
    assert ring > 0.1 * params.mamba_cache_per_req


def _sizing(params, *, kda: bool):
    """SGLang's configurator (slots, as SGLang's: no attribute of ours fits on it) with just the fields its
    mamba sizing reads, and a bare model module the record reservation is made for (no GPU)."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    class _Sizing(KVCacheConfigurator):
        __slots__ = ()

        def fused_entry_bytes(self, sub_pool_name):  # no fused draft pool
            return None

    c = object.__new__(_Sizing)
    fields = {
        "mambaish_config": SimpleNamespace(mamba2_cache_params=params),
        "pp_size": 1,
        "attn_dp_size": 1,
        "model_config": None,
        "spec_algorithm": SpeculativeAlgorithm.NONE,
        "hybrid_gdn_config": None if kda else object(),
        "hybrid_kda_config": object() if kda else None,
        "extra_mamba_cache_bytes_per_req": 0,
        "model": torch.nn.Module(),
    }
    for name, value in fields.items():
        setattr(c, name, value)
    return c


def _publish(**kw):
    from sglang.srt.runtime_context import get_schedule
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", **kw))
    return get_schedule()


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("explicit_size", [None, 100], ids=["auto-fit", "max-mamba-cache-size"])
@pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
def test_mamba_sizing_charges_the_decode_ring(kind, explicit_size, adapter_on):
    ring_len, rest_gib = 16, 0.02
    params, per_slot, ring = _pool_bytes_per_slot(kind, ring_len)
    schedule = _publish(
        enable_linear_replayssm=True, linear_replayssm_cache_len=ring_len, max_mamba_cache_size=explicit_size
    )
    sizing = _sizing(params, kda=kind == "kda")
    with config.override(adapter_on, record_hits=False):  # the record reservation: its own test below
        left = sizing._handle_max_mamba_cache(rest_gib)
    assert sizing.extra_mamba_cache_bytes_per_req == 0  # restored
    priced = params.mamba_cache_per_req + (ring if adapter_on else 0)
    size = schedule.max_mamba_cache_size
    if explicit_size is None:
        budget = rest_gib * schedule.mamba_full_memory_ratio / (1 + schedule.mamba_full_memory_ratio) * GIB
        assert size == int((budget - priced) // priced)
        # What the pool will really allocate (+1 padding slot) fits the mamba budget only when priced.
        assert ((size + 1) * per_slot <= budget) == adapter_on
    else:
        assert size == explicit_size
    assert left == pytest.approx(rest_gib - (size + 1) * priced / GIB, rel=1e-12)


def test_spec_ring_sizing_is_left_to_sglang():
    """``--enable-linear-replayssm-spec`` prices its own ring; the adapter adds nothing there (records off)."""
    params, _, _ = _pool_bytes_per_slot("gdn", 4)
    results = []
    for on in (True, False):
        schedule = _publish(
            enable_linear_replayssm_spec=True, linear_replayssm_cache_len=4, max_running_requests=8
        )
        with config.override(on, record_hits=False):
            left = _sizing(params, kda=False)._handle_max_mamba_cache(0.02)
        results.append((left, schedule.max_mamba_cache_size))
    assert results[0] == results[1]


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_spec_ring_reserves_the_record_pool_only_with_the_fix(fix_on, monkeypatch):
    """With records beside the spec ring (``record_spec_ring``) their pool comes out of the KV budget too."""
    params, _, _ = _pool_bytes_per_slot("gdn", 4)
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "64")
    lefts = []
    for records_on in (True, False):
        _publish(enable_linear_replayssm_spec=True, linear_replayssm_cache_len=4, max_running_requests=8)
        sizing = _sizing(params, kda=False)
        sizing.model_config = SimpleNamespace(dtype=torch.float32)
        with config.override(True, record_hits=records_on, record_spec_ring=fix_on):
            lefts.append(sizing._handle_max_mamba_cache(0.02))
    assert (lefts[0] < lefts[1]) == fix_on


def test_record_pool_is_reserved_from_the_kv_budget(monkeypatch):
    cfg = SimConfig(kind="gdn")
    model = ToyModel(cfg)
    params = cache_params(cfg, model, list(range(cfg.mamba_layers)))
    configurator = SimpleNamespace(hybrid_gdn_config=object(), model_config=SimpleNamespace(dtype=torch.float32),
                                   mambaish_config=SimpleNamespace(mamba2_cache_params=params), model=torch.nn.Module())
    per_token = record_budget.record_bytes_per_token(params, 4)
    assert per_token == (model.qkv_dim + 2 * model.HV) * 4 * cfg.mamba_layers
    monkeypatch.delenv("SGLANG_REPLAYSSM_RECORD_TOKENS", raising=False)
    # with interval states (the default, one per 256 tokens): each costs every layer's fp32 state
    state = record_budget.interval_state_bytes(params)
    assert state == model.HV * model.V * model.K * 4 * cfg.mamba_layers
    gib = record_budget._record_reservation_gib(configurator, 1.0)
    assert record_budget.reserved_capacity(configurator) == 16384 and gib * GIB == per_token * 16385 + (16384 // 256 + 3) * state
    monkeypatch.setenv("SGLANG_REPLAYSSM_STATE_INTERVAL", "0")  # records only, from here
    # default: 16,384 tokens when they fit in half the rest ...
    gib = record_budget._record_reservation_gib(configurator, 1.0)
    assert record_budget.reserved_capacity(configurator) == 16384 and gib * GIB == per_token * 16385
    # ... else half the rest
    rest = 4000 * per_token / GIB
    gib = record_budget._record_reservation_gib(configurator, rest)
    assert record_budget.reserved_capacity(configurator) == 1999 and gib <= rest / 2
    # ... and none where half the rest holds fewer than four interval spans
    assert record_budget._record_reservation_gib(configurator, 2000 * per_token / GIB) == 0.0
    # explicit: kept, or refused in one line when it leaves nothing for the KV cache
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "900")
    assert record_budget._record_reservation_gib(configurator, rest) * GIB == per_token * 901
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "5000")
    with pytest.raises(ValueError, match="SGLANG_REPLAYSSM_RECORD_TOKENS=5000: the record pool needs"):
        record_budget._record_reservation_gib(configurator, rest)
    with config.override(record_hits=False):
        assert record_budget._record_reservation_gib(configurator, rest) == 0.0


@pytest.mark.parametrize("rounded", ["1", "0"])
def test_bf16_serving_reserves_the_rounded_interval_states_it_keeps(monkeypatch, caplog, rounded):
    """Serving in bf16 over fp32 states, the interval states are kept rounded (``STATE_INTERVAL_ROUNDED``, the
    default), in bf16 as the kernel computes them, and allocated at the first prefill: the reservation holds
    them at that size, so they never land outside the memory budget; with rounding off none is kept and none
    reserved."""
    cfg = SimConfig(kind="gdn")
    params = cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers)))
    configurator = SimpleNamespace(hybrid_gdn_config=object(), model_config=SimpleNamespace(dtype=torch.bfloat16),
                                   mambaish_config=SimpleNamespace(mamba2_cache_params=params), model=torch.nn.Module())
    monkeypatch.setenv("SGLANG_REPLAYSSM_RECORD_TOKENS", "1024")
    monkeypatch.setenv("SGLANG_REPLAYSSM_STATE_INTERVAL_ROUNDED", rounded)
    records = record_budget.record_bytes_per_token(params, 2) * 1025
    states = (1024 // 256 + 3) * record_budget.interval_state_bytes(params, 2)  # kept in bf16, as computed
    assert 2 * states == (1024 // 256 + 3) * record_budget.interval_state_bytes(params)  # fp32 states
    with caplog.at_level(logging.INFO, logger="sglang_replayssm.radix.records.budget"):
        gib = record_budget._record_reservation_gib(configurator, 1.0)
    assert gib * GIB == records + (states if rounded == "1" else 0)
    line = next(r.getMessage() for r in caplog.records if "reserved from the KV budget" in r.getMessage())
    kept = (1024 // 256 + 3) if rounded == "1" else 0  # the startup line adds up: records + kept states
    assert (f"1024 tokens x {records // 1025} B + {kept} kept states x "
            f"{record_budget.interval_state_bytes(params, 2)} B = {gib * 1024:.1f} MiB") in line, line


def test_record_pool_is_built_with_sglangs_pools(monkeypatch):
    """After ``KVCacheConfigurator.configure`` (the records' AFTER hook): the record pool rides on the
    ``HybridReqToTokenPool``, sized by what the reservation handed that configurator, built once; a draft
    worker's configure builds none; a reservation of 0 tokens turns records off for good."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigResult

    from sglang_replayssm.radix.records.hooks import RECORD_HOOKS
    from sglang_replayssm.radix.records.pool import pool_of

    monkeypatch.delenv("SGLANG_REPLAYSSM_RECORD_TOKENS", raising=False)
    monkeypatch.setenv("SGLANG_REPLAYSSM_STATE_INTERVAL", "0")
    (hook,) = (h for h in RECORD_HOOKS if h.target.endswith("KVCacheConfigurator.configure"))
    cfg = SimConfig(kind="gdn")
    params = cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers)))
    per_token = record_budget.record_bytes_per_token(params, 4)

    def configure(reserved_tokens: int, *, draft: bool = False, req_pool=None):
        """A configurator whose reservation fixed ``reserved_tokens`` (the default rule: half the rest),
        and the pools its ``configure`` returns (SGLang's real ones, on CPU)."""
        sizing = _sizing(params, kda=False)
        sizing.model_config, sizing.is_draft_worker = SimpleNamespace(dtype=torch.float32), draft
        record_budget._record_reservation_gib(sizing, 2 * per_token * (reserved_tokens + 1) / GIB)
        _, allocator, fresh = build_fixture(cfg, ToyModel(cfg))
        result = KVCacheConfigResult(
            max_total_num_tokens=cfg.kv_size, max_running_requests=cfg.max_reqs, full_max_total_num_tokens=None,
            swa_max_total_num_tokens=None, req_to_token_pool=fresh if req_pool is None else req_pool,
            token_to_kv_pool=allocator.get_kvcache(), token_to_kv_pool_allocator=allocator, memory_pool_config=None)
        with config.override(True, record_hits=True):
            hook.fn(result, sizing, pre_model_load_memory=0)
        return sizing, result

    sizing, result = configure(1500)
    pool = pool_of(result.req_to_token_pool)
    kv = result.token_to_kv_pool
    assert record_budget.reserved_capacity(sizing) == 1500 and pool is not None and pool.capacity == 1500
    assert pool.kv_size == kv.size + kv.page_size + 1 and pool.states is None and pool.capture_decode
    assert pool.used == 0 and not pool.layers  # nothing captured before the first forward
    _, again = configure(1200, req_pool=result.req_to_token_pool)  # a second configure of the same pool
    assert pool_of(again.req_to_token_pool) is pool
    _, draft = configure(1500, draft=True)
    assert pool_of(draft.req_to_token_pool) is None
    _, off = configure(300)  # below four interval spans: the default rule reserves 0 tokens, records off
    assert pool_of(off.req_to_token_pool) is None and peek(off.req_to_token_pool).records_off
    _, still_off = configure(1500, req_pool=off.req_to_token_pool)
    assert pool_of(still_off.req_to_token_pool) is None


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_mamba_sizing_charges_the_read_copy(mode):
    """``SGLANG_REPLAYSSM_READ_COPY``: the copy and its records are priced per slot beside the ring."""
    from sglang_replayssm.radix.read_copy.store import bytes_per_slot

    ring_len, rest_gib = 16, 0.02
    params, _, ring = _pool_bytes_per_slot("gdn", ring_len)
    schedule = _publish(enable_linear_replayssm=True, linear_replayssm_cache_len=ring_len, max_mamba_cache_size=100)
    sizing = _sizing(params, kda=False)
    with config.override(True, record_hits=False), config.override_read_copy(mode):
        left = sizing._handle_max_mamba_cache(rest_gib)
    priced = params.mamba_cache_per_req + ring + bytes_per_slot(params, ring_len, mode, 4)
    assert left == pytest.approx(rest_gib - (schedule.max_mamba_cache_size + 1) * priced / GIB, rel=1e-12)


def test_carved_read_copy_records_admit_more_slots(caplog):
    """``read_copy_d_ring``: with a bf16 io dtype the read copy's d~ / v records live in SGLang's
    (already priced) fp32 ring, so SGLang's auto-fit sizing admits more slots; the log line says which."""
    import logging

    ring_len, rest_gib = 16, 0.02
    cfg = SimConfig(kind="gdn", ring_len=ring_len, io_dtype=torch.bfloat16)
    params = cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers)))
    sizes = {}
    for carve in (True, False):
        schedule = _publish(enable_linear_replayssm=True, linear_replayssm_cache_len=ring_len)
        sizing = _sizing(params, kda=False)
        sizing.model_config = SimpleNamespace(dtype=torch.bfloat16)
        caplog.clear()
        with config.override(True, record_hits=False, read_copy_d_ring=carve), config.override_read_copy("bf16"), \
                caplog.at_level(logging.INFO, logger="sglang_replayssm.radix.read_copy.startup"):  # fmt: skip
            sizing._handle_max_mamba_cache(rest_gib)
        line = next(r.getMessage() for r in caplog.records if "read copy" in r.getMessage())
        assert ("carved out of SGLang's replayssm_d (not charged)" in line) == carve
        assert ("allocated (charged)" in line) == (not carve)
        sizes[carve] = schedule.max_mamba_cache_size
    assert sizes[True] > sizes[False], sizes
