"""CPU runtime hooks for HiCache host pools and host<->device transfers on CPU; the table names each hooked target with its SGLang file:line.

On the CPU engine SGLang 0.5.23 builds HiCache host pools fine but never binds their transfer ops:
the pool modules import them under `if _is_cuda or _is_hip` (XPU: `elif _is_xpu`), so a backup or a
load-back dies with `NameError: name 'transfer_kv_all_layer_lf_pf' is not defined`. This module sets
torch references of those ops (cpu/hicache_ops.py) into the pool modules' globals, refuses at host-pool
construction the layout/io-backend combinations the CPU runtime cannot run (one line naming the flags),
and gives torch's CPU stream the `synchronize` SGLang's transfer engine calls when a transfer fails.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import hicache_ops
from sglang_replayssm.hook_table import Hook

logger = logging.getLogger("sglang_replayssm")

# The op names each SGLang module binds only on CUDA/ROCm/XPU (its `from sgl_kernel.kvcacheio import
# ...` / `from sglang.kernels.ops.mamba.transfer_mamba import ...` block), i.e. the globals that are
# undefined on the CPU engine. Keyed by module; every name is a key of hicache_ops.ALL_OPS.
_MHA_OPS = (
    "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct",
    "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf",
)
_MLA_OPS = (
    "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
)
MODULE_OPS: dict[str, tuple[str, ...]] = {
    "sglang.srt.mem_cache.pool_host.mha": _MHA_OPS,
    "sglang.srt.mem_cache.pool_host.mla": _MLA_OPS,
    "sglang.srt.mem_cache.pool_host.dsa": _MLA_OPS,
    "sglang.srt.mem_cache.memory_pool_host": _MLA_OPS,
    "sglang.srt.mem_cache.pool_host.unified": ("transfer_kv_direct", "transfer_kv_per_layer_mla"),
    "sglang.srt.mem_cache.pool_host.mamba": (
        "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla", "transfer_kv_mamba_lf_pf", "transfer_kv_mamba_pf_lf",
    ),
}

# What the CPU runtime can move, per host pool: {io backend: layouts}. The mamba pool itself only
# accepts page_first / page_first_direct (sglang/srt/mem_cache/pool_host/mamba.py), on any device.
SUPPORTED: dict[str, dict[str, tuple[str, ...]]] = {
    "MHATokenToKVPoolHost": {"kernel": ("layer_first", "page_first", "page_head"),
                             "direct": ("layer_first", "page_first_direct")},
    "MLATokenToKVPoolHost": {"kernel": ("layer_first", "page_first"),
                             "direct": ("layer_first", "page_first_direct")},
    "MambaPoolHost": {"kernel": ("page_first", "page_first_direct"),
                      "direct": ("page_first", "page_first_direct")},
}


def inject_ops() -> list[str]:
    """Set the CPU transfer ops into every pool module that lacks them; returns 'module.op' names set.

    HookRegistry can only wrap or replace an attribute that exists, and these names are never defined
    on the CPU engine, so they are set directly as module globals (only where missing: a real op is
    never overridden). The pool methods look them up in their module globals at call time.
    """
    done: list[str] = []
    for module_name, names in MODULE_OPS.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a pool module that cannot import here is one we cannot reach either
            logger.warning("sglang-replayssm CPU HiCache: cannot import %s (%s); its ops are not bound",
                           module_name, exc)
            continue
        for name in names:
            if getattr(module, name, None) is None:
                setattr(module, name, hicache_ops.ALL_OPS[name])
                done.append(f"{module_name.rsplit('.', 1)[-1]}.{name}")
    return done


def unsupported_reason(pool: str, layout: str, io_backend: str) -> str | None:
    """One line naming the flags when the CPU runtime cannot run this host pool; None when it can."""
    table = SUPPORTED.get(pool)
    if table is None:
        return None
    if io_backend not in table:
        return (f"HiCache on the sglang-replayssm CPU runtime: --hicache-io-backend {io_backend} is not "
                f"supported (use kernel or direct).")
    if pool == "MambaPoolHost" and layout not in table[io_backend]:
        return (f"HiCache for mamba hybrids: --hicache-mem-layout {layout} is not supported by SGLang's "
                f"MambaPoolHost on any device (use --hicache-mem-layout page_first with --hicache-io-backend "
                f"kernel, or page_first_direct with direct).")
    if layout not in table[io_backend]:
        ok = "; ".join(f"--hicache-io-backend {b} with --hicache-mem-layout {'|'.join(ls)}"
                       for b, ls in table.items())
        return (f"HiCache on the sglang-replayssm CPU runtime: {pool} cannot run --hicache-mem-layout {layout} "
                f"with --hicache-io-backend {io_backend} (supported: {ok}).")
    return None


def _layout_of(original: Callable[..., Any], args: tuple, kwargs: dict) -> str | None:
    try:
        bound = inspect.signature(original).bind(*args, **kwargs)
    except TypeError:
        return None  # let the constructor itself report the bad call
    bound.apply_defaults()
    return bound.arguments.get("layout")


def _check_flags_around(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND a host pool's __init__: refuse an unsupported layout/io-backend before allocating."""
    from sglang.srt.runtime_context import get_memory

    pool = args[0].__class__.__name__ if args else "?"
    # Subclasses (e.g. MHA mxfp8) are judged by the class whose __init__ this is.
    pool = next((c.__name__ for c in type(args[0]).__mro__ if c.__name__ in SUPPORTED), pool)
    layout = _layout_of(original, args, kwargs)
    reason = None if layout is None else unsupported_reason(pool, layout, get_memory().hicache_io_backend)
    if reason is not None:
        raise ValueError(reason)
    return original(*args, **kwargs)


def _stream_synchronize(self: torch.cpu.Stream) -> None:
    """CPU work runs synchronously on the calling thread: nothing is pending on a CPU stream."""
    return None


def _stream_query(self: torch.cpu.Stream) -> bool:
    return True


def patch_cpu_stream() -> None:
    """Give torch.cpu.Stream the no-op synchronize/query a CUDA stream has (only where missing)."""
    if not hasattr(torch.cpu.Stream, "synchronize"):
        torch.cpu.Stream.synchronize = _stream_synchronize  # type: ignore[attr-defined]
    if not hasattr(torch.cpu.Stream, "query"):
        torch.cpu.Stream.query = _stream_query  # type: ignore[attr-defined]


def _dummy_page_unpinned(original: Callable[..., Any], pool: Any) -> Any:
    """AROUND a host pool's ``get_dummy_flat_data_page`` (the L3 prefetch's read buffer): SGLang
    allocates it with ``pin_memory=pool.pin_memory``, which needs a CUDA driver; without one the page
    is allocated unpinned (pinning only speeds up device copies, which the CPU runtime has none of)."""
    if torch.cuda.is_available() or not getattr(pool, "pin_memory", False):
        return original(pool)
    pool.pin_memory = False
    try:
        return original(pool)
    finally:
        pool.pin_memory = True


_HOST_POOLS = "sglang.srt.mem_cache.pool_host"

#: Refuse a layout/io-backend pair the CPU runtime cannot move at host-pool construction, with the
#: flags named, instead of at the first transfer; allocate the L3 prefetch's page buffer unpinned.
HOOKS: tuple[Hook, ...] = (
    Hook(f"{_HOST_POOLS}.mha.MHATokenToKVPoolHost.__init__", "AROUND", _check_flags_around,
         "sglang/srt/mem_cache/pool_host/mha.py:136", "hicache-layout-check"),
    Hook(f"{_HOST_POOLS}.mla.MLATokenToKVPoolHost.__init__", "AROUND", _check_flags_around,
         "sglang/srt/mem_cache/pool_host/mla.py:99", "hicache-layout-check"),
    Hook(f"{_HOST_POOLS}.mamba.MambaPoolHost.__init__", "AROUND", _check_flags_around,
         "sglang/srt/mem_cache/pool_host/mamba.py:83", "hicache-layout-check"),
    Hook(f"{_HOST_POOLS}.mha.MHATokenToKVPoolHost.get_dummy_flat_data_page", "AROUND", _dummy_page_unpinned,
         "sglang/srt/mem_cache/pool_host/mha.py:727", "hicache-l3-page-unpinned"),
    Hook(f"{_HOST_POOLS}.mamba.MambaPoolHost.get_dummy_flat_data_page", "AROUND", _dummy_page_unpinned,
         "sglang/srt/mem_cache/pool_host/mamba.py:874", "hicache-l3-page-unpinned"),
)


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    # sglang/srt/mem_cache/pool_host/{mha,mla,mamba,dsa,unified}.py, sglang/srt/mem_cache/memory_pool_host.py:
    # the transfer ops are module globals bound only on CUDA/ROCm/XPU; set from here (see inject_ops).
    injected = inject_ops()
    logger.debug("sglang-replayssm CPU HiCache ops bound: %s", ", ".join(injected))
    # sglang/srt/mem_cache/l2_transfer.py (L2TransferEngine._submission) calls stream.synchronize() on the
    # device module's stream when a transfer raises; torch.cpu.Stream has no synchronize/query.
    patch_cpu_stream()
    return ["hicache-transfer-ops", "hicache-layout-check", "hicache-l3-page-unpinned", "cpu-stream-sync"]
