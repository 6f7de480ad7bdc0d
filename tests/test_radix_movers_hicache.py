"""Issue 4, HiCache on SGLang 0.5.23's real objects (CPU tensors): a radix node backed up to host
holds an exact state, and every host->device load (node restore and per-request copy) leaves its
destination with an empty ring.

No HiCache-specific code is needed for either: with the adapter, no radix node's slot can hold
pending ring records (a node's state is donated by a materialising finish, a materialising copy, or
a track slot that never decodes; the property suite asserts ``write_pos == 0`` on every node after
every step), so the device->host backup of ``conv + temporal`` is the full state; and both load
destinations are allocated through ``MambaSlotAllocator.alloc`` (the request slot by
``MambaComponent._alloc_request_state_slot``, the node-restore slot by the host pool group's
``device_alloc_fn``), where the cursor choke point empties the ring. This test drives the real
backup -> device eviction -> load-back cycle (``write_backup``/``writing_check``, ``evict``,
``load_back``/``ready_to_load_host_cache``/``loading_check``) with stale free slots waiting to be
reused, once with every fix on and once with ``finish_donation`` / ``cursor_reset`` off.
"""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.radix import config
from tests.support.simulate import Sim, SimConfig, rel_err

TOL = 1e-5


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


def _with_hicache(sim: Sim, monkeypatch: pytest.MonkeyPatch, write_policy: str, layout: str) -> None:
    """``UnifiedRadixCache.init_hicache`` on the simulation's cache (host pools sized 2x device)."""
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_replayssm.cpu import hooks_hicache

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)  # no driver on CPU
    hooks_hicache.inject_ops()
    cfg = sim.cfg
    args = ServerArgs(
        model_path="dummy",
        page_size=1,
        mamba_radix_cache_strategy=cfg.strategy,
        mamba_track_interval=cfg.track_interval,
        enable_linear_replayssm=True,
        linear_replayssm_cache_len=cfg.ring_len,
        disable_overlap_schedule=True,
        hicache_io_backend="direct" if layout == "page_first_direct" else "kernel",
        hicache_mem_layout=layout,
        hicache_write_policy=write_policy,
        hicache_ratio=2.0,
    )
    args._mamba_cache_chunk_size = cfg.chunk
    set_global_server_args_for_scheduler(args)
    sim.cache.init_hicache(args, sim.cache.cache_init_params)
    sim.cache.write_through_threshold = 1 << 30
    sim.cache.load_back_threshold = 0


def _node_id(sim: Sim, path: list[int]) -> int:
    return sim.match(path).last_device_node


def _stale_free_slots(sim: Sim, n: int) -> list[int]:
    """``n`` free slots whose cursors still count an aborted owner's records."""
    out = []
    for i in range(n):
        c = sim.admit([9, 8, 7 - i], [(j * 5 + i) % 10 for j in range(12)])
        slot = int(c.req.kv.mamba_pool_idx)
        for _ in range(6):
            sim.decode([c])
            if int(sim.write_pos[slot]) > 0:
                break
        assert int(sim.write_pos[slot]) > 0
        sim.abort(c)
        out.append(slot)
    return out


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
@pytest.mark.parametrize("fixes", ["adapter-on", "finish_donation-off", "cursor_reset-off"])
def test_backup_evict_load_back_round_trip_is_exact(kind, layout, write_policy, fixes, monkeypatch):
    from sglang.test.kits.unified_radix_cache.fixtures import node_parent, write_backup

    switches = {"adapter-on": {}, "finish_donation-off": {"finish_donation": False},
                "cursor_reset-off": {"cursor_reset": False}}[fixes]
    with config.override(True, **switches):
        sim = Sim(SimConfig(kind=kind, strategy="no_buffer", track_interval=4, mamba_slots=16))
        _with_hicache(sim, monkeypatch, write_policy, layout)
        try:
            a = sim.admit([1, 2, 3, 4, 5], [6, 7, 8, 9, 1, 2, 3, 4, 5, 6])
            slot = int(a.req.kv.mamba_pool_idx)
            while int(sim.write_pos[slot]) == 0 or len(a.req.output_ids) < 6:
                sim.decode([a])
            path, pending = a.consumed, int(sim.write_pos[slot])
            sim.finish_now(a)  # no_buffer finish donation of a slot with pending records
            node = _node_id(sim, path)
            # SGLang keys the lagging checkpoint at len - write_pos; the adapter donates at len.
            assert sim.match(path).device_prefix_len == len(path) - (pending if fixes == "finish_donation-off" else 0)
            node_path = path[: sim.match(path).device_prefix_len]
            # Device -> host backup of the node's path, then evict the device copies.
            # write_through: back the path up now (parent first, drained like SGLang's kit does);
            # write_back: the device eviction itself backs the nodes up.
            chain, cur, root = [], node, sim.cache.root_node_handle()
            while cur is not None and cur != root:
                chain.append(cur)
                cur = node_parent(sim.cache, cur)
            if write_policy == "write_through":
                for n in reversed(chain):
                    if not sim.cache.tree_core.is_backuped(n):
                        assert write_backup(sim.cache, n, write_back=True) > 0
                sim.cache.writing_check(write_back=True)
                assert all(sim.cache.tree_core.is_backuped(n) for n in chain)
            sim.evict(num_tokens=4096, mamba_num=16)
            assert all(sim.cache.tree_core.is_backuped(n) for n in chain)
            assert sim.match(node_path).device_prefix_len == 0
            # Two stale slots wait at the head of the free list: the node-restore slot and the
            # request slot of the load-back will be these.
            stale = _stale_free_slots(sim, 2)
            sim.next_mamba_slots(stale)
            req = sim._new_req(node_path + [3, 3], 2)
            assert sim.cache.load_back(node, req=req)
            assert sim.cache.ready_to_load_host_cache() != -1
            for ack in list(sim.cache.cache_controller.ack_load_queue):
                ack.finish_event.synchronize()
            sim.cache.loading_check()
            restored = [s for p, s in sim.cached_nodes() if p == node_path]
            req_slot = int(req.kv.mamba_pool_idx)
            assert restored and {restored[0], req_slot} == set(stale)
            want = sim.model.oracle(node_path)
            windows = sim.model.conv_window(node_path)
            for s in (restored[0], req_slot):
                state = sim.slot_state(s)  # checkpoint + whatever the cursor says is pending
                errs = [rel_err(state[li], want[li]) for li in range(len(want))]
                convs_ok = all(torch.equal(sim.conv[li, s], windows[li]) for li in range(len(windows)))
                if fixes == "cursor_reset-off":
                    assert int(sim.write_pos[s]) > 0 and max(errs) > 1e-3
                    continue
                assert int(sim.write_pos[s]) == 0 and max(errs) <= TOL, errs
                # SGLang's own finish keys the lagging temporal with the live conv window.
                assert convs_ok == (fixes == "adapter-on")
            if fixes == "adapter-on":
                assert sim.node_problems(TOL) == []
        finally:
            sim.cache.release_host_resources()
