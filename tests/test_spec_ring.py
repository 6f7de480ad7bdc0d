"""The spec-verify ring's fold (radix/spec/ring.py) and the D1-D5 movers at unit level.

* :meth:`SpecRing.fold` equals an fp64 recurrence over the row's circular records (with and without
  lo parts) and SGLang's own compact commit (``commit_gdn_replayssm_circular``, run with the flush
  forced on; interpreted on CPU), and leaves the row's ring empty with the same state.
* D1 (no_buffer finish donation, reachable on CPU: tests/test_spec_e2e.py) at unit level.
* D2 (CPU retraction backup, reachable only on a PD decode server, not on CPU): SGLang's
  ``Req.offload_kv_cache`` backs up ``temporal`` alone, so the backup lags by the row's pending
  records; with ``spec_retract_backup`` the backup is the full state.
* D3 / D4 (extend over a spec row): ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`` folds
  every row of an extend forward with ``spec_extend_fold``; with it off ``temporal`` is left lagging.
* D5: a GDN spec ring whose length is not a power of two or is < 2 x draft tokens is refused by
  ``handle_linear_attn_backend`` in one line; SGLang 0.5.23 alone accepts it (KDA-only check).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.spec.ring import SpecRing, spec_ring, spec_ring_error

LAYERS, SLOTS, ROWS, HV, H, V, K, L = 2, 6, 5, 4, 2, 32, 32, 16


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed() -> None:
    hooks.install()


def _pool(seed: int = 0, lo: bool = False) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    cache = SimpleNamespace(
        temporal=rnd(LAYERS, SLOTS, HV, V, K, scale=0.3),
        replayssm_d=rnd(LAYERS, ROWS, HV, L, V, scale=0.2),
        replayssm_k=rnd(LAYERS, ROWS, H, L, K, scale=0.2),
        replayssm_g=-torch.rand(LAYERS, ROWS, HV, L, generator=gen) * 0.5,
        replayssm_rawv=rnd(LAYERS, ROWS, HV, L, V, scale=1e-3) if lo else None,
        replayssm_rawk=rnd(LAYERS, ROWS, H, L, K, scale=1e-3) if lo else None,
    )
    write_pos = torch.tensor([0, 5, 0, 12, 3], dtype=torch.int32)
    base = torch.tensor([0, 14, 3, 9, 0], dtype=torch.int32)
    return SimpleNamespace(mamba_cache=cache, replayssm_spec_fold=False, replayssm_spec_write_pos=write_pos,
                           replayssm_cache_base=base, replayssm_is_flush=torch.zeros(ROWS, dtype=torch.int8))


def _oracle(pool: SimpleNamespace, slot: int, row: int) -> torch.Tensor:
    """fp64: S <- exp(g_t) S + d_t k_t^T over the row's records in commit order."""
    c = pool.mamba_cache
    s = c.temporal[:, slot].double()
    for t in range(int(pool.replayssm_spec_write_pos[row])):
        p = (int(pool.replayssm_cache_base[row]) + t) % L
        d = c.replayssm_d[:, row, :, p].double()
        k = c.replayssm_k[:, row, :, p].double()
        if c.replayssm_rawv is not None:
            d = d + c.replayssm_rawv[:, row, :, p].double()
            k = k + c.replayssm_rawk[:, row, :, p].double()
        k = k.repeat_interleave(HV // H, dim=1)  # value head hv reads key head hv // (HV // H)
        g = c.replayssm_g[:, row, :, p].double()
        s = torch.exp(g)[..., None, None] * s + d[..., :, None] * k[..., None, :]
    return s


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("lo", [False, True], ids=["fp32-records", "hi-lo-records"])
def test_fold_matches_the_fp64_recurrence_and_empties_the_ring(lo: bool) -> None:
    pool = _pool(lo=lo)
    view = spec_ring(pool)
    assert isinstance(view, SpecRing)
    slots, rows = torch.tensor([2, 4, 5, 1]), torch.tensor([1, 3, 4, 2])  # row 2 has no records
    want = {int(s): _oracle(pool, int(s), int(r)) for s, r in zip(slots, rows)}
    base_before = pool.replayssm_cache_base.clone()
    view.fold(slots, rows)
    for s, r in zip(slots.tolist(), rows.tolist()):
        assert _rel(pool.mamba_cache.temporal[:, s], want[s]) <= 1e-5
        assert int(pool.replayssm_spec_write_pos[r]) == 0 and int(pool.replayssm_is_flush[r]) == 0
    assert pool.replayssm_cache_base.tolist() == [0, (14 + 5) % L, 3, (9 + 12) % L, 3]
    assert base_before[2] == pool.replayssm_cache_base[2]


def test_fold_equals_sglangs_compact_commit_with_the_flush_forced() -> None:
    from sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode import commit_gdn_replayssm_circular

    ours, theirs = _pool(seed=3), _pool(seed=3)
    slots, rows = torch.tensor([2, 4, 5]), torch.tensor([1, 3, 4])
    spec_ring(ours).fold(slots, rows)  # type: ignore[union-attr]
    c = theirs.mamba_cache
    theirs.replayssm_is_flush[rows] = 1
    commit_gdn_replayssm_circular(
        checkpoint_state=c.temporal, d_cache=c.replayssm_d, k_cache=c.replayssm_k, g_cache=c.replayssm_g,
        d_residual_cache=None, k_residual_cache=None, state_batch_indices=slots, replay_indices=rows,
        write_pos=theirs.replayssm_spec_write_pos, cache_base=theirs.replayssm_cache_base,
        is_flush=theirs.replayssm_is_flush, accept_lens=torch.zeros(3, dtype=torch.int32))
    for s in slots.tolist():
        assert _rel(ours.mamba_cache.temporal[:, s], c.temporal[:, s]) <= 1e-5
    for name in ("replayssm_spec_write_pos", "replayssm_cache_base", "replayssm_is_flush"):
        assert getattr(ours, name)[rows].tolist() == getattr(theirs, name)[rows].tolist(), name


def test_views_only_the_gdn_circular_spec_ring() -> None:
    assert spec_ring(None) is None
    assert spec_ring(SimpleNamespace(replayssm_cache_base=None)) is None
    folding = _pool()
    folding.replayssm_spec_fold = True
    assert spec_ring(folding) is None
    kda = _pool()
    kda.mamba_cache.replayssm_g = torch.zeros(LAYERS, ROWS, HV, L, K)
    assert spec_ring(kda) is None


def _req(slot: int, row: int) -> SimpleNamespace:
    return SimpleNamespace(kv=SimpleNamespace(mamba_pool_idx=torch.tensor(slot), req_pool_idx=row, holds_mamba=True),
                           seqlen=1)


def _req_pool(pool: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(mamba_pool=pool, translate_mamba_indices=lambda x: x,
                           get_mamba_indices=lambda rows: torch.as_tensor(rows) + 1)


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_d1_finish_donation_is_the_full_state_only_with_the_fix(fix_on: bool) -> None:
    pool = _pool()
    want = _oracle(pool, 4, 3)
    donated = []

    def prepare(component, req, insert_params, token_ids_len, is_finished):  # SGLang keys temporal[slot]
        donated.append(component.cache.req_to_token_pool.mamba_pool.mamba_cache.temporal[:, 4].clone())

    component = SimpleNamespace(cache=SimpleNamespace(enable_mamba_extra_buffer=False, req_to_token_pool=_req_pool(pool)))
    with config.override(spec_finish_donation=fix_on):
        hooks.hook_fn("spec_finish_donation")(prepare, component, _req(4, 3), None, 64, False)  # unfinished: no fold
        assert int(pool.replayssm_spec_write_pos[3]) == 12
        hooks.hook_fn("spec_finish_donation")(prepare, component, _req(4, 3), None, 64, True)
    assert (_rel(donated[1], want) <= 1e-5) == fix_on
    assert (int(pool.replayssm_spec_write_pos[3]) == 0) == fix_on


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_d2_cpu_backup_is_the_full_state_only_with_the_fix(fix_on: bool) -> None:
    pool = _pool()
    want = _oracle(pool, 4, 3)
    backups = []

    def offload(req, req_to_token_pool, allocator):  # what SGLang's body backs up: temporal[slot] alone
        backups.append(req_to_token_pool.mamba_pool.mamba_cache.temporal[:, 4].clone())

    with config.override(spec_retract_backup=fix_on):
        hooks.hook_fn("spec_offload_backup")(offload, _req(4, 3), _req_pool(pool), None)
    err = _rel(backups[0], want)
    assert (err <= 1e-5) == fix_on, err


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_d3_d4_extend_forward_folds_every_spec_row_only_with_the_fix(fix_on: bool) -> None:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    pool = _pool()
    want = {5: _oracle(pool, 5, 4), 4: _oracle(pool, 4, 3)}
    runner = SimpleNamespace(req_to_token_pool=_req_pool(pool), is_draft_worker=False)
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, logical_forward_mode=None,
                            req_pool_indices=torch.tensor([4, 3]))
    seen = []
    with config.override(spec_extend_fold=fix_on):
        hooks.hook_fn("spec_fold_before_extend")(lambda r, b: seen.append(1), runner, batch)
    assert seen == [1]
    for slot, state in want.items():
        assert (_rel(pool.mamba_cache.temporal[:, slot], state) <= 1e-5) == fix_on
    verify = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, logical_forward_mode=None,
                             req_pool_indices=torch.tensor([1]))
    hooks.hook_fn("spec_fold_before_extend")(lambda r, b: None, runner, verify)
    assert int(pool.replayssm_spec_write_pos[1]) == 5  # a verify forward is never folded


@pytest.mark.parametrize(("mode", "streaming", "folds"), [("EXTEND", False, False), ("MIXED", False, True),
                                                        ("EXTEND", True, True)])
def test_d3_d4_only_extends_whose_rows_can_hold_records_fold(mode: str, streaming: bool, folds: bool) -> None:
    """With the server's args known, a plain extend (fresh or copied rows) skips the spec fold; a MIXED batch
    and a streaming-session server fold, as the decode ring's movers do."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    pool = _pool()
    pending = int(pool.replayssm_spec_write_pos[4])
    runner = SimpleNamespace(req_to_token_pool=_req_pool(pool), is_draft_worker=False,
                             server_args=SimpleNamespace(enable_streaming_session=streaming))
    batch = SimpleNamespace(forward_mode=ForwardMode[mode], logical_forward_mode=None,
                            req_pool_indices=torch.tensor([4, 3]))
    hooks.hook_fn("spec_fold_before_extend")(lambda r, b: None, runner, batch)
    assert pending > 0 and int(pool.replayssm_spec_write_pos[4]) == (0 if folds else pending)


@pytest.mark.parametrize(("length", "tokens", "bad"), [(16, 4, False), (12, 4, True), (4, 4, True), (8, 4, False)])
def test_d5_spec_ring_length_checked_at_startup(length: int, tokens: int, bad: bool) -> None:
    from sglang.srt.arg_groups import attention_hook
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    assert (spec_ring_error(length, tokens) is not None) == bad

    def handle() -> None:
        args = ServerArgs(model_path="dummy", enable_linear_replayssm_spec=True, linear_replayssm_cache_len=length,
                          speculative_num_draft_tokens=tokens, linear_attn_decode_backend="triton")
        with override_platform(is_cuda=False):
            attention_hook.handle_linear_attn_backend(args)

    with config.override(spec_ring_check=False):
        handle()  # SGLang 0.5.23 alone: no GDN check (memory_pool.py checks KDA only)
    if bad:
        with pytest.raises(ValueError, match=r"^sglang-replayssm: --linear-replayssm-cache-len") as info:
            handle()
        assert "\n" not in str(info.value)
    else:
        handle()


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_records_live_with_the_spec_ring_only_with_the_fix(fix_on: bool) -> None:
    """``record_spec_ring``: the GDN capture is wanted on a spec-ring pool (a plain extend forward)."""
    from sglang_replayssm.radix.records import capture as record_capture

    mode = SimpleNamespace(is_target_verify=lambda: False, is_draft_extend_v2=lambda: False)
    backend = SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=_pool(), mamba_ckpt_pool=None))
    with config.override(record_spec_ring=fix_on):
        assert record_capture._wanted(backend, SimpleNamespace(forward_mode=mode, spec_info=None)) == fix_on
        verify = SimpleNamespace(is_target_verify=lambda: True, is_draft_extend_v2=lambda: False)
        assert not record_capture._wanted(backend, SimpleNamespace(forward_mode=verify, spec_info=None))


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_records_end_state_copies_the_full_spec_state_only_with_the_fix(fix_on: bool) -> None:
    """extra_buffer finish with records (``end_state``) copies the working slot to the keep slot: with the
    spec ring the copy must carry the row's pending accepted records (``record_spec_ring`` folds them)."""
    from sglang_replayssm.radix.records.donation import end_state_before_finish_donation
    from sglang_replayssm.radix.records.pool import RecordPool, attach

    pool = _pool()
    want = _oracle(pool, 4, 3)
    temporal = pool.mamba_cache.temporal

    def copy(src: torch.Tensor, dst: torch.Tensor) -> None:  # MambaPool.copy_from: conv + temporal, slot to slot
        temporal[:, dst] = temporal[:, src]

    req_pool = SimpleNamespace(mamba_pool=pool, mamba_ckpt_pool=None, translate_mamba_indices=lambda x: x,
                               get_mamba_ping_pong_keep_idx=lambda req: 0, copy_mamba_state=copy)
    attach(req_pool, RecordPool(kv_size=8, capacity=4, device=torch.device("cpu")))
    req = _req(4, 3)
    req.kv.mamba_ping_pong_track_buffer = torch.tensor([2, 5])
    req.kv.mamba_last_track_seqlen = 32
    component = SimpleNamespace(cache=SimpleNamespace(enable_mamba_extra_buffer=True, page_size=1,
                                                      req_to_token_pool=req_pool))
    with config.override(end_state=True, record_spec_ring=fix_on):
        end_state_before_finish_donation(component, req, 40, True)
    assert req.kv.mamba_last_track_seqlen == 40
    assert (_rel(temporal[:, 2], want) <= 1e-5) == fix_on
