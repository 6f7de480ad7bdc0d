"""The ring room's hooks: decode kernels, decode metadata, track snapshot, slot movers, the cursor reset
at every slot hand-out, the no_buffer finish donation, the decode kernels' link to their pool and the
rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``, :mod:`rows`). Each hook is a thin call into this room's
modules, imported on first use; each runs behind its fix switch (:mod:`sglang_replayssm.radix.gated`).
The two decode-metadata hooks carry two fixes and switch each part themselves (:mod:`decode_metadata`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config
from sglang_replayssm.radix.gated import gated_hook

__all__ = ["RING_HOOKS", "install"]

_BACKEND = "sglang.srt.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase"
_BACKEND_AT = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
_MP = "sglang.srt.mem_cache.memory_pool"
_MP_AT = "sglang/srt/mem_cache/memory_pool.py"


def gdn_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """GDN packed decode on CUDA: sglang-replayssm's ring decode kernel."""
    from sglang_replayssm.radix.ring.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=False, **kwargs)


def kda_ring_kernel(original: Callable[..., Any], kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """KDA packed decode on CUDA: sglang-replayssm's ring decode kernel."""
    from sglang_replayssm.radix.ring.kernel_binding import ring_packed_decode

    return ring_packed_decode(original, kernel, *args, is_kda=True, **kwargs)


def decode_metadata_eager(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Eager decode metadata: KDA force flush, then the device cursor (each behind its own fix)."""
    if not (config.enabled("kda_force_flush") or config.enabled("device_cursor")):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.ring.decode_metadata import forward_metadata

    return forward_metadata(original, backend, *args, **kwargs)


def decode_metadata_graph(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """CUDA-graph decode metadata (it calls ``_replay_metadata`` and alone holds the device
    ``seq_lens``): KDA force flush, then the device cursor (each behind its own fix)."""
    if not (config.enabled("kda_force_flush") or config.enabled("device_cursor")):
        return original(backend, *args, **kwargs)
    from sglang_replayssm.radix.ring.decode_metadata import out_graph_metadata

    return out_graph_metadata(original, backend, *args, **kwargs)


def exact_track_decode(original: Callable[..., Any], backend: Any, forward_batch: Any, conv_states: Any,
                       ssm_states: Any, cache_indices: Any, layer_id: int | None = None) -> Any:
    """The decode track snapshot folds the working slot's pending records."""
    from sglang_replayssm.radix.ring.snapshot import track_decode_exact

    return track_decode_exact(
        original, backend, forward_batch, conv_states, ssm_states, cache_indices, layer_id
    )


def exact_copy_from(original: Callable[..., Any], mamba_pool: Any, src_indices: Any, dst_indices: Any) -> Any:
    """A slot copy folds the source's pending records into the destination."""
    if not config.enabled("cursor_reset"):  # a record count is trusted only if every slot starts empty
        return original(mamba_pool, src_indices, dst_indices)
    from sglang_replayssm.radix.ring.snapshot import copy_from_exact

    return copy_from_exact(original, mamba_pool, src_indices, dst_indices)


def link_slot_allocator(result: Any, req_to_token_pool: Any, *args: Any, **kwargs: Any) -> None:
    """Link the new slot allocator to the pool's cursor (whatever the fixes: a link does nothing)."""
    from sglang_replayssm.radix.ring.alloc_reset import link_allocator

    link_allocator(req_to_token_pool)


def ring_rows_pool(original: Callable[..., Any], req_to_token_pool: Any, *args: Any, **kwargs: Any) -> Any:
    """With ``SGLANG_REPLAYSSM_RING_ROWS`` on, the decode ring is allocated per request row."""
    from sglang_replayssm.radix.ring.rows import rows_pool

    return rows_pool(original, req_to_token_pool, *args, **kwargs)


def ring_rows_map(result: Any, req_to_token_pool: Any, reqs: Any, *args: Any, **kwargs: Any) -> None:
    """Each allocated request row's slot reads its ring at that row (rings keyed by request row)."""
    from sglang_replayssm.radix.ring.rows import map_rows

    map_rows(result, req_to_token_pool, reqs)


def link_decode_kernel(result: Any, backend: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``GDNAttnBackend`` / ``KDAAttnBackend.__init__`` (built after the pool): its decode kernel
    decodes into its pool, so a packed-decode hook reaches that pool's read copy or row map through the
    kernel SGLang calls it with (whatever the fixes: a link changes nothing)."""
    from sglang_replayssm.state import state_of

    dispatcher = getattr(backend, "kernel_dispatcher", None)
    kernel = getattr(dispatcher, "decode_kernel", None)
    pool = getattr(getattr(backend, "req_to_token_pool", None), "mamba_pool", None)
    if kernel is not None and pool is not None:
        state_of(kernel).mamba_pool = pool


def empty_ring_on_alloc(result: Any, allocator: Any, *args: Any, **kwargs: Any) -> None:
    """Every slot the allocator hands out starts with an empty ring."""
    if result is None:
        return
    from sglang_replayssm.radix.ring.alloc_reset import empty_allocated

    empty_allocated(allocator, result)


def empty_ring_on_int8_load(
    result: Any, ckpt_pool: Any, active_mamba_pool: Any, ckpt_slots: Any, active_slots: Any
) -> None:
    """A slot an int8 checkpoint is loaded into starts with an empty ring."""
    from sglang_replayssm.radix.ring.alloc_reset import empty_loaded

    empty_loaded(active_mamba_pool, active_slots)


def fold_rows_before_extend(original: Callable[..., Any], runner: Any, forward_batch: Any) -> Any:
    """Before an extend forward reads the pool, fold every row's pending records."""
    from sglang_replayssm.radix.ring.movers import fold_before_extend

    return fold_before_extend(original, runner, forward_batch)


def exact_cpu_copy(original: Callable[..., Any], mamba_pool: Any, indices: Any) -> Any:
    """The CPU retraction backup carries the full state."""
    from sglang_replayssm.radix.ring.movers import cpu_copy_exact

    return cpu_copy_exact(original, mamba_pool, indices)


def empty_ring_on_cpu_load(result: Any, mamba_pool: Any, mamba_cache_cpu: Any, indices: Any) -> None:
    """A slot a CPU backup is loaded into starts with an empty ring."""
    from sglang_replayssm.radix.ring.alloc_reset import empty_loaded

    empty_loaded(mamba_pool, indices)


def exact_finish_donation(
    original: Callable[..., Any], component: Any, req: Any, insert_params: Any, token_ids_len: int, is_finished: bool
) -> Any:
    """Finish donation: no_buffer folds the slot first (real depth); extra_buffer donates the exact
    end state (``end_state``, installed by the records room)."""
    from sglang_replayssm.radix.ring import donation

    donation.materialize_before_finish_donation(component, req, is_finished)
    if config.enabled("end_state"):
        donation.end_state_before_finish_donation(component, req, token_ids_len, is_finished)
    return original(component, req, insert_params, token_ids_len, is_finished)


def install() -> None:
    """Install the ring's admission check of rings keyed by request row (idempotent)."""
    from sglang_replayssm.radix import admission
    from sglang_replayssm.radix.ring.rows import check_args

    admission.add_check("ring_rows", check_args)


_KERNELS = "sglang.srt.layers.attention.linear.kernels"
_KERNELS_AT = "sglang/srt/layers/attention/linear/kernels"
_LINEAR = "sglang.srt.layers.attention.linear"
_LINEAR_AT = "sglang/srt/layers/attention/linear"

#: The ring room's hooks.
RING_HOOKS: tuple[Hook, ...] = (
    gated_hook(f"{_KERNELS}.gdn_triton.TritonGDNKernel.packed_decode", "AROUND", gdn_ring_kernel,
               at=f"{_KERNELS_AT}/gdn_triton.py:46", fix="ring_kernels"),
    gated_hook(f"{_KERNELS}.kda_triton.TritonKDAKernel.packed_decode", "AROUND", kda_ring_kernel,
               at=f"{_KERNELS_AT}/kda_triton.py:37", fix="ring_kernels"),
    gated_hook(f"{_BACKEND}._forward_metadata", "AROUND", decode_metadata_eager, at=f"{_BACKEND_AT}:166"),
    gated_hook(f"{_BACKEND}.init_forward_metadata_out_graph", "AROUND", decode_metadata_graph,
               at=f"{_BACKEND_AT}:368"),
    gated_hook(f"{_BACKEND}._track_mamba_state_decode", "AROUND", exact_track_decode, at=f"{_BACKEND_AT}:975",
               fix="materialize_track"),
    gated_hook(f"{_MP}.MambaPool.copy_from", "AROUND", exact_copy_from, at=f"{_MP_AT}:1163",
               fix="materialize_copy"),
    # Inside the allocator link (registered first = inner): the link sees the cursor the rows allocated.
    gated_hook(f"{_MP}.HybridReqToTokenPool._init_mamba_pool", "AROUND", ring_rows_pool, at=f"{_MP_AT}:1426"),
    gated_hook(f"{_MP}.HybridReqToTokenPool._init_mamba_pool", "AFTER", link_slot_allocator,
               at=f"{_MP_AT}:1426", fix="cursor_reset", gate=False),
    gated_hook(f"{_MP}.HybridReqToTokenPool.alloc", "AFTER", ring_rows_map, at=f"{_MP_AT}:1572"),
    gated_hook(f"{_LINEAR}.gdn_backend.GDNAttnBackend.__init__", "AFTER", link_decode_kernel,
               at=f"{_LINEAR_AT}/gdn_backend.py:522", name="link_gdn_decode_kernel"),
    gated_hook(f"{_LINEAR}.kda_backend.KDAAttnBackend.__init__", "AFTER", link_decode_kernel,
               at=f"{_LINEAR_AT}/kda_backend.py:487", name="link_kda_decode_kernel"),
    gated_hook("sglang.srt.mem_cache.allocator.mamba.MambaSlotAllocator.alloc", "AFTER", empty_ring_on_alloc,
               at="sglang/srt/mem_cache/allocator/mamba.py:65", fix="cursor_reset"),
    gated_hook("sglang.srt.mem_cache.mamba_checkpoint_pool.MambaCheckpointPool.load_to_active", "AFTER",
               empty_ring_on_int8_load, at="sglang/srt/mem_cache/mamba_checkpoint_pool.py:254", fix="cursor_reset"),
    gated_hook("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear",
               "AROUND", fold_rows_before_extend, at="sglang/srt/model_executor/model_runner.py:1915",
               fix="extend_fold"),
    gated_hook(f"{_MP}.MambaPool.get_cpu_copy", "AROUND", exact_cpu_copy, at=f"{_MP_AT}:1208",
               fix="retract_backup"),
    gated_hook(f"{_MP}.MambaPool.load_cpu_copy", "AFTER", empty_ring_on_cpu_load, at=f"{_MP_AT}:1223",
               fix="retract_backup"),
    gated_hook("sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent.prepare_for_caching_req",
               "AROUND", exact_finish_donation, at="sglang/srt/mem_cache/unified_cache/components/mamba.py:604",
               fix="finish_donation"),
)
