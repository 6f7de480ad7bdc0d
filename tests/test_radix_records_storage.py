"""Records through HiCache's L3 storage (``radix/records/hicache/storage.py``) with SGLang 0.5.23's real file
backend (``HiCacheFile``), tree, host pools and controller (CPU).

A node's records are staged at its storage backup (``write_storage``), written beside its pages by
the backup thread's ``_page_backup`` under the page hashes SGLang computes, read back by a *second*
``HiCacheFile`` on the same directory (another server process) at a prefetch's ``_page_transfer``,
and made host records of the prefetched host KV at ``_handle_prefetch_result``. The node's own host
records are dropped first (as for a node that came from storage), so the hit inside the loaded-back
node can only come from what storage returned: exact against the fp64 oracle; with the
``record_storage`` switch off, SGLang's (none).
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix import hooks as radix_hooks
from sglang_replayssm.radix.records.hicache import storage as record_storage
from sglang_replayssm.radix.records.pool import pool_of
from tests.support.simulate import Sim, SimConfig, rel_err

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
SPLIT = 7


pytestmark = pytest.mark.usefixtures("radix_adapter", "hicache_on_cpu")  # tests/conftest.py


def _sim() -> Sim:
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from sglang_replayssm.cpu import hooks_hicache

    sim = Sim(SimConfig(kind="gdn", strategy="no_buffer", track_interval=4, mamba_slots=32, records=True))
    hooks_hicache.inject_ops()
    cfg = sim.cfg
    args = ServerArgs(model_path="dummy", page_size=1, mamba_radix_cache_strategy=cfg.strategy,
                      mamba_track_interval=cfg.track_interval, enable_linear_replayssm=True,
                      linear_replayssm_cache_len=cfg.ring_len, disable_overlap_schedule=True,
                      hicache_io_backend="kernel", hicache_mem_layout="page_first", hicache_ratio=2.0,
                      hicache_write_policy="write_through")
    args._mamba_cache_chunk_size = cfg.chunk
    set_global_server_args_for_scheduler(args)
    sim.cache.init_hicache(args, sim.cache.cache_init_params)
    sim.cache.write_through_threshold = 1 << 30
    sim.cache.load_back_threshold = 0
    return sim


def _file_backend(path):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="tiny-gdn")
    return HiCacheFile(cfg, file_path=str(path))


def _registered(name: str):
    """The hook as registered (behind its switch), so the switch-off case is SGLang's path."""
    (hook,) = [h for h in radix_hooks.HOOKS if h.name == name]
    return hook.fn


def _node_on_host(sim: Sim):
    """PROMPT prefilled, backed up to host, evicted from device: ``(node, host KV, page hashes)``."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.test.kits.unified_radix_cache.fixtures import node_host_value, write_backup

    sim.admit(PROMPT, [4])
    node = sim.match(PROMPT).last_device_node
    write_backup(sim.cache, node, write_back=True)
    sim.cache.writing_check(write_back=True)
    sim.evict(num_tokens=4096, mamba_num=32)
    host_kv = node_host_value(sim.cache, node, ComponentType.FULL)
    return node, host_kv, get_storage_hash_str(PROMPT, None, page_size=1)


@pytest.mark.parametrize("switch", ["on", "off"])
def test_records_stored_beside_pages_come_back_with_a_prefetch_in_another_process(tmp_path, monkeypatch, switch):
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    with config.override(True, record_storage=switch == "on"):
        sim = _sim()
        try:
            node, host_kv, hashes = _node_on_host(sim)
            controller = sim.cache.cache_controller
            host = pool_of(sim.req_pool).hicache.host
            before = record_storage.snapshot(host, host_kv, 1)
            assert len(before) == len(PROMPT)  # every page has its host records

            # Backup to storage: staged on the scheduler thread, written after SGLang's pages.
            writer = _file_backend(tmp_path)
            monkeypatch.setattr(controller, "storage_backend", writer, raising=False)
            _registered("stage_records_for_storage")(lambda *a, **k: 7, controller, host_kv, PROMPT, hashes)
            op = types.SimpleNamespace(host_indices=host_kv, hash_value=hashes, completed_tokens=0)

            def sglang_pages(_controller, operation):
                operation.completed_tokens = len(hashes)  # SGLang wrote every KV page

            _registered("store_records_beside_pages")(sglang_pages, controller, op)
            files = sorted(p.name for p in tmp_path.iterdir() if record_storage.KEY_TAG in p.name)
            assert len(files) == (len(PROMPT) if switch == "on" else 0)
            assert all(f.startswith(tuple(hashes)) for f in files)

            # The node's host records are gone (a node that came from storage has none of its own).
            host.invalidate(host_kv)
            assert record_storage.snapshot(host, host_kv, 1) == []

            # Prefetch in "another process": a fresh backend on the same directory reads the pages.
            monkeypatch.setattr(controller, "storage_backend", _file_backend(tmp_path), raising=False)
            fetch = types.SimpleNamespace(hash_value=hashes, host_indices=host_kv, completed_tokens=len(PROMPT))
            _registered("read_records_with_pages")(lambda *a: None, controller, fetch)
            _registered("prefetched_records_to_host")(lambda *a: None, sim.cache, fetch)
            after = record_storage.snapshot(host, host_kv, 1)
            if switch == "off":
                assert after == []
            else:
                assert [p for p, _ in after] == [p for p, _ in before]
                assert all(torch.equal(a, b) for (_, a), (_, b) in zip(after, before))

            # Loaded back and hit inside the node: rebuilt from the stored records, or SGLang's miss.
            match = sim.match(PROMPT)
            assert match.host_hit_length == len(PROMPT)
            assert sim.cache.load_back(match.best_match_node)
            sim.cache.ready_to_load_host_cache()
            for ack in list(controller.ack_load_queue):
                ack.finish_event.synchronize()
            sim.cache.loading_check()
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])
            assert q.matched == (SPLIT if switch == "on" else 0)
            sim.check()
            if switch == "on":
                planted = [slot for path, slot in sim.cached_nodes() if path == PROMPT[:SPLIT]]
                want = sim.model.oracle(PROMPT[:SPLIT])
                assert max(rel_err(g, w) for g, w in zip(sim.slot_state(planted[0]), want)) <= 1e-5
        finally:
            sim.cache.release_host_resources()


def test_a_page_written_under_another_layout_is_not_read(tmp_path, monkeypatch):
    """The key carries the layer layout and page size: a server with another shape never reads a
    page's records, and a short file is no record."""
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    with config.override(True):
        sim = _sim()
        try:
            _, host_kv, hashes = _node_on_host(sim)
            host = pool_of(sim.req_pool).hicache.host
            storage = _file_backend(tmp_path)
            keys = record_storage.page_keys(hashes, host, 1, 0, 1)
            assert record_storage.write_pages(storage, keys, record_storage.snapshot(host, host_kv, 1), 3) == 3
            other = record_storage.page_keys(hashes, host, 2, 0, 1)  # page size 2
            assert other[0] != keys[0] and record_storage.read_pages(storage, other, 8) == {}
            page_bytes = sum(t.shape[1] * t.element_size() for rows in host.layers.values() for t in rows)
            assert sorted(record_storage.read_pages(storage, keys, page_bytes)) == [0, 1, 2]
            assert record_storage.read_pages(storage, keys, page_bytes + 4) == {}  # short read: none
        finally:
            sim.cache.release_host_resources()
