"""Records with HiCache (``radix/records/hicache/host_records.py``) on SGLang 0.5.23's real objects (CPU tensors).

A node's records go to host with its KV (``HybridCacheController.write``), its device copy is
evicted (the KV indices freed, their device records dropped), HiCache loads it back to new device
KV indices (``HybridCacheController.load``), and a later request that splits the loaded node hits at
the split depth: its state is rebuilt from the loaded records and checked, like every cached and
live state, against the fp64 oracle of its token path. With the ``record_hicache`` fix off the hit is
SGLang's (none). A planted state is kept out of host backups and locked until its rebuild runs.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.hicache import host_records as record_hicache
from sglang_replayssm.radix.records.pool import pool_of
from sglang_replayssm.state import peek
from tests.support import simulate_records
from tests.support.simulate import Sim, SimConfig, rel_err

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
SPLIT = 7  # a later prompt leaves PROMPT here: inside the node, no state at that depth


pytestmark = pytest.mark.usefixtures("radix_adapter", "hicache_on_cpu")  # tests/conftest.py


def _sim(write_policy: str = "write_through", kind: str = "gdn", **kw) -> Sim:
    """A records simulation (no_buffer) with ``UnifiedRadixCache.init_hicache`` (host 2x device)."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_replayssm.cpu import hooks_hicache

    sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4, mamba_slots=32, records=True, **kw))
    hooks_hicache.inject_ops()
    cfg = sim.cfg
    args = ServerArgs(model_path="dummy", page_size=1, mamba_radix_cache_strategy=cfg.strategy,
                      mamba_track_interval=cfg.track_interval, enable_linear_replayssm=True,
                      linear_replayssm_cache_len=cfg.ring_len, disable_overlap_schedule=True,
                      hicache_io_backend="kernel", hicache_mem_layout="page_first", hicache_ratio=2.0,
                      hicache_write_policy=write_policy)
    args._mamba_cache_chunk_size = cfg.chunk
    set_global_server_args_for_scheduler(args)
    sim.cache.init_hicache(args, sim.cache.cache_init_params)
    sim.cache.write_through_threshold = 1 << 30
    sim.cache.load_back_threshold = 0
    return sim


def _backup_tree(sim: Sim) -> None:
    """Back every device node up to host, parent first, and drain the acks (SGLang's kit)."""
    from sglang.test.kits.unified_radix_cache.fixtures import node_children, write_backup

    cache = sim.cache
    stack = list(node_children(cache, cache.root_node_handle()))
    while stack:
        node = stack.pop()
        if not cache.tree_core.is_backuped(node):
            write_backup(cache, node, write_back=True)
        stack.extend(node_children(cache, node))
    cache.writing_check(write_back=True)


def _load_back(sim: Sim, tokens: list[int]) -> None:
    """Load the host part of ``tokens``' path back to new device KV and wait for the copies."""
    match = sim.match(tokens)
    assert match.host_hit_length > 0
    assert sim.cache.load_back(match.best_match_node)
    assert sim.cache.ready_to_load_host_cache() != -1
    for ack in list(sim.cache.cache_controller.ack_load_queue):
        ack.finish_event.synchronize()
    sim.cache.loading_check()
    assert sim.match(tokens).host_hit_length == 0


def _device_kv(sim: Sim, tokens: list[int]) -> list[int]:
    """The device KV indices of ``tokens``' matched path, root first."""
    core = sim.cache.tree_core
    node = sim.match(tokens).last_device_node
    return core.collect_full_device_indices(node, sim.cache.root_node_handle()).tolist()


def _evicted_and_loaded_back(sim: Sim, write_policy: str) -> list[int]:
    """PROMPT prefilled (records, a state at its end), backed up, evicted, loaded back: returns
    the device KV indices its tokens had before the eviction."""
    sim.admit(PROMPT, [4])  # finishes at prefill: the node PROMPT keeps its end state
    old_kv = _device_kv(sim, PROMPT)
    if write_policy == "write_through":
        _backup_tree(sim)
    sim.evict(num_tokens=4096, mamba_num=32)  # write_back: the eviction backs the nodes up first
    match = sim.match(PROMPT)
    assert match.device_prefix_len == 0 and match.host_hit_length == len(PROMPT)
    _load_back(sim, PROMPT)
    return old_kv


@pytest.mark.parametrize("kind, write_policy", [("gdn", "write_through"), ("gdn", "write_back"),
                                               ("kda", "write_through")])
def test_records_backed_up_and_loaded_back_rebuild_exactly(kind, write_policy):
    with config.override(True):
        sim = _sim(write_policy, kind)
        try:
            old_kv = _evicted_and_loaded_back(sim, write_policy)
            new_kv = _device_kv(sim, PROMPT)
            pool = pool_of(sim.req_pool)
            host = pool.hicache.host
            assert host.backed_up >= len(PROMPT) and host.restored == len(PROMPT)
            # Every loaded KV index was handed out by the allocator (records dropped there): what the
            # device pool holds for them came back from host.
            assert bool((pool.slot_of[torch.tensor(new_kv)] >= 0).all())
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])
            assert q.matched == SPLIT, (q.matched, old_kv, new_kv)
            assert sim.rebuilds == 1
            sim.check()  # the planted node at depth SPLIT (and every other) vs the fp64 oracle
            planted = [slot for path, slot in sim.cached_nodes() if path == PROMPT[:SPLIT]]
            assert planted
            want = sim.model.oracle(PROMPT[:SPLIT])
            got = sim.slot_state(planted[0])
            assert max(rel_err(g, w) for g, w in zip(got, want)) <= 1e-5
            windows = sim.model.conv_window(PROMPT[:SPLIT])
            assert all(torch.equal(sim.conv[li, planted[0]], windows[li]) for li in range(len(windows)))
        finally:
            sim.cache.release_host_resources()


def test_without_the_switch_the_hit_is_sglangs():
    """``record_hicache`` off: records are not used while HiCache is on (the test above fails)."""
    with config.override(True, record_hicache=False):
        sim = _sim()
        try:
            _evicted_and_loaded_back(sim, "write_through")
            assert pool_of(sim.req_pool).hicache is None  # nothing was backed up
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])
            assert q.matched == 0 and getattr(sim, "rebuilds", 0) == 0
            sim.check()
        finally:
            sim.cache.release_host_resources()


def test_a_host_pool_too_small_falls_back(monkeypatch):
    """A 5-token host pool keeps the last 5 records of the node: the split needs the first 7, so the
    hit falls back to SGLang's, exactly."""
    monkeypatch.setenv(record_hicache.HOST_CAPACITY_ENV, "5")
    with config.override(True):
        sim = _sim()
        try:
            _evicted_and_loaded_back(sim, "write_through")
            host = pool_of(sim.req_pool).hicache.host
            assert host.capacity == 5 and host.restored == 5 and host.missed == len(PROMPT) - 5
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])
            assert q.matched == 0
            sim.check()
            # A split inside the last five tokens is still covered: hit at 11 from the state... none
            # above it but the root, so records 0..10 are needed: also a fallback.
            assert sim.admit(PROMPT[:11] + [0], [1]).matched == 0
            sim.check()
        finally:
            sim.cache.release_host_resources()


def test_host_kv_handed_out_again_carries_no_record():
    """The host pool's allocations invalidate host records (L3 prefetch, retraction backups)."""
    with config.override(True):
        sim = _sim()
        try:
            sim.admit(PROMPT, [4])
            _backup_tree(sim)
            host = pool_of(sim.req_pool).hicache.host
            node_host_kv = (host.slot_of[:-1] >= 0).nonzero().flatten()
            assert node_host_kv.numel() == len(PROMPT)
            anchor = sim.cache.cache_controller.mem_pool_host.anchor_entry.host_pool
            assert peek(anchor).host_records is host
            anchor.free(node_host_kv)  # as a host eviction would, then SGLang hands them out again
            assert bool((host.slot_of[node_host_kv] >= 0).all())  # a free does not drop them: reuse does
            again = anchor.alloc(anchor.available_size())  # every free host index, the freed ones too
            assert set(node_host_kv.tolist()) <= set(again.tolist())
            assert bool((host.slot_of[node_host_kv] == -1).all())
            anchor.free(again)
        finally:
            sim.cache.release_host_resources()


def _plant_without_forward(sim: Sim, tokens: list[int]):
    """An admission match that plants a state; the forward (and so the rebuild) has not run."""
    req = sim._new_req(tokens, 2)
    req.init_next_round_input(sim.cache)
    return req


@pytest.mark.parametrize("guards", ["on", "off"])
def test_a_planted_state_is_locked_and_not_backed_up_before_its_rebuild(guards, monkeypatch):
    """A planted node backed up (write-through) and evicted before its rebuild would keep the
    state its slot held before (a fresh slot's leftovers) on host; loaded back, it would be wrong.
    With the guards the backup leaves the mamba state out and the node stays on device (locked)
    until the rebuild has run."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.test.kits.unified_radix_cache.fixtures import node_host_value

    if guards == "off":
        monkeypatch.setattr(record_hicache, "lock_planted", lambda original, *a: original(*a))
        monkeypatch.setattr(record_hicache, "build_backup_spec", lambda original, *a: original(*a))
    with config.override(True):
        sim = _sim()
        try:
            sim.admit(PROMPT, [4])
            req = _plant_without_forward(sim, PROMPT[:SPLIT] + [0, 0])
            assert req.prefix_len == SPLIT and len(pool_of(sim.req_pool).pending) == 1
            node = sim.match(PROMPT[:SPLIT]).last_device_node
            _backup_tree(sim)
            host_state = node_host_value(sim.cache, node, ComponentType.MAMBA)
            assert (host_state is None) == (guards == "on")
            sim.evict(num_tokens=4096, mamba_num=32)
            still = [p for p, _ in sim.cached_nodes() if p == PROMPT[:SPLIT]]
            assert bool(still) == (guards == "on")  # locked until the rebuild is issued
            simulate_records.run_pending(sim)  # the next forward: the rebuild, then the locks go
            sim.check()
            sim.evict(num_tokens=4096, mamba_num=32)  # unlocked now: the node leaves the device
            assert not [p for p, _ in sim.cached_nodes() if p == PROMPT[:SPLIT]]
            if guards == "off":
                # the garbage that was backed up comes back with the node
                _load_back(sim, PROMPT[:SPLIT])
                with pytest.raises(AssertionError, match="rel err|conv window"):
                    sim.check()
        finally:
            sim.cache.release_host_resources()


@pytest.mark.parametrize("order", ["queue", "loads-first"])
def test_a_load_that_recycles_a_pending_rebuilds_records_runs_after_it(order, monkeypatch):
    """A 24-token device pool: B's 12 prompt records hold slots 0..11 (B keeps running), A's 12 the
    rest; A goes to host. A match inside B queues a rebuild reading slots 0..6, then A's load-back
    takes the first-in-first-out head, slots 0..11. The queued write of A's rows must come after that
    rebuild (queue order); written first, the rebuild folds A's inputs as B's."""
    if order == "loads-first":
        original = record_hicache.loaded_back

        def loads_first(*args):
            original(*args)
            state = peek(args[0].mem_pool_device_allocator).record_pool.hicache
            for load in state.loads:
                load.after = None

        monkeypatch.setattr(record_hicache, "loaded_back", loads_first)
    b_prompt = [5, 4, 3, 2, 1, 5, 4, 3, 2, 1, 9, 9]
    with config.override(True):
        sim = _sim(record_tokens=24)
        try:
            sim.admit(b_prompt, [1, 2, 3, 4, 5, 6])  # keeps running: its path stays on device
            sim.admit(PROMPT, [4])
            pool = pool_of(sim.req_pool)
            assert pool.head == 0 and pool.used == 24
            _backup_tree(sim)
            sim.evict(num_tokens=4096, mamba_num=32)
            assert sim.match(PROMPT).host_hit_length == len(PROMPT)
            req = _plant_without_forward(sim, b_prompt[:SPLIT] + [0, 0])
            assert req.prefix_len == SPLIT
            (job,) = pool.pending
            assert job.slots.tolist() == list(range(SPLIT))
            _load_back(sim, PROMPT)
            assert pool.head == 12 and len(pool.hicache.loads) == 1
            simulate_records.run_pending(sim)
            if order == "loads-first":
                with pytest.raises(AssertionError, match="rel err"):
                    sim.check()
                return
            sim.check()  # the planted node inside B, B's live state, the restored node: exact
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])  # and A's loaded records serve a hit in A
            assert q.matched == SPLIT
            sim.check()
        finally:
            sim.cache.release_host_resources()


def test_rows_a_queued_load_has_not_written_are_not_backed_up():
    """A device->host write of KV whose records are a queued (not yet written) load: those host rows
    are marked without a record, so they never come back as another token's inputs."""
    with config.override(True):
        sim = _sim()
        try:
            _evicted_and_loaded_back(sim, "write_through")
            pool = pool_of(sim.req_pool)
            assert len(pool.hicache.loads) == 1  # no forward since the load-back
            kv = torch.tensor(_device_kv(sim, PROMPT))
            controller = sim.cache.cache_controller
            host_kv = controller.write(kv, flush=True)  # e.g. a PD decode offload of these tokens
            assert host_kv is not None
            host = pool.hicache.host
            assert not bool(host.valid[host.slot_of[host_kv]].any())
            simulate_records.run_pending(sim)
            host_kv2 = controller.write(kv, flush=True)  # after the forward: the rows are there
            assert bool(host.valid[host.slot_of[host_kv2]].all())
        finally:
            sim.cache.cache_controller.ack_write_queue.clear()
            sim.cache.release_host_resources()


def _evicted_leaf(sim: Sim, head: list[int], tail: list[int]) -> None:
    """``head`` (state at its end, on device) and ``head + tail`` prefilled and backed up; then only
    the leaf ``tail`` leaves the device (KV and state): the path is device to ``head``, host after."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    sim.admit(head, [4])
    sim.admit(head + tail, [4])
    _backup_tree(sim)
    sim.cache.evict(EvictParams(num_tokens=len(tail)))
    match = sim.match(head + tail)
    assert match.device_prefix_len == len(head) and match.full_kv_hit_length == len(head + tail)


def _admit_production_api(sim: Sim, prompt: list[int]):
    """``sim.admit`` with the tree core's test-kit-only ``get_parent_node_id`` refused (the kit's
    inspector has it, SGLang's ``UnifiedTreeCore`` does not): the match uses production API only."""
    from sglang.test.kits.unified_radix_cache.unified_tree_core_inspector import UnifiedTreeCoreInspector

    def absent(*args):
        raise AttributeError("'UnifiedTreeCore' object has no attribute 'get_parent_node_id'")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(UnifiedTreeCoreInspector, "get_parent_node_id", absent)
        return sim.admit(prompt, [1])


@pytest.mark.parametrize("where, switch", [("all-on-host", "on"), ("all-on-host", "off"), ("device-state-above", "on"),
                                           ("device-state-above", "off"), ("kda-device-state-above", "on")])
def test_a_match_into_host_nodes_past_the_deepest_state_hits_the_kv_depth(where, switch):
    """The walk runs on into host-only nodes that hold no state where the prompt leaves them: SGLang
    loads nothing back (no state there, ``host_hit_length`` 0) and the request recomputes from the
    deepest state. With ``record_host_hits`` the KV is loaded back, the state at the KV depth is
    planted and rebuilt from the host records (from the zero state, or from the device state above),
    and the hit reaches the KV depth, exact against the fp64 oracle."""
    with config.override(True, record_host_hits=switch == "on"):
        sim = _sim(kind="kda" if where.startswith("kda") else "gdn")
        try:
            if where == "all-on-host":
                sim.admit(PROMPT, [4])
                _backup_tree(sim)
                sim.evict(num_tokens=4096, mamba_num=32)
                prompt, depth, state_at = PROMPT[:SPLIT] + [0, 0], SPLIT, 0
            else:
                head, tail = PROMPT[:8], PROMPT[8:]
                _evicted_leaf(sim, head, tail)
                prompt, depth, state_at = head + tail[:2] + [0], 10, 8
            match = sim.match(prompt)
            assert match.host_hit_length == 0 and match.full_kv_hit_length == depth
            assert int(match.device_prefix_len) == state_at
            rebuilds = getattr(sim, "rebuilds", 0)
            q = _admit_production_api(sim, prompt)
            if switch == "off":
                assert q.matched == state_at  # SGLang's: from the deepest state
                sim.check()
                return
            assert q.matched == depth and sim.rebuilds == rebuilds + 1
            sim.check()  # the planted node at the KV depth (and every other) vs the fp64 oracle
            planted = [slot for path, slot in sim.cached_nodes() if path == prompt[:depth]]
            assert planted
            want = sim.model.oracle(prompt[:depth])
            assert max(rel_err(g, w) for g, w in zip(sim.slot_state(planted[0]), want)) <= 1e-5
        finally:
            sim.cache.release_host_resources()


@pytest.mark.parametrize("fallback", ["recompute", "keep-the-load"])
def test_a_host_hit_whose_plant_fails_after_the_load_recomputes_from_the_deepest_state(fallback, monkeypatch):
    """If the state cannot be planted once the KV is loaded (e.g. a record lost to a racing load),
    ``init_load_back`` reports nothing loaded and the request recomputes from the deepest state,
    exact. Keeping SGLang's load result instead would resume the KV depth from that shallower state:
    the oracle check fails."""
    from sglang_replayssm.radix.records.hicache import host_hits as record_host_hits

    monkeypatch.setattr(record_host_hits, "_plant", lambda *a: False)
    if fallback == "keep-the-load":
        original = record_host_hits.load_back_hook

        def keep(orig, cache, params):  # the hook, but SGLang's load result returned whatever it says
            loaded = []
            original(lambda *a: loaded.append(orig(*a)) or loaded[0], cache, params)
            return loaded[0]

        monkeypatch.setattr(record_host_hits, "load_back_hook", keep)
    with config.override(True):
        sim = _sim()
        try:
            head, tail = PROMPT[:8], PROMPT[8:]
            _evicted_leaf(sim, head, tail)
            prompt = head + tail[:2] + [0]
            if fallback == "keep-the-load":
                with pytest.raises(AssertionError, match="rel err|conv window"):
                    sim.admit(prompt, [1])
                    sim.check()
                return
            q = sim.admit(prompt, [1])
            assert q.matched == len(head)
            sim.check()
        finally:
            sim.cache.release_host_resources()
