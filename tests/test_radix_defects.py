"""Regression tests, one per ReplaySSM radix-cache defect, each run with the adapter on and off.

Every test drives SGLang 0.5.23's real ``UnifiedRadixCache`` / ``HybridReqToTokenPool`` /
``MambaPool`` (decode ring on, CPU tensors, built by SGLang's unit-test kit) through
:mod:`tests.support.simulate`, and compares states with the fp64 recurrence of the token
path (relative error <= 1e-5). With the adapter off (every fix switched off, i.e. SGLang's own
code runs) each test asserts that the defect shows; with it on, that it is gone. Ring length L=4,
K=V=32, GDN (H=1, HV=2) and KDA (H=HV=2); track intervals that divide L and that do not.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix import config, hooks
from tests.support.simulate import Sim, SimConfig, rel_err

TOL = 1e-5
ADAPTER = pytest.mark.parametrize("adapter_on", [True, False], ids=["adapter-on", "adapter-off"])
KINDS = pytest.mark.parametrize("kind", ["gdn", "kda"])


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    assert {h.target for h in radix_adapter} == {h.target for h in hooks.HOOKS}


def _node_at(sim: Sim, path: list[int]) -> tuple[list[int], int] | None:
    """The deepest cached node whose path is a prefix of ``path``."""
    best = None
    for node_path, slot in sim.cached_nodes():
        if node_path == path[: len(node_path)] and (best is None or len(node_path) > len(best[0])):
            best = (node_path, slot)
    return best


# ---- 4. no_buffer finish donation -------------------------------------------------------------


@KINDS
@pytest.mark.parametrize("interval", [3, 4], ids=["interval3", "interval4"])
@ADAPTER
def test_no_buffer_finish_donates_exact_state_at_full_depth(kind, interval, adapter_on):
    """SGLang keys the finished state at ``len - write_pos`` with the conv window of ``len``; the
    adapter materialises the ring and donates at ``len`` with conv and temporal of that depth."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=interval))
        a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8])
        wp = sim.decode_until_pending(a, min_steps=4)
        sim.check()  # the live ring is exact
        path = a.consumed
        sim.finish_now(a)
        node_path, _ = _node_at(sim, path)
        problems = sim.node_problems(TOL)
        if adapter_on:
            assert len(node_path) == len(path)
            assert problems == []
        else:
            assert len(node_path) == len(path) - wp
            assert any("conv window of another depth" in p for p in problems), problems
        # A later request sharing the whole path resumes from the donated depth.
        b = sim.admit(path + [2, 3], [4, 5, 6])
        assert b.matched == (len(path) if adapter_on else len(path) - wp)
        sim.decode()
        assert sim.live_problems(TOL) == []


# ---- 1 + 2. KDA snapshot at decode track boundaries (extra_buffer) ------------------------------

KDA_FIXES = {
    "adapter-off": {},
    "force-flush-only": {"kda_force_flush": True, "cursor_reset": True},
    "materialize-only": {"materialize_track": True, "cursor_reset": True},
    # the skip must not apply where nothing force-flushed (KDA without kda_force_flush)
    "materialize-skip": {"materialize_track": True, "track_flush_skip": True, "cursor_reset": True},
    "adapter-on": dict.fromkeys(config.FIXES, True),
}


@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
@pytest.mark.parametrize("interval", [2, 3, 6, 8], ids=lambda i: f"interval{i}")
@pytest.mark.parametrize("fixes", list(KDA_FIXES))
def test_kda_decode_track_snapshot_is_exact(strategy, interval, fixes):
    """KDA is not force-flushed at track boundaries, so SGLang's decode track copies a checkpoint
    lagging by the pending records. Either KDA fix alone (force flush, or materialising the
    snapshot) makes every tracked node exact; intervals 2 and 8 divide / are multiples of L=4,
    3 and 6 are not."""
    with config.override(False, **KDA_FIXES[fixes]):
        sim = Sim(SimConfig(kind="kda", strategy=strategy, track_interval=interval))
        a = sim.admit([1, 2, 3, 4, 5], [(3 * j + 1) % 10 for j in range(2 * interval + 9)])
        problems = []
        while sim.running:
            sim.decode()
            problems += sim.node_problems(TOL)
            assert sim.live_problems(TOL) == []
        tracked = [p for p, _ in sim.cached_nodes() if len(p) > 5]
        assert tracked, "no decode track snapshot was taken"
        if fixes == "adapter-off":
            assert any("temporal rel err" in p for p in problems), problems
        else:
            assert problems == []
        del a


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@ADAPTER
def test_decode_track_with_sglang_triton_copy_kernel(kind, adapter_on):
    """Same check with SGLang's own Triton track-copy kernel (interpreted) instead of the torch
    stand-in; GDN is exact in SGLang already (it force-flushes), KDA only with the adapter."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy="extra_buffer", track_interval=3, triton_track_copy=True))
        sim.admit([1, 2, 3, 4, 5], [(3 * j + 1) % 10 for j in range(8)])
        problems = []
        while sim.running:
            sim.decode()
            problems += sim.node_problems(TOL)
        broken = kind == "kda" and not adapter_on
        assert bool(problems) == broken, problems


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("skip", [False, True], ids=["fold", "skip"])
def test_track_fold_skipped_where_the_force_flush_covers(kind, skip, monkeypatch):
    """With every fix on, the step's force flush has emptied each tracked row's ring, so the track
    snapshot's fold is skipped (``track_flush_skip``) and every tracked node stays exact; with the
    skip off the fold runs on the track steps (and finds nothing to fold)."""
    from sglang_replayssm.radix.ring.pool import RingPool

    calls = []
    original = RingPool.materialize

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("layers"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RingPool, "materialize", counting)
    with config.override(True, track_flush_skip=skip):
        sim = Sim(SimConfig(kind=kind, strategy="extra_buffer", track_interval=3))
        sim.admit([1, 2, 3, 4, 5], [(3 * j + 1) % 10 for j in range(10)])
        problems, folds = [], 0
        while sim.running:
            calls.clear()
            sim.decode()
            problems += sim.node_problems(TOL)
            folds += len(calls)
        assert problems == []
        assert (folds == 0) if skip else (folds > 0)
        assert [p for p, _ in sim.cached_nodes() if len(p) > 5], "no decode track snapshot was taken"


@ADAPTER
def test_kda_force_flush_fires_on_track_steps(adapter_on):
    """With the fix, a KDA working slot's ring is empty right after every track-boundary step."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind="kda", strategy="extra_buffer", track_interval=3))
        a = sim.admit([1, 2, 3, 4, 5], [(3 * j + 1) % 10 for j in range(12)])
        slot = int(a.req.kv.mamba_pool_idx)
        at_boundary = []
        while sim.running:
            sim.decode()
            if a.req.kv.kv_committed_len % sim.track_grid == 0:
                at_boundary.append(int(sim.write_pos[slot]))
        assert at_boundary
        if adapter_on:
            assert at_boundary == [0] * len(at_boundary)
        else:
            assert any(wp > 0 for wp in at_boundary)


# ---- 3. one choke point for cursors ---------------------------------------------------------------


def _stale_slot(sim: Sim) -> tuple[int, int]:
    """Leave a free mamba slot whose cursor still counts its aborted owner's records."""
    c = sim.admit([9, 8, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    slot = int(c.req.kv.mamba_pool_idx)
    with config.override(kda_force_flush=False):
        wp = sim.decode_until_pending(c, min_steps=1)
    sim.abort(c)  # SGLang's abort / retract release: the slot is freed with its cursor as is
    return slot, wp


@KINDS
@pytest.mark.parametrize("strategy", ["extra_buffer", "extra_buffer_lazy"])
@ADAPTER
def test_extra_buffer_donated_ping_pong_slot_has_empty_ring(kind, strategy, adapter_on):
    """A ping-pong track slot is allocated without a cursor reset; when it recycles a slot freed
    with pending records, the extra_buffer donation puts a slot with a foreign cursor into the
    tree, and copying from it trips SGLang's own invariant check (SGLANG_DEBUG_MEMORY_POOL)."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy=strategy, track_interval=3))
        stale, wp = _stale_slot(sim)
        assert wp > 0 and int(sim.write_pos[stale]) == wp
        free = sim.req_pool.mamba_allocator.free_slots.tolist()
        other = [s for s in free if s != stale]
        sim.next_mamba_slots([other[0], stale])  # working slot, then the first ping-pong slot
        b = sim.admit([1, 2, 3, 4, 5, 6], [7, 8])  # prefill tracks at 6 into ping-pong slot 0
        node_path, node_slot = _node_at(sim, [1, 2, 3, 4, 5, 6])
        assert (len(node_path), node_slot) == (6, stale), "the recycled slot was not donated"
        problems = sim.node_problems(TOL)
        sim.mamba_pool.debug_memory_pool = True  # SGLang's debug invariant: copy sources are flushed
        if adapter_on:
            assert problems == []
            c = sim.admit([1, 2, 3, 4, 5, 6, 7], [8, 9])  # copy-on-write from the donated slot
            assert c.matched == 6
            sim.check()
        else:
            assert any("write_pos" in p for p in problems), problems
            with pytest.raises(AssertionError, match="fully-flushed ReplaySSM source"):
                sim.admit([1, 2, 3, 4, 5, 6, 7], [8, 9])
        del b


@KINDS
@ADAPTER
def test_load_back_slot_starts_with_empty_ring(kind, adapter_on):
    """HiCache load-back allocates the request's slot with ``MambaComponent._alloc_request_state_
    slot`` and copies a host checkpoint into it without a cursor reset; a recycled slot then folds
    its previous owner's records onto the loaded state at the first decode."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4))
        a = sim.admit([1, 2, 3, 4, 5, 6], [7])  # finishes at prefill: node at depth 6
        node_path, node_slot = _node_at(sim, [1, 2, 3, 4, 5, 6])
        host_copy = sim.mamba_pool.get_cpu_copy(torch.tensor([node_slot]))
        stale, wp = _stale_slot(sim)
        sim.next_mamba_slots([stale])
        req = sim._new_req([1, 2, 3, 4, 5, 6, 7], 2)
        dst = sim.mamba_component._alloc_request_state_slot(req)  # load-back's allocation
        assert int(dst) == stale
        sim.mamba_pool.load_cpu_copy(host_copy, dst)  # the host -> device copy of the node state
        loaded = sim.slot_state(stale)  # what the next decode step reads: checkpoint + live records
        want = sim.model.oracle(node_path)
        errs = [rel_err(loaded[li], want[li]) for li in range(len(want))]
        if adapter_on:
            assert int(sim.write_pos[stale]) == 0
            assert max(errs) <= TOL
        else:
            assert int(sim.write_pos[stale]) == wp
            assert max(errs) > 1e-2
        del a


@KINDS
@ADAPTER
def test_int8_checkpoint_cow_destination_starts_with_empty_ring(kind, adapter_on):
    """With ``--enable-int8-mamba-checkpoint`` copy-on-write loads the int8 node state into the
    request slot with ``MambaCheckpointPool.load_to_active``, which does not reset the cursor; a
    recycled destination then decodes from the dequantised checkpoint plus foreign records."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4))
        cache = sim.mamba_pool.mamba_cache
        hv, v, k = cache.temporal.shape[2:]
        sim.req_pool.mamba_ckpt_pool = MambaCheckpointPool(
            num_layers=sim.cfg.mamba_layers,
            num_slots=8,
            num_heads=hv,
            head_v_dim=v,
            head_k_dim=k,
            conv_shapes=[tuple(c.shape[2:]) for c in cache.conv],
            conv_dtype=cache.conv[0].dtype,
            device="cpu",
            temporal_dtype=cache.temporal.dtype,
        )
        sim.admit([1, 2, 3, 4, 5, 6], [7])  # donated as an int8 checkpoint at depth 6
        stale, wp = _stale_slot(sim)
        sim.next_mamba_slots([stale])
        b = sim.admit([1, 2, 3, 4, 5, 6, 7, 8], [9, 1])  # COW destination = the recycled slot
        assert b.matched == 6 and int(b.req.kv.mamba_pool_idx) == stale
        got = sim.slot_state(stale)
        ckpt = [cache.temporal[li, stale] for li in range(sim.cfg.mamba_layers)]
        errs = [rel_err(got[li], ckpt[li]) for li in range(len(ckpt))]
        if adapter_on:
            assert int(sim.write_pos[stale]) == 0 and max(errs) == 0.0
        else:
            assert int(sim.write_pos[stale]) == wp and max(errs) > 1e-2


# ---- 2. exact copies of a slot with pending records ---------------------------------------------


@KINDS
@pytest.mark.parametrize("debug_pool", [False, True], ids=["release", "debug-pool"])
@ADAPTER
def test_copy_from_unflushed_source_is_exact(kind, debug_pool, adapter_on):
    """``MambaPool.copy_from`` copies ``temporal`` only; from a working slot with pending records
    the copy is stale (SGLang asserts against it only under SGLANG_DEBUG_MEMORY_POOL). The adapter
    materialises the source's records into the destination and leaves the source untouched."""
    with config.override(adapter_on):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4))
        a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4])
        sim.decode_until_pending(a, min_steps=2)
        src = int(a.req.kv.mamba_pool_idx)
        cache = sim.mamba_pool.mamba_cache
        before = [
            t[:, src].clone()
            for t in (cache.temporal, cache.replayssm_d, cache.replayssm_k, cache.replayssm_g)
        ]
        wp_before = int(sim.write_pos[src])
        dst = sim.req_pool.mamba_allocator.alloc(1)
        sim.mamba_pool.debug_memory_pool = debug_pool
        if debug_pool and not adapter_on:
            with pytest.raises(AssertionError, match="fully-flushed ReplaySSM source"):
                sim.req_pool.copy_mamba_state(torch.tensor([src]), dst)
            return
        sim.req_pool.copy_mamba_state(torch.tensor([src]), dst)
        got = sim.slot_state(int(dst))
        want = sim.model.oracle(a.consumed)
        errs = [rel_err(got[li], want[li]) for li in range(len(want))]
        assert max(errs) <= TOL if adapter_on else max(errs) > 1e-3
        # The live source is not disturbed: checkpoint, ring and cursor unchanged, still exact.
        after = [t[:, src] for t in (cache.temporal, cache.replayssm_d, cache.replayssm_k, cache.replayssm_g)]
        assert all(torch.equal(x, y) for x, y in zip(before, after))
        assert int(sim.write_pos[src]) == wp_before
        sim.decode()
        assert sim.live_problems(TOL) == []


# ---- an SGLang defect outside the ring: lazy ping-pong without overlap ---------------------------


def test_sglang_lazy_extra_buffer_needs_overlap_sized_ping_pong():
    """Not a ring defect, found on the way: with overlap scheduling off SGLang builds a one-entry
    ping-pong buffer, and ``mamba_lazy_prealloc_at_boundary`` indexes entry 1 at the first decode
    track boundary. The adapter's admission refuses extra_buffer_lazy without overlap."""
    sim = Sim(SimConfig(kind="gdn", strategy="extra_buffer_lazy", track_interval=2, overlap=False))
    assert sim.req_pool.mamba_ping_pong_track_buffer_size == 1
    sim.admit([1, 2, 3], [1, 2, 3, 4])
    with pytest.raises(IndexError):
        while sim.running:
            sim.decode()
