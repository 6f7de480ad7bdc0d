"""Bad data in HiCache's L3 file store is detected, skipped, counted and never served.

Three kinds of file live in the store (``--hicache-storage-backend file``, one file per key):

* SGLang's KV page ``<hash>`` and mamba sidecar ``<hash>.mamba``: raw bytes, SGLang's format, no
  header. Each gets a *twin* key (:func:`twin_of`) written after it (AROUND ``HiCacheFile.set``):
  a :data:`HEADER` alone, whose length and crc32 describe the page file;
* our records ``<hash>.replayssm-rec-...`` (:mod:`storage`): a :data:`HEADER` followed by the
  payload, written and checked by :func:`seal` / :func:`unseal`.

The header binds a file to what its key claims: ``magic``, ``version``, the model identity (the
backend's model / rank suffix: :func:`model_identity` for records, the page file's own suffix for a
twin), the records' layout digest (empty for a twin), the digest of the key (page hash), the
payload length and the payload's ``zlib.crc32``.

A file is *damaged* of one :data:`KINDS`: ``truncated`` (shorter than its header says),
``corrupt`` (bad magic / version / page digest, or crc mismatch: a bit flip), ``other_model``,
``other_layout``, ``missing_twin`` (a page file without its twin). A prefetch's storage query
(AROUND ``HiCacheFile.batch_exists_v2``, prefetch thread) checks every KV page of the stored
prefix and the trailing states of its restorable prefixes, deepest first: the KV prefix ends
before the first damaged page and a prefix whose state file is damaged is not restorable, so
SGLang's own logic ends the prefetched span at the deepest undamaged state (instead of a failed
read discarding the whole prefetch, SGLang's all-or-nothing for mamba). A damaged records file is
no records (its hits are SGLang's). Every damaged file is counted per kind
(:func:`damage_counts`, Prometheus ``sglang:replayssm_store_damaged_files_total{kind}``) and
warned about in one line per kind at most every :data:`WARN_EVERY_S` seconds.

Bit flips in a page written before its twin (an older store, or a crash between the two writes)
cannot be told from good bytes: such a page has no twin and is skipped as ``missing_twin``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["HEADER", "KINDS", "TWIN_TAG", "WARN_EVERY_S", "damage_counts", "exists_hook", "model_identity",
           "page_damage", "report", "seal", "set_hook", "twin_of", "unseal"]

logger = logging.getLogger(__name__)

MAGIC = b"RSSM"
VERSION = 1
#: magic, version, reserved, model digest, layout digest, page digest, payload bytes, crc32 of the payload
HEADER = struct.Struct("<4sHH16s16s16sQI")
OUR_KEYS = ".replayssm-"  # every key of ours has it after the page hash (twins, records)
TWIN_TAG = OUR_KEYS + "sum"
KINDS = ("truncated", "corrupt", "other_model", "other_layout", "missing_twin")
WARN_EVERY_S = 60.0

_lock = threading.Lock()
_counts: dict[str, int] = dict.fromkeys(KINDS, 0)
_warned: dict[str, tuple[float, int]] = {}  # kind -> (time of the last warning, count at it)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def model_identity(storage: Any) -> str:
    """The model / shard a backend stores for: the file backend's key suffix (model path and TP
    rank, as SGLang names its files), else the storage config's model name."""
    suffix = getattr(storage, "tp_config_suffix", None)
    if suffix is not None:
        return str(suffix)
    config = getattr(storage, "storage_config", None)
    return str(getattr(config, "model_name", "") or "")


def _header(model: str, layout: str, page: str, payload: memoryview | bytes) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, _digest(model), _digest(layout), _digest(page), len(payload),
                       zlib.crc32(payload))


def _bytes_of(value: torch.Tensor) -> memoryview:
    return memoryview(value.detach().contiguous().view(torch.uint8).reshape(-1).numpy().data)


def seal(payload: torch.Tensor, *, model: str, layout: str, page: str) -> torch.Tensor:
    """``HEADER + payload`` as one uint8 tensor (the records file)."""
    data = _bytes_of(payload)
    head = torch.frombuffer(bytearray(_header(model, layout, page, data)), dtype=torch.uint8)
    return torch.cat([head, payload.detach().contiguous().view(torch.uint8).reshape(-1)])


def unseal(buf: memoryview | bytes, *, model: str, layout: str, page: str, payload_bytes: int | None = None,
           data: memoryview | bytes | None = None) -> str | None:
    """The damage kind of a sealed file (``None``: good). ``buf`` starts with the header; the
    payload is ``data`` if given (a twin: the page file's bytes), else the rest of ``buf``;
    ``payload_bytes`` is the length the reader expects (``None``: the header's)."""
    if len(buf) < HEADER.size:
        return "truncated"
    magic, version, _, m, lay, p, length, crc = HEADER.unpack_from(buf)
    if magic != MAGIC or version != VERSION or p != _digest(page):
        return "corrupt"
    if m != _digest(model):
        return "other_model"
    if lay != _digest(layout) or (payload_bytes is not None and length != payload_bytes):
        return "other_layout"
    body = memoryview(buf)[HEADER.size:] if data is None else memoryview(data)
    if len(body) < length:
        return "truncated"
    if len(body) > length or zlib.crc32(body[:length]) != crc:
        return "corrupt"
    return None


# ---- counting and warning ---------------------------------------------------------------------


def report(kind: str, what: str) -> None:
    """Count one damaged file of ``kind`` and warn (one line per kind per :data:`WARN_EVERY_S`)."""
    now = time.monotonic()
    with _lock:
        _counts[kind] += 1
        total = _counts[kind]
        last, at = _warned.get(kind, (-WARN_EVERY_S, 0))
        warn = now - last >= WARN_EVERY_S
        if warn:
            _warned[kind] = (now, total)
    _count_in_prometheus(kind)
    if warn:
        logger.warning("sglang-replayssm L3 store: skipped %d %s file(s) since the last warning (e.g. %s); "
                       "their pages are recomputed, never served", total - at, kind, what)


def _count_in_prometheus(kind: str) -> None:
    try:
        from sglang_replayssm.radix.metrics import count_store_damage

        count_store_damage(kind)
    except Exception:  # metrics are best effort: a counter that cannot be made does not stop the check
        logger.debug("store damage counter unavailable", exc_info=True)


def damage_counts() -> dict[str, int]:
    """Damaged files skipped by this process so far, per kind."""
    with _lock:
        return dict(_counts)


# ---- SGLang's page files: a twin per page ------------------------------------------------------


_MAMBA = ".mamba"  # the file backend names a mamba page per TP rank (its key ends so)


def twin_of(key: str) -> str:
    """The twin key of a page key: ``<hash>`` -> ``<hash>.replayssm-sum``, ``<hash>.mamba`` ->
    ``<hash>.replayssm-sum.mamba`` (so the backend gives the twin its page's model / rank suffix)."""
    if key.endswith(_MAMBA):
        return key[: -len(_MAMBA)] + TWIN_TAG + _MAMBA
    return key + TWIN_TAG


def _page_identity(storage: Any, key: str) -> str:
    """A page's model identity: the suffix the file backend names it with (model, and the TP rank
    where the page is per rank; an MLA KV page is shared by the ranks)."""
    return str(storage._get_suffixed_key(key))[len(key):]


def _ours(key: str) -> bool:
    """A key of ours (a twin, or records: ``storage.KEY_TAG``), not a page of SGLang's."""
    return OUR_KEYS in key


def set_hook(original: Callable[..., Any], storage: Any, key: str, value: Any = None, *args: Any,
             **kwargs: Any) -> Any:
    """AROUND ``HiCacheFile.set``: SGLang's page, then (if it is stored and has none) its twin."""
    ok = original(storage, key, value, *args, **kwargs)
    if ok and isinstance(value, torch.Tensor) and not _ours(key) and not storage.exists(twin_of(key)):
        data = _bytes_of(value)
        head = torch.frombuffer(bytearray(_header(_page_identity(storage, key), "", key, data)), dtype=torch.uint8)
        original(storage, twin_of(key), head)
    return ok


def _path(storage: Any, key: str) -> str:
    return os.path.join(storage.file_path, f"{storage._get_suffixed_key(key)}.bin")


def page_damage(storage: Any, key: str) -> str | None:
    """The damage kind of a stored page file ``key`` of a file backend against its twin (``None``:
    good). The twin is read through ``storage.get`` (its LRU recency follows the page's)."""
    if not storage.exists(twin_of(key)):
        return "missing_twin"
    head = torch.empty(HEADER.size, dtype=torch.uint8)
    try:
        got = storage.get(twin_of(key), head)
    except OSError:  # a short twin
        return "truncated"
    if got is None:
        return "missing_twin"
    try:
        with open(_path(storage, key), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None  # gone since the query: SGLang's read fails on its own (no damage of ours to report)
    return unseal(_bytes_of(head), model=_page_identity(storage, key), layout="", page=key, data=data)


def _checked(storage: Any, key: str) -> bool:
    kind = page_damage(storage, key)
    if kind is not None:
        report(kind, os.path.basename(_path(storage, key)))
    return kind is None


def exists_hook(original: Callable[..., Any], storage: Any, keys: list[str], pool_transfers: Any = None,
                *args: Any, **kwargs: Any) -> Any:
    """AROUND ``HiCacheFile.batch_exists_v2``: SGLang's answer without the damaged files. The KV
    prefix ends before the first damaged page; a restorable prefix whose trailing state file (each
    ``TRAILING_PAGES`` pool's page ``p - 1``) is damaged is dropped, deepest first, until one is
    whole. The answer keeps SGLang's shape: ``kv_hit_pages`` the deepest restorable prefix."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName

    result = original(storage, keys, pool_transfers, *args, **kwargs)
    kv = int(result.extra_pool_hit_pages.get(PoolName.KV, result.kv_hit_pages))
    if kv == 0:
        return result
    cut = next((i for i in range(kv) if not _checked(storage, keys[i])), kv)
    given = result.restorable_prefix_pages
    restorable = [p for p in (given if given is not None else range(1, kv + 1)) if p <= cut]
    trailing = [t.name for t in pool_transfers or () if t.hit_policy == PoolHitPolicy.TRAILING_PAGES]
    for p in sorted(restorable, reverse=True):
        if all(_checked(storage, storage._log_key(name, keys[p - 1])) for name in trailing):
            break
        restorable.remove(p)
    if cut == kv and (given is None or restorable == list(given)):
        return result
    deepest = max(restorable, default=0)
    hits = {}
    for name, pages in result.extra_pool_hit_pages.items():
        pages = min(pages, deepest if name in trailing else cut)
        if pages > 0:
            hits[name] = pages
    return type(result)(deepest, hits, restorable if given is not None else None)
