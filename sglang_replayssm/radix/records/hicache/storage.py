"""Records through HiCache's L3 storage (``--hicache-storage-backend``, e.g. ``file``), GDN and KDA.

SGLang 0.5.23 writes a host node to storage page by page, each page under its hash (the chain hash
of its tokens, ``get_storage_hash_str``), and the node's mamba state under its last page's hash
(``<hash>.mamba``); a prefetch reads the pages of the longest stored prefix that ends on a stored
state back into fresh host KV. Its storage API has no room for extra bytes per page, so the records
travel *beside* the pages, through the same backend's ``set`` / ``get`` (the file backend: one file
per page in its directory, under its own LRU and size budget):

* key ``<page hash>.replayssm-rec-tp<rank>of<size>-<layout>``: the page's records, every linear
  layer's ``x``, ``a``, ``b`` rows of the page's tokens in layer order, as raw bytes after a header; ``layout`` is a
  digest of the layer ids, row widths, dtypes and the page size, so a server with another model
  shard or dtype never reads them (the backend adds its own model / rank suffix);
* **backup** (AROUND ``HybridCacheController.write_storage``, scheduler thread): the host records
  of the written host KV are copied out now (a host record row can be reused by the next backup),
  one buffer per page whose every token has a ready, valid host record; AROUND ``_page_backup``
  (the storage backup thread, after SGLang's KV pages) they are written for the pages SGLang wrote;
* **prefetch** (AROUND ``HybridCacheController._page_transfer``, the prefetch I/O thread, after the
  KV pages are read): the pages' records are read into buffers kept on the operation; AROUND
  ``UnifiedRadixCache._handle_prefetch_result`` (scheduler thread) they become host records of the
  operation's host KV, before SGLang inserts the prefetched nodes; from there they come back with
  a load-back (:mod:`record_hicache`) and serve hits inside the prefetched span
  (:mod:`record_match`, :mod:`record_host_hits`).

Each records file starts with :mod:`store_integrity`'s header (magic, version, model, layout, page
hash, payload length, crc32 of the payload), written on backup and checked on prefetch. A page
without its records file has no record; one whose file is short, bit-flipped, or names another
model, layout or page is skipped, counted and warned about (:func:`store_integrity.report`): no
records, its hits are SGLang's. A process whose record pool has not seen a forward yet (no layer
shapes) restores nothing (its next prefetches do). The hit of the prefetch itself stays SGLang's:
the prefetched span ends at the deepest stored state (``_sync_prefetch_hit_query``,
``PoolHitPolicy.TRAILING_PAGES``), and going past it would need the mamba sidecar read of an inner
page, which SGLang's prefetch does not do.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.radix.records.hicache import store_integrity
from sglang_replayssm.radix.records.pool import RecordPool
from sglang_replayssm.state import peek, state_of, take

__all__ = ["KEY_TAG", "backup_hook", "page_keys", "prefetch_result_hook", "read_pages", "restore",
           "snapshot", "transfer_hook", "write_pages", "write_storage_hook"]

logger = logging.getLogger(__name__)

KEY_TAG = "replayssm-rec"
_staged: dict[int, list[tuple[int, torch.Tensor]]] = {}  # id(host_indices) -> [(page, bytes)]
_lock = threading.Lock()
_failed: set[str] = set()  # backends whose set/get raised: records off for them (logged once)


def _layout(host: Any, page_size: int) -> str:
    parts = [(lid, [(int(t.shape[1]), str(t.dtype)) for t in rows]) for lid, rows in sorted(host.layers.items())]
    return hashlib.sha1(repr((parts, page_size)).encode()).hexdigest()[:12]


def page_keys(page_hashes: list[str], host: Any, page_size: int, tp_rank: int, tp_size: int) -> list[str]:
    """The storage keys of the pages' records (one per page hash)."""
    tail = f".{KEY_TAG}-tp{tp_rank}of{tp_size}-{_layout(host, page_size)}"
    return [h + tail for h in page_hashes]


def _page_bytes(host: Any) -> int:
    return sum(t.shape[1] * t.element_size() for rows in host.layers.values() for t in rows)


def _host_of(controller: Any) -> tuple[RecordPool | None, Any]:
    linked = peek(controller.mem_pool_device_allocator)
    pool: RecordPool | None = None if linked is None else linked.record_pool
    host = None if pool is None or pool.hicache is None else pool.hicache.host
    return pool, host


def _tp(controller: Any) -> tuple[int, int]:
    config = getattr(controller, "storage_config", None)
    return (0, 1) if config is None else (int(config.tp_rank), int(config.tp_size))


# ---- backup: host records -> storage ------------------------------------------------------------


def snapshot(host: Any, host_kv: torch.Tensor, page_size: int) -> list[tuple[int, torch.Tensor]]:
    """``[(page index, bytes [page_size * per-token bytes] uint8)]`` for every page of ``host_kv``
    whose tokens all have a ready, valid host record (layers in id order, then ``x``, ``a``, ``b``)."""
    host.poll()
    kv = host_kv.reshape(-1).to("cpu", torch.int64)
    pages = kv.numel() // page_size
    rows = host.slot_of[kv[: pages * page_size]]
    safe = rows.clamp(min=0)
    ok = ((rows >= 0) & (host.seq[safe] <= host.done) & host.valid[safe]).reshape(pages, page_size).all(1)
    out: list[tuple[int, torch.Tensor]] = []
    for page in ok.nonzero().flatten().tolist():
        r = safe[page * page_size:(page + 1) * page_size]
        parts = [t.index_select(0, r).contiguous().view(torch.uint8).reshape(-1)
                 for _, layer in sorted(host.layers.items()) for t in layer]
        out.append((page, torch.cat(parts)))
    return out


def _claims(key: str) -> tuple[str, str]:
    """``(page hash, layout digest)`` a records key names (:func:`page_keys`)."""
    return key.split(".", 1)[0], key.rsplit("-", 1)[1]


def write_pages(storage: Any, keys: list[str], pages: list[tuple[int, torch.Tensor]], done_pages: int) -> int:
    """``storage.set`` each staged page below ``done_pages``, sealed with the header of its key's
    page hash and layout and the backend's model (:func:`store_integrity.seal`); returns the pages
    written."""
    model = store_integrity.model_identity(storage)
    written = 0
    for page, value in pages:
        if page < done_pages:
            hash_, layout = _claims(keys[page])
            if storage.set(keys[page], store_integrity.seal(value, model=model, layout=layout, page=hash_)):
                written += 1
    return written


def write_storage_hook(original: Callable[..., Any], controller: Any, host_indices: Any, token_ids: Any,
                       hash_value: Any = None, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``HybridCacheController.write_storage``: copy the pages' host records out first."""
    pool, host = _host_of(controller)
    if host is not None and isinstance(host_indices, torch.Tensor) and hash_value and set(host.layers) == set(
            pool.layers if pool is not None else ()):
        pages = snapshot(host, host_indices, int(controller.page_size))
        if pages:
            with _lock:
                _staged[id(host_indices)] = pages
    return original(controller, host_indices, token_ids, hash_value, *args, **kwargs)


def backup_hook(original: Callable[..., Any], controller: Any, operation: Any) -> Any:
    """AROUND ``HybridCacheController._page_backup`` (backup thread): SGLang's pages, then the
    staged records of the pages it wrote."""
    try:
        return original(controller, operation)
    finally:
        with _lock:
            pages = _staged.pop(id(operation.host_indices), None)
        _, host = _host_of(controller)
        storage = getattr(controller, "storage_backend", None)
        name = type(storage).__name__
        if pages and host is not None and storage is not None and name not in _failed:
            ps = int(controller.page_size)
            rank, size = _tp(controller)
            keys = page_keys(operation.hash_value, host, ps, rank, size)
            try:
                write_pages(storage, keys, pages, int(operation.completed_tokens) // ps)
            except Exception as exc:  # a backend whose generic set cannot take raw bytes
                _failed.add(name)
                logger.warning("sglang-replayssm records: %s cannot store records (%s): L3 hits keep SGLang's "
                               "result", name, exc)


# ---- prefetch: storage -> host records ------------------------------------------------------------


def read_pages(storage: Any, keys: list[str], page_bytes: int) -> dict[int, torch.Tensor]:
    """``{page index: bytes}`` of the pages whose records ``storage.get`` returns whole: header
    and checksum good for this key, this model and ``page_bytes``; a damaged one is skipped and
    reported (:func:`store_integrity.report`), a missing one is no records."""
    model = store_integrity.model_identity(storage)
    out: dict[int, torch.Tensor] = {}
    for page, key in enumerate(keys):
        if not storage.exists(key):
            continue
        buf = torch.empty(store_integrity.HEADER.size + page_bytes, dtype=torch.uint8)
        kind: str | None
        try:
            got = storage.get(key, buf)
        except OSError:  # a short file: cut off, or written for a smaller page
            got, kind = None, "truncated"
        else:
            hash_, layout = _claims(key)
            kind = None if got is None else store_integrity.unseal(
                buf.numpy().data, model=model, layout=layout, page=hash_, payload_bytes=page_bytes)
        if kind is not None:
            store_integrity.report(kind, key)
        elif got is not None:
            out[page] = buf[store_integrity.HEADER.size:]
    return out


def transfer_hook(original: Callable[..., Any], controller: Any, operation: Any) -> Any:
    """AROUND ``HybridCacheController._page_transfer`` (prefetch I/O thread): SGLang's pages, then
    the pages' records onto the operation."""
    out = original(controller, operation)
    _, host = _host_of(controller)
    storage = getattr(controller, "storage_backend", None)
    if host is not None and storage is not None and operation.hash_value and type(storage).__name__ not in _failed:
        ps = int(controller.page_size)
        rank, size = _tp(controller)
        keys = page_keys(operation.hash_value, host, ps, rank, size)
        try:
            state_of(operation).storage_records = (_layout(host, ps),
                                                   read_pages(storage, keys, ps * _page_bytes(host)))
        except Exception as exc:
            _failed.add(type(storage).__name__)
            logger.warning("sglang-replayssm records: %s cannot read records (%s)", type(storage).__name__, exc)
    return out


def restore(host: Any, host_kv: torch.Tensor, pages: dict[int, torch.Tensor], page_size: int) -> int:
    """Make ``pages`` (page index -> bytes, :func:`snapshot`'s layout) the host records of the
    page's tokens in ``host_kv``; returns the tokens restored."""
    kv = host_kv.reshape(-1).to("cpu", torch.int64)
    order = sorted(p for p in pages if (p + 1) * page_size <= kv.numel())
    if not order:
        return 0
    tokens = torch.cat([kv[p * page_size:(p + 1) * page_size] for p in order])[-host.capacity:]
    data = torch.cat([pages[p].reshape(page_size, -1) for p in order])[-host.capacity:]
    start = host.assign(tokens)
    seq = host.next_seq
    host.next_seq += 1
    rows = (start + torch.arange(tokens.numel())) % host.capacity
    col = 0
    for _, layer in sorted(host.layers.items()):
        for t in layer:
            width = t.shape[1] * t.element_size()
            t.view(torch.uint8)[rows] = data[:, col:col + width]
            col += width
    host.valid[rows] = True
    host.events.append((seq, None))  # host memory written in place: complete now
    host.poll()
    return int(tokens.numel())


def prefetch_result_hook(original: Callable[..., Any], cache: Any, operation: Any) -> Any:
    """AROUND ``UnifiedRadixCache._handle_prefetch_result``: the fetched pages' records become host
    records of the operation's host KV (the fetched part), then SGLang inserts the nodes."""
    found = take(operation, "storage_records")
    controller = getattr(cache, "cache_controller", None)
    if found is not None and controller is not None and operation.host_indices is not None:
        layout, pages = found
        pool, host = _host_of(controller)
        ps = int(controller.page_size)
        done = int(operation.completed_tokens) // ps
        pages = {p: b for p, b in pages.items() if p < done}
        if host is not None and pool is not None and pages and layout == _layout(host, ps):
            restore(host, operation.host_indices[: done * ps], pages, ps)
    return original(cache, operation)
