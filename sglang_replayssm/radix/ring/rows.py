"""Decode rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``): rings only for running requests.

SGLang 0.5.23's ``MambaPool`` gives every mamba slot (``size + 1``: working, ping-pong and radix slots
alike) a decode ring, but only the working slot a running request decodes into ever holds records.
Here the ring is allocated per row of the req-to-token pool instead (``req_to_token.shape[0]`` rows,
as SGLang's own GDN spec ring is), and the cursor stays per slot:

* ``d``: ``[layers, rows, HV, L, V]``, ``k``: ``[layers, rows, H_k, L, K]`` (SSM dtype), ``g`` (fp32):
  ``[layers, rows, HV, L]`` (GDN) or ``[layers, rows, HV, L, K]`` (KDA);
* ``write_pos``: int32 ``[slots]`` (unchanged); ``ring_rows``: int32 ``[slots]``, the ring row of the
  request decoding into each slot, written where SGLang writes the row -> slot mapping
  (``HybridReqToTokenPool.alloc``), on the device.

A slot's state is ``temporal[s]`` folded with ``ring[ring_rows[s]][:write_pos[s]]``.

Invariant: ``write_pos[s] > 0`` for an allocated slot ``s`` implies that ``ring_rows[s]`` is the live
request row mapped to ``s``. Every way a working slot outlives its request row folds first (no_buffer
finish donation) or frees the slot (extra_buffer finish, retraction, abort); a slot handed out again
starts with an empty ring (alloc_reset.py); a streaming session keeps its row with its slot. Rows
cannot run out: every request row has its ring row. Stale map entries of slots whose cursor is 0 are
never read.

The decode kernels (the CPU reference, sglang-replayssm's Triton kernels, and the CUDA passes' row-map build
where ``ring_decode_cuda.MAPPED_DEFAULT`` or a forced launch takes it) and every fold read the map; SGLang's own
ring kernels cannot, so the admission refuses what would reach them (the Helion decode backend, the
``ring_kernels`` fix off) and what does not follow the row (the read copy, the fixes the invariant rests on, the
KDA safe gate). A PD decode server's pool (SGLang's decode-side subclass) and a
speculative server's (shared with its draft) take rows like any other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.host_lists import on_device
from sglang_replayssm.radix import config
from sglang_replayssm.settings import READ_COPY, RING_ROWS
from sglang_replayssm.state import peek, state_of

__all__ = ["FIXES_NEEDED", "attach_rows", "check_args", "map_rows", "ring_map_of", "rows_on", "rows_pool",
           "uncovered_feature"]

logger = logging.getLogger(__name__)

#: The fixes the invariant (module doc) rests on: a cursor trusted only if it starts at 0, folded copies,
#: folded finish donation and retraction backup; and the ring kernel binding, the only CUDA decode that reads
#: the map.
FIXES_NEEDED = ("cursor_reset", "materialize_copy", "finish_donation", "retract_backup", "ring_kernels")
_GIB = float(1 << 30)
_MIB = float(1 << 20)


def _why(what: str) -> str:
    return f"sglang-replayssm: SGLANG_REPLAYSSM_RING_ROWS=on {what}; unset it or set it off"


def _refusal(what: str) -> ValueError:
    return ValueError(_why(what))


def rows_on() -> bool:
    """Whether the decode rings are keyed by request row: ``on``, or ``auto`` as the admission resolved it
    (``auto:on``; an ``auto`` never resolved, e.g. a pool built without SGLang's argument checks, keeps a ring
    per slot)."""
    return RING_ROWS.value() in ("on", "auto:on")


def check_args(server_args: Any) -> None:
    """Admission: with ``on``, refuse in one line what rings keyed by request row do not cover yet; with
    ``auto``, resolve to ``auto:on`` where covered, else to ``auto:off`` with one line saying why. The
    resolution is written to the environment, which every process SGLang starts afterwards inherits; a later
    admission in this process resolves it again (an ``auto:`` value is still ``auto``)."""
    from sglang_replayssm.radix.admission import ReplaySSMArgsError, _value

    mode = RING_ROWS.value()
    if mode == "off" or not _value(server_args, "enable_linear_replayssm", False):
        return
    why = _uncovered(server_args, _value)
    if mode.startswith("auto"):
        RING_ROWS.publish("auto:off" if why else "auto:on")
        if why:
            logger.warning("sglang-replayssm: decode rings per mamba slot, not per request row: "
                           "SGLANG_REPLAYSSM_RING_ROWS=auto %s", why)  # fmt: skip
        return
    if why is not None:
        raise ReplaySSMArgsError(_why(why))


def uncovered_feature(read_copy: str) -> str | None:
    """Which of the features rows do not cover a server (or a bench arm) turns on, or None: the admission's
    first check, shared with the bench's memory pricing (``bench/memory.py``)."""
    if read_copy != "off":
        return "does not cover SGLANG_REPLAYSSM_READ_COPY (its records are per slot)"
    return None


def _uncovered(server_args: Any, _value: Callable[..., Any]) -> str | None:
    """What of this server rings keyed by request row do not cover, or None. Covered beside the plain server:
    a PD decode server (its pool's rows include the pre-allocated transfer rows; a prefill server never runs
    the ring) and speculative decoding (the draft shares the target's request pool; the target's linear
    layers verify from the checkpoint and never decode into the ring)."""
    why = uncovered_feature(READ_COPY.value())
    if why is not None:
        return why
    if "helion" in (_value(server_args, "linear_attn_decode_backend", None),
                    _value(server_args, "linear_attn_backend", None)):
        return "runs on the Triton linear-attention decode backend only (got helion)"
    off = [name for name in FIXES_NEEDED if not config.enabled(name)]
    if off:
        return f"needs the fixes {', '.join(off)} (remove them from SGLANG_REPLAYSSM_DISABLE_FIXES)"
    if _safe_gate(server_args):
        return "does not cover the KDA safe gate (a gate lower bound in the model config)"
    return None


def _safe_gate(server_args: Any) -> bool:
    """Whether the model's KDA layers clamp their gate (``lower_bound``: Bailing's ``kda_safe_gate``, a
    ``gate_lower_bound`` in ``linear_attn_config``); SGLang's decode kernel for it reads rings by slot. A
    config that cannot be read counts as no safe gate (Kimi-Linear, Qwen3-Next and Qwen3.5 have none)."""
    try:
        from sglang.srt.arg_groups.overrides import model_config_of

        hf = model_config_of(server_args).hf_config
    except Exception:
        return False
    linear = getattr(hf, "linear_attn_config", None) or {}
    return bool(getattr(hf, "kda_safe_gate", False)) or (
        isinstance(linear, dict) and linear.get("gate_lower_bound") is not None)


def rows_pool(original: Callable[..., Any], req_pool: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``HybridReqToTokenPool._init_mamba_pool``: with rows on and the decode ring asked for, SGLang
    builds the pool without its per-slot ring, then :func:`attach_rows` adds the per-row ring."""
    if not kwargs.get("enable_linear_replayssm", False):
        return original(req_pool, *args, **kwargs)
    if not rows_on():
        result = original(req_pool, *args, **kwargs)
        if not kwargs.get("enable_linear_replayssm_spec") and READ_COPY.value() == "off":
            _log_rows_off(req_pool.mamba_pool, req_pool.req_to_token.shape[0])
        return result
    if kwargs.get("enable_linear_replayssm_spec"):
        raise _refusal("does not cover --enable-linear-replayssm-spec")
    result = original(req_pool, *args, **{**kwargs, "enable_linear_replayssm": False})
    pool = req_pool.mamba_pool
    attach_rows(pool, req_pool.req_to_token.shape[0], int(kwargs.get("linear_replayssm_cache_len", 16)),
                kwargs["cache_params"])  # fmt: skip
    state_of(req_pool).ring_rows = state_of(pool).ring_rows  # what :func:`map_rows` writes
    return result


def _log_rows_off(mamba_pool: Any, n_rows: int) -> None:
    """One startup line: the per-slot rings' bytes beside what rings per request row would take."""
    cache = getattr(mamba_pool, "mamba_cache", None)
    rings = [t for t in (getattr(cache, name, None) for name in ("replayssm_d", "replayssm_k", "replayssm_g"))
             if isinstance(t, torch.Tensor)]  # fmt: skip
    if len(rings) != 3:
        return
    slots = rings[0].shape[1]
    ring_bytes = _bytes(*rings)
    per_row = ring_bytes / slots * n_rows
    logger.info("sglang-replayssm: decode rings for %d slots: %.2f MiB; rings per request row would take %.2f MiB "
                "(SGLANG_REPLAYSSM_RING_ROWS=%s)", slots, ring_bytes / _MIB, per_row / _MIB,
                RING_ROWS.text() or RING_ROWS.default)  # fmt: skip


def attach_rows(mamba_pool: Any, n_rows: int, record_len: int, cache_params: Any) -> None:
    """Give ``mamba_pool`` (built without a ring) the decode ring of ``n_rows`` request rows, the per-slot
    cursor and the slot -> row map, and mark it a decode-ring pool as SGLang's constructor would."""
    cache = mamba_pool.mamba_cache
    temporal = cache.temporal
    layers, slots, hv, v_dim, k_dim = temporal.shape
    h_k = getattr(cache_params.shape, "num_k_heads_per_tp", hv)
    is_kda = bool(cache_params.is_kda)
    dev, dtype = temporal.device, temporal.dtype
    g_shape = (layers, n_rows, hv, record_len, k_dim) if is_kda else (layers, n_rows, hv, record_len)
    with _kv_cache_region(mamba_pool):
        d = torch.zeros((layers, n_rows, hv, record_len, v_dim), dtype=dtype, device=dev)
        k = torch.zeros((layers, n_rows, h_k, record_len, k_dim), dtype=dtype, device=dev)
        g = torch.zeros(g_shape, dtype=torch.float32, device=dev)
    mamba_pool.mamba_cache = dataclasses.replace(cache, replayssm_d=d, replayssm_k=k, replayssm_g=g)
    mamba_pool.enable_linear_replayssm = True
    mamba_pool.linear_replayssm_cache_len = record_len
    mamba_pool.replayssm_is_kda = is_kda
    mamba_pool.replayssm_write_pos = torch.zeros((slots,), dtype=torch.int32, device=dev)
    state_of(mamba_pool).ring_rows = torch.zeros((slots,), dtype=torch.int32, device=dev)
    ring_bytes = _bytes(d, k, g) + 8 * slots
    mamba_pool.mem_usage += ring_bytes / _GIB
    per_slot = ring_bytes / n_rows * slots
    logger.info("sglang-replayssm: decode rings for %d request rows (not %d slots): %.2f MiB, %.2f MiB less than "
                "a ring per slot", n_rows, slots, ring_bytes / _MIB, (per_slot - ring_bytes) / _MIB)  # fmt: skip


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _kv_cache_region(mamba_pool: Any) -> Any:
    """The memory region SGLang allocates the pool's own tensors in (its memory saver's KV-cache region),
    or a no-op context where the pool has none."""
    adapter = getattr(mamba_pool, "memory_saver_adapter", None)
    if adapter is None:
        return contextlib.nullcontext()
    from sglang.srt.constants import GPU_MEMORY_TYPE_KV_CACHE

    return adapter.region(GPU_MEMORY_TYPE_KV_CACHE)


def map_rows(result: Any, req_pool: Any, reqs: Any) -> None:
    """AFTER ``HybridReqToTokenPool.alloc``: each allocated request row's slot reads its ring at that row
    (``ring_rows[mapping[row]] = row``; on the device, in the stream SGLang writes the mapping in)."""
    state = peek(req_pool)
    ring_rows = None if state is None else state.ring_rows
    if ring_rows is None or result is None:
        return
    if len(result) == 0:
        return
    rows = on_device([int(x) for x in result], torch.long, ring_rows.device)
    slots = req_pool.req_index_to_mamba_index_mapping[rows].to(torch.long)
    ring_rows[slots] = rows.to(torch.int32)


def ring_map_of(kernel: Any) -> torch.Tensor | None:
    """The slot -> ring row map of the pool a decode ``kernel`` decodes into (linked when its backend was
    built, :func:`sglang_replayssm.radix.ring.hooks.link_decode_kernel`), or None (one ring per slot).

    Raises when rows are on but the kernel reaches no pool: slot indices would then address request rows. A
    linked kernel's pool says it all (its rows were attached, or not, when it was built), so the decode step
    reads no environment."""
    state = peek(kernel)
    pool = None if state is None else state.mamba_pool
    if pool is None:
        if rows_on():
            raise RuntimeError("sglang-replayssm: SGLANG_REPLAYSSM_RING_ROWS=on but a decode kernel is linked to no "
                               "pool with request-row rings")  # fmt: skip
        return None
    pool_state = peek(pool)
    return None if pool_state is None else pool_state.ring_rows
