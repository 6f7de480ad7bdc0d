"""Bad data in HiCache's L3 file store (``radix/records/hicache/store_integrity.py``) on SGLang 0.5.23's real
file backend (``HiCacheFile``): records files carry a header and a crc32, SGLang's page files a checksum twin;
each damage kind (truncated, bit flip, another model, another layout, a missing twin) is detected, counted and
skipped, and a prefetch's storage query ends at the deepest undamaged state instead of failing whole.

The records come from the real record pool of a simulated server (``tests/test_radix_records_storage.py``'s
helpers); the page hooks run as installed on ``HiCacheFile`` (behind ``record_storage``: off, SGLang's answer).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.hicache import storage as record_storage
from sglang_replayssm.radix.records.hicache import store_integrity
from sglang_replayssm.radix.records.pool import pool_of
from tests.support.store_damage import flip as _flip
from tests.support.store_damage import truncate as _truncate
from tests.test_radix_records_storage import _file_backend, _node_on_host, _sim


@pytest.fixture(scope="module", autouse=True)
def _adapter_installed(radix_adapter):
    return radix_adapter


@pytest.fixture(scope="module")
def records() -> tuple[list[str], list[tuple[int, torch.Tensor]], int]:
    """``(page hashes, snapshot pages, bytes per page)`` of a real node's host records (page size 1)."""
    from sglang.srt.mem_cache.pool_host import common

    saved = common._cuda_host_register
    common._cuda_host_register = lambda *a, **k: None  # no driver on CPU
    saved_dir = os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    try:
        with config.override(True):
            sim = _sim()
            try:
                _, host_kv, hashes = _node_on_host(sim)
                host = pool_of(sim.req_pool).hicache.host
                pages = record_storage.snapshot(host, host_kv, 1)
                page_bytes = sum(t.shape[1] * t.element_size() for rows in host.layers.values() for t in rows)
                return record_storage.page_keys(hashes, host, 1, 0, 1), pages, page_bytes
            finally:
                sim.cache.release_host_resources()
    finally:
        common._cuda_host_register = saved
        if saved_dir is not None:
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = saved_dir


@pytest.fixture(autouse=True)
def _own_store_dir(monkeypatch):
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)


def _file(storage, key: str) -> Path:
    return Path(storage.file_path) / f"{storage._get_suffixed_key(key)}.bin"


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in store_integrity.damage_counts().items() if v != before[k]}


def test_records_round_trip_through_the_header(tmp_path, records):
    keys, pages, page_bytes = records
    storage = _file_backend(tmp_path)
    assert record_storage.write_pages(storage, keys, pages, len(keys)) == len(pages)
    size = _file(storage, keys[0]).stat().st_size
    assert size == store_integrity.HEADER.size + page_bytes  # a header, then the payload
    before = store_integrity.damage_counts()
    got = record_storage.read_pages(_file_backend(tmp_path), keys, page_bytes)
    assert sorted(got) == [p for p, _ in pages]
    assert all(torch.equal(got[p], v) for p, v in pages)
    assert _delta(before) == {}


def _other_model(storage, keys, tmp_path):
    """The first page's file, copied under another model's name (a store moved between models)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="another-model")
    other = HiCacheFile(cfg, file_path=str(tmp_path))
    _file(other, keys[0]).write_bytes(_file(storage, keys[0]).read_bytes())
    return other, keys


def _other_layout(storage, keys, tmp_path):
    """The first page's file, renamed to another layout's key (the header still names its own)."""
    moved = [k.rsplit("-", 1)[0] + "-0123456789ab" for k in keys]
    _file(storage, moved[0]).write_bytes(_file(storage, keys[0]).read_bytes())
    return storage, moved


RECORD_DAMAGE = {
    "truncated": lambda s, k, d: (_truncate(_file(s, k[0])), (s, k))[1],
    "corrupt": lambda s, k, d: (_flip(_file(s, k[0]), store_integrity.HEADER.size + 5), (s, k))[1],
    "other_model": _other_model,
    "other_layout": _other_layout,
}


@pytest.mark.parametrize("kind", list(RECORD_DAMAGE))
def test_a_damaged_records_file_is_skipped_and_counted(tmp_path, records, kind):
    """One damaged records file: no records for that page (its hits are SGLang's), the others
    intact; counted under its kind."""
    keys, pages, page_bytes = records
    storage = _file_backend(tmp_path)
    record_storage.write_pages(storage, keys, pages, len(keys))
    reader, read_keys = RECORD_DAMAGE[kind](storage, keys, tmp_path)
    before = store_integrity.damage_counts()
    got = record_storage.read_pages(reader, read_keys, page_bytes)
    assert 0 not in got
    if kind in ("truncated", "corrupt"):
        assert sorted(got) == [p for p, _ in pages][1:]  # every other page keeps its records
    assert _delta(before) == {kind: 1}


# ---- SGLang's pages: the checksum twin and the storage query -----------------------------------------

PAGES = 6
STATES = (2, 4, 6)  # node boundaries: a mamba state stored at the last page of each


def _store_pages(storage) -> tuple[list[str], list]:
    """Six KV pages and three trailing mamba states, written as SGLang's ``_write_page`` does."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    keys = [f"{i:064x}" for i in range(1, PAGES + 1)]
    gen = torch.Generator().manual_seed(0)
    for i, key in enumerate(keys):
        assert storage.set(key, torch.randn(64, 8, generator=gen))
        if i + 1 in STATES:
            assert storage.set(storage._log_key(PoolName.MAMBA, key), torch.randn(3, 16, generator=gen))
    return keys, [PoolTransfer(name=PoolName.MAMBA, hit_policy=PoolHitPolicy.TRAILING_PAGES)]


def _hit(storage, keys, transfers) -> tuple[int, list[int]]:
    result = storage.batch_exists_v2(keys, transfers)
    return result.kv_hit_pages, sorted(result.restorable_prefix_pages or [])


PAGE_DAMAGE = {
    # kind: (which file, how, (kv hit pages, restorable prefixes) after)
    "truncated": (3, "kv", _truncate, (2, [2])),  # KV page 4 short: the span ends at state 2
    "corrupt": (4, "kv", lambda p: _flip(p, 100), (4, [2, 4])),  # KV page 5 flipped: state 4
    "missing_twin": (0, "kv", None, (0, [])),  # KV page 1 has no twin: nothing
    "other_model": (5, "mamba", None, (4, [2, 4])),  # state 6 from another model: state 4
}


@pytest.mark.parametrize("kind", list(PAGE_DAMAGE))
@pytest.mark.parametrize("switch", ["on", "off"])
def test_a_damaged_page_ends_the_stored_prefix_at_the_deepest_whole_state(tmp_path, kind, switch):
    from sglang.srt.mem_cache.hicache_storage import PoolName

    page, pool, damage, after = PAGE_DAMAGE[kind]
    with config.override(True, record_storage=switch == "on"):
        storage = _file_backend(tmp_path)
        keys, transfers = _store_pages(storage)
        key = keys[page] if pool == "kv" else storage._log_key(PoolName.MAMBA, keys[page])
        if switch == "on":
            assert _hit(storage, keys, transfers) == (6, [2, 4, 6])  # whole: SGLang's answer
            assert _file(storage, store_integrity.twin_of(key)).stat().st_size == store_integrity.HEADER.size
        if kind == "missing_twin":
            _file(storage, store_integrity.twin_of(key)).unlink(missing_ok=True)
        elif kind == "other_model":
            _other_model_page(storage, key)
        else:
            damage(_file(storage, key))
        before = store_integrity.damage_counts()
        got = _hit(_file_backend(tmp_path), keys, transfers)
    if switch == "off":
        assert got == (6, [2, 4, 6])  # SGLang: every file is there, so the whole prefix (then a failed read)
        assert _delta(before) == {}
    else:
        assert got == after
        assert _delta(before) == {kind: 1}


def _other_model_page(storage, key: str) -> None:
    """The page and its twin replaced by another model's (same names, as a store copied across)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="another-model")
    other = HiCacheFile(cfg, file_path=storage.file_path + "-other")
    assert other.set(key, torch.ones(3, 16))
    for k in (key, store_integrity.twin_of(key)):
        if _file(other, k).exists():  # no twin with the switch off
            _file(storage, k).write_bytes(_file(other, k).read_bytes())


def test_one_warning_line_per_kind_per_interval(caplog):
    """Many damaged files of one kind within the interval: one warning line (the count comes later)."""
    import logging

    store_integrity._warned.pop("corrupt", None)
    before = store_integrity.damage_counts()
    with caplog.at_level(logging.WARNING, logger=store_integrity.__name__):
        for i in range(5):
            store_integrity.report("corrupt", f"page-{i}")
    lines = [r for r in caplog.records if "L3 store" in r.getMessage()]
    assert len(lines) == 1 and "corrupt" in lines[0].getMessage()
    assert _delta(before) == {"corrupt": 5}


def test_a_flipped_records_file_is_never_folded_into_a_state(tmp_path, monkeypatch):
    """The worst case: a records file of a page inside the hit, bit-flipped at rest. Backed up, read back
    by another backend at a prefetch and hit inside the node, as in ``tests/test_radix_records_storage.py``:
    the flipped page has no records, so the hit inside is SGLang's miss or a state equal to the oracle,
    never a state rebuilt from the flipped bytes."""
    import types

    from sglang.srt.mem_cache.pool_host import common

    from tests.support.simulate import rel_err
    from tests.test_radix_records_storage import PROMPT, SPLIT, _registered

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)
    with config.override(True):
        sim = _sim()
        try:
            _, host_kv, hashes = _node_on_host(sim)
            controller = sim.cache.cache_controller
            host = pool_of(sim.req_pool).hicache.host
            monkeypatch.setattr(controller, "storage_backend", _file_backend(tmp_path), raising=False)
            _registered("stage_records_for_storage")(lambda *a, **k: 7, controller, host_kv, PROMPT, hashes)

            def sglang_pages(_controller, operation):
                operation.completed_tokens = len(hashes)

            op = types.SimpleNamespace(host_indices=host_kv, hash_value=hashes, completed_tokens=0)
            _registered("store_records_beside_pages")(sglang_pages, controller, op)
            storage = _file_backend(tmp_path)
            keys = record_storage.page_keys(hashes, host, 1, 0, 1)
            path = _file(storage, keys[SPLIT - 3])
            data = bytearray(path.read_bytes())
            for i in range(store_integrity.HEADER.size + 3, len(data), 4):
                data[i] ^= 0x40  # the high byte of every value: a big change in each
            path.write_bytes(bytes(data))
            host.invalidate(host_kv)

            before = store_integrity.damage_counts()
            monkeypatch.setattr(controller, "storage_backend", storage, raising=False)
            fetch = types.SimpleNamespace(hash_value=hashes, host_indices=host_kv, completed_tokens=len(PROMPT))
            _registered("read_records_with_pages")(lambda *a: None, controller, fetch)
            _registered("prefetched_records_to_host")(lambda *a: None, sim.cache, fetch)
            assert _delta(before) == {"corrupt": 1}
            assert SPLIT - 3 not in [p for p, _ in record_storage.snapshot(host, host_kv, 1)]

            match = sim.match(PROMPT)
            assert sim.cache.load_back(match.best_match_node)
            sim.cache.ready_to_load_host_cache()
            for ack in list(controller.ack_load_queue):
                ack.finish_event.synchronize()
            sim.cache.loading_check()
            q = sim.admit(PROMPT[:SPLIT] + [0, 0], [1])
            sim.check()
            planted = [slot for p, slot in sim.cached_nodes() if p == PROMPT[:SPLIT]]
            if q.matched == SPLIT:  # a hit inside: only from whole records
                want = sim.model.oracle(PROMPT[:SPLIT])
                assert max(rel_err(g, w) for g, w in zip(sim.slot_state(planted[0]), want)) <= 1e-5
            else:
                assert q.matched == 0
        finally:
            sim.cache.release_host_resources()
