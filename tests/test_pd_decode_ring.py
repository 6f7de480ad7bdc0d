"""PD disaggregation with the decode ring (radix/pd/decode_pool.py), on SGLang 0.5.23's real decode-side pool.

Before: ``--enable-linear-replayssm`` with ``--disaggregation-mode`` was refused (SGLang at
attention_hook.py:424, the adapter before it), and SGLang's decode pool
``HybridMambaDecodeReqToTokenPool`` never allocated the ring even when asked. Each test builds the
real decode pool on CPU (SGLang's own ``__init__``, the adapter's hooks installed) and fails with
the ``pd_decode_ring`` fix off where it tests that fix. No transfer backend runs here (none imports
on this machine: notes/pd.md); the transfer is done as SGLang's backends do it, by writing the
advertised per-layer state buffers (``_iter_transfer_state_entries``) at the receiving slots.
"""

from __future__ import annotations

import os
from array import array
from typing import Any

import pytest
import torch

from sglang_replayssm.radix import admission, config, hooks
from sglang_replayssm.radix.ring.pool import ring_pool
from sglang_replayssm.settings import RING_ROWS
from tests.support.simulate import SimConfig, ToyModel
from tests.support.simulate_fixture import cache_params

RING = 8
PRE_ALLOC = 2  # --disaggregation-decode-extra-slots: request rows for transfers beside the running ones


@pytest.fixture(scope="module", autouse=True)
def _hooks() -> None:
    hooks.install()


def _publish(**kw: Any) -> None:
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", **kw))


def _decode_pool(kind: str = "gdn", *, ring_flag: bool = True, size: int = 4, mamba_size: int = 16,
                 rows: bool = False) -> Any:
    """SGLang's PD decode pool as ``kv_cache_configurator.py:1646`` builds it, on CPU (``rows``: with decode
    rings keyed by request row)."""
    from unittest import mock

    from sglang.srt.disaggregation.decode import HybridMambaDecodeReqToTokenPool

    _publish(enable_linear_replayssm=ring_flag, linear_replayssm_cache_len=RING, max_mamba_cache_size=mamba_size)
    cfg = SimConfig(kind=kind, ring_len=RING)
    layers = list(range(cfg.mamba_layers))
    with mock.patch.dict(os.environ, {RING_ROWS.name: "on" if rows else "off"}):  # read at the build
        return HybridMambaDecodeReqToTokenPool(
            size=size, max_context_len=64, device="cpu", enable_memory_saver=False,
            cache_params=cache_params(cfg, ToyModel(cfg), layers), mamba_layer_ids=layers,
            speculative_num_draft_tokens=None, enable_mamba_extra_buffer=False, pre_alloc_size=PRE_ALLOC,
            enable_overlap_schedule=False, mamba_size=mamba_size, linear_replayssm_cache_len=RING,
        )


def _req(rid: str) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid=rid, origin_input_text="", origin_input_ids=array("q", [1, 2, 3]),
               sampling_params=SamplingParams(temperature=0, max_new_tokens=4))


def _transfer(src_pool: Any, src_slot: int, dst_pool: Any, dst_slot: int) -> None:
    """What a transfer backend does: copy each advertised state item of ``src_slot`` to ``dst_slot``."""
    src = list(src_pool._iter_transfer_state_entries())
    dst = list(dst_pool._iter_transfer_state_entries())
    assert [(f, t.shape[1:], layer) for f, t, _, layer in src] == [(f, t.shape[1:], layer) for f, t, _, layer in dst]
    for (_, s, _, _), (_, d, _, _) in zip(src, dst):
        d[dst_slot].copy_(s[src_slot])


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_decode_pool_runs_the_ring_the_server_asked_for(kind, fix_on):
    with config.override(True, pd_decode_ring=fix_on):
        pool = _decode_pool(kind)
    view = ring_pool(pool.mamba_pool)
    assert (view is not None) == fix_on  # fix off: SGLang's pool ignores --enable-linear-replayssm
    if fix_on:
        slots = pool.mamba_pool.size + 1
        assert view.write_pos.shape == (slots,) and view.d.shape[1] == slots and view.d.shape[3] == RING
        assert view.is_kda == (kind == "kda")
        # the cursor choke point is linked to this pool's allocator (alloc_reset.link_allocator)
        from sglang_replayssm.radix.ring.alloc_reset import linked_write_pos

        assert linked_write_pos(pool.mamba_allocator) is view.write_pos


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_decode_pool_takes_rings_keyed_by_request_row(kind):
    """With rings keyed by request row the decode pool has one ring per request row, the pre-allocated
    transfers' rows included, and a receiving slot reads the ring of its request's row."""
    with config.override(True):
        pool = _decode_pool(kind, size=4, rows=True)
    view = ring_pool(pool.mamba_pool)
    n_rows = pool.req_to_token.shape[0]
    assert n_rows == 4 + PRE_ALLOC + 1 < pool.mamba_pool.size + 1
    assert view is not None and view.rows is not None and view.rows.shape == view.write_pos.shape
    assert view.d.shape[1] == view.k.shape[1] == view.g.shape[1] == n_rows
    reqs = [_req(f"pd-{i}") for i in range(4 + PRE_ALLOC)]  # every row: running and pre-allocated
    got = pool.alloc(reqs)
    assert got is not None and sorted(got) == list(range(1, n_rows))
    for row in got:
        slot = int(pool.req_index_to_mamba_index_mapping[row])
        assert int(view.rows[slot]) == row and int(view.write_pos[slot]) == 0


def test_decode_pool_slots_above_the_budget_are_named(caplog):
    """SGLang raises the decode pool above --max-mamba-cache-size (decode.py:322-333); the ring of the
    raised slots is outside the budget, and the log says how much."""
    from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot

    with config.override(True), caplog.at_level("WARNING", logger="sglang_replayssm.radix.pd.decode_pool"):
        pool = _decode_pool(size=4, mamba_size=4)  # 4 requests + 2 extra slots need 6
    assert pool.mamba_pool.size == 6
    (line,) = [r.getMessage() for r in caplog.records if r.name == "sglang_replayssm.radix.pd.decode_pool"]
    cfg = SimConfig(kind="gdn", ring_len=RING)
    params = cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers)))
    mib = 2 * decode_ring_bytes_per_slot(params, RING) / (1 << 20)
    assert "6 mamba slots, 2 above --max-mamba-cache-size 4" in line and f"({mib:.1f} MiB)" in line
    caplog.clear()
    with config.override(True), caplog.at_level("WARNING", logger="sglang_replayssm.radix.pd.decode_pool"):
        _decode_pool(size=4, mamba_size=16)
    assert not [r for r in caplog.records if r.name == "sglang_replayssm.radix.pd.decode_pool"]


def test_decode_pool_rows_of_pre_allocated_transfers_are_named(caplog):
    """Rings keyed by request row: the budget charged the running requests' rows; the rows SGLang adds for
    pre-allocated transfers are outside it, and the log says how much (whatever the slots)."""
    from sglang_replayssm.radix.budget import ring_row_bytes

    cfg = SimConfig(kind="gdn", ring_len=RING)
    mib = PRE_ALLOC * ring_row_bytes(cache_params(cfg, ToyModel(cfg), list(range(cfg.mamba_layers))), RING) / (1 << 20)
    for mamba_size in (4, 16):
        caplog.clear()
        with config.override(True), caplog.at_level("WARNING", logger="sglang_replayssm.radix.pd.decode_pool"):
            _decode_pool(size=4, mamba_size=mamba_size, rows=True)
        (line,) = [r.getMessage() for r in caplog.records if r.name == "sglang_replayssm.radix.pd.decode_pool"]
        assert f"{PRE_ALLOC} request rows for pre-allocated transfers" in line and f"({mib:.1f} MiB)" in line


def test_decode_pool_stays_sglangs_without_the_ring_flag():
    with config.override(True):
        pool = _decode_pool(ring_flag=False)
    assert ring_pool(pool.mamba_pool) is None and pool.mamba_pool.replayssm_write_pos is None


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_transfer_buffers_are_the_same_with_and_without_the_ring(kind):
    """A prefill server without the ring and a decode server with it advertise the same state items."""
    with config.override(True):
        ring = _decode_pool(kind).mamba_pool
    with config.override(True, pd_decode_ring=False):
        plain = _decode_pool(kind).mamba_pool
    assert ring_pool(ring) is not None and ring_pool(plain) is None
    assert ring.get_contiguous_buf_infos()[2] == plain.get_contiguous_buf_infos()[2]
    assert ring.get_state_dim_per_tensor() == plain.get_state_dim_per_tensor()


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_imported_state_is_the_slots_whole_state(kind):
    """A receiving slot whose previous owner left records: after SGLang's decode-side alloc
    (``disaggregation/decode.py:2257``) and the transfer, the slot's state is the prefill state."""
    with config.override(True):
        pool = _decode_pool(kind)
        view = ring_pool(pool.mamba_pool)
        g = torch.Generator().manual_seed(1)
        for t in (view.d, view.k, view.g, view.temporal):
            t.copy_(torch.randn(t.shape, generator=g))
        view.write_pos.fill_(RING - 1)  # every slot dirty: any reuse would fold stale records
        with config.override(True, pd_decode_ring=False):
            prefill = _decode_pool(kind).mamba_pool  # the prefill side: no ring
        for t in (prefill.mamba_cache.temporal, *prefill.mamba_cache.conv):
            t.copy_(torch.randn(t.shape, generator=g))
        req = _req("pd-0")
        (row,) = pool.alloc([req])
        slot = int(pool.translate_mamba_indices(pool.req_index_to_mamba_index_mapping[row]))
        _transfer(prefill, 3, pool.mamba_pool, slot)
        assert int(view.write_pos[slot]) == 0
        assert view.folded_temporal(torch.tensor([slot])) is None  # no record to fold: temporal is it
        torch.testing.assert_close(view.temporal[:, slot], prefill.mamba_cache.temporal[:, 3], rtol=0, atol=0)
        for dst, src in zip(pool.mamba_pool.mamba_cache.conv, prefill.mamba_cache.conv):
            torch.testing.assert_close(dst[:, slot], src[:, 3], rtol=0, atol=0)


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_decode_side_retraction_backup_carries_pending_records(fix_on):
    """PD decode retraction (``cpu_tensor``, ``schedule_batch.py:2109``) on the decode pool: the backup
    of a slot with pending records resumes to the same state (fix ``retract_backup``)."""
    with config.override(True):
        pool = _decode_pool("gdn")
    view = ring_pool(pool.mamba_pool)
    g = torch.Generator().manual_seed(2)
    for t in (view.d, view.k, view.temporal):
        t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    view.g.copy_(-torch.rand(view.g.shape, generator=g))
    slot, resumed = torch.tensor([2]), torch.tensor([5])
    view.write_pos[2] = 5
    want = view.folded_temporal(slot)
    with config.override(True, retract_backup=fix_on):
        backup = pool.mamba_pool.get_cpu_copy(slot)
        pool.mamba_pool.load_cpu_copy(backup, resumed)
    got = view.folded_temporal(resumed)
    got = view.temporal[:, resumed] if got is None else got
    assert torch.equal(got, want) == fix_on


def _admit(mode: str, **kw: Any) -> Any:
    from sglang.srt.server_args import ServerArgs

    calls: list[Any] = []
    args = ServerArgs(model_path="dummy", enable_linear_replayssm=True, disaggregation_mode=mode, **kw)

    def sglang_check(server_args: Any) -> None:  # SGLang's own refusal, read through its module global
        from sglang.srt.arg_groups import attention_hook

        calls.append(attention_hook.resolving_view(server_args).disaggregation_mode)

    admission.admit_linear_attn_args(sglang_check, args)
    return calls


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_decode_server_is_admitted_with_the_ring(fix_on):
    with config.override(True, pd_decode_ring=fix_on):
        if fix_on:
            assert _admit("decode", disable_radix_cache=True) == ["null"]  # SGLang's PD check answered
            from sglang.srt.arg_groups import attention_hook
            from sglang.srt.arg_groups.overrides import resolving_view

            assert attention_hook.resolving_view is resolving_view  # restored
        else:
            with pytest.raises(admission.ReplaySSMArgsError, match="pd_decode_ring fix is off"):
                _admit("decode")


def test_prefill_server_is_refused_with_the_ring_in_one_line():
    with config.override(True), pytest.raises(admission.ReplaySSMArgsError) as err:
        _admit("prefill")
    assert "\n" not in str(err.value) and "launch it without --enable-linear-replayssm" in str(err.value)


def test_sglangs_own_pd_refusal_is_what_the_adapter_answers():
    """The decode-mode check the adapter answers is the one at attention_hook.py:424 (and only it)."""
    from pathlib import Path

    import sglang

    source = (Path(sglang.__file__).parent / "srt/arg_groups/attention_hook.py").read_text().splitlines()
    assert source[423].strip() == 'if cfg.disaggregation_mode != "null":'
    body = source[280:530]
    assert sum("disaggregation_mode" in line for line in body) == 3  # :424, its message, :493 (spec ring)


def _pd_decode_sim(kind: str, rows: bool = False) -> Any:
    """The simulation (testing/simulate.py: SGLang's real cache objects, a toy model with an fp64
    oracle) on SGLang's PD decode pool instead of the aggregated one, as a decode server builds it."""
    from unittest import mock

    from sglang.srt.disaggregation.decode import HybridMambaDecodeReqToTokenPool
    from sglang.srt.mem_cache import memory_pool

    from tests.support.simulate import Sim

    class _DecodePool(HybridMambaDecodeReqToTokenPool):
        """The decode pool from the kit's aggregated-pool arguments (the decode pool takes no ring
        flag: the adapter supplies it; no spec-state size, no lazy buffer; no extra slots)."""

        def __init__(self, **kw: Any) -> None:
            for name in ("enable_linear_replayssm", "mamba_spec_state_size", "enable_mamba_extra_buffer_lazy"):
                kw.pop(name)
            super().__init__(pre_alloc_size=PRE_ALLOC if rows else 0, **kw)

    with mock.patch.object(memory_pool, "HybridReqToTokenPool", _DecodePool):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", ring_len=RING, ring_rows=rows))
    assert isinstance(sim.req_pool, HybridMambaDecodeReqToTokenPool)
    return sim


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize(("fix_on", "rows"), [(True, False), (False, False), (True, True)],
                         ids=["fix-on", "fix-off", "rows"])
def test_pd_decode_pool_decodes_exactly_through_retraction(kind, fix_on, rows):
    """Two requests decode on the PD decode pool past several ring flushes; one is retracted with its
    ring half full (``cpu_tensor``, the PD decode backup) and resumed; ``rows``: rings keyed by request
    row, with pre-allocated transfer rows in the pool. Every step, each running request's checkpoint + ring is its oracle state. Fix off
    (``retract_backup``): the resumed state misses the pending records."""
    with config.override(True, retract_backup=fix_on):
        sim = _pd_decode_sim(kind, rows)
        view = ring_pool(sim.mamba_pool)
        assert view is not None and (view.rows is not None) == rows
        a = sim.admit([1, 2, 3, 4, 5], [(3 * j + 1) % 10 for j in range(3 * RING)])
        b = sim.admit([2, 4, 6], [(5 * j + 2) % 10 for j in range(3 * RING)])
        for _ in range(RING + 3):
            sim.decode()
            sim.check()
        sim.decode_until_pending(a, min_steps=1)
        assert int(ring_pool(sim.mamba_pool).write_pos[a.req.kv.mamba_pool_idx]) > 0  # records pending
        sim.retract(a, backup=True)
        sim.resume(a)
        problems = sim.live_problems(1e-5)
        assert (problems == []) == fix_on, problems
        if fix_on:
            while sim.running:
                sim.decode()
                sim.check()
            assert b.req.finished() and a.req.finished()


def test_pd_decode_pool_has_no_ring_with_the_fix_off():
    with config.override(True, pd_decode_ring=False):
        sim = _pd_decode_sim("gdn")
    assert ring_pool(sim.mamba_pool) is None  # SGLang's decode pool: the decode kernels would run without it


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_random_streams_on_the_pd_decode_pool_with_rows_stay_exact(kind):
    """tests/test_radix_property.py's random streams (admit, decode, finish, abort, evict, match, copy) on the
    PD decode pool with rings keyed by request row and pre-allocated rows: after every operation every cached
    and live state is its fp64 oracle's."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from tests.test_radix_property import _apply, ops

    @settings(max_examples=8, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(ops, min_size=50, max_size=50))
    def streams(stream: list[tuple]) -> None:
        with config.override(True):
            sim = _pd_decode_sim(kind, rows=True)
            assert ring_pool(sim.mamba_pool).rows is not None
            for op in stream:
                _apply(sim, op)
                sim.check()

    streams()
