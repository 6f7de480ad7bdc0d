"""The eviction room's hooks: SGLang's state-eviction walk starts on a list whose states on reused paths are
last (fix ``reused_states_last``, :mod:`order`); SGLang's KV walk takes the leaves no match can use first (fix
``stateless_kv_first``, :mod:`stateless_kv`); a cache with mamba states gets the Python TreeCore while either is
on: the Rust one runs its walks natively (no hook, no fix of its own: :func:`order.python_tree_core` reads both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix.gated import gated_hook

__all__ = ["EVICTION_HOOKS"]


def reused_states_last(original: Callable[..., Any], component: Any, request_cnt: int) -> Any:
    """SGLang's state-eviction walk takes states on reused paths last."""
    from sglang_replayssm.radix.eviction.order import reused_states_last as body

    return body(original, component, request_cnt)


def stateless_kv_first(original: Callable[..., Any], component: Any, request_cnt: int) -> Any:
    """SGLang's KV eviction walk takes leaves no match can use first."""
    from sglang_replayssm.radix.eviction.stateless_kv import stateless_kv_first as body

    return body(original, component, request_cnt)


def python_tree_core(original: Callable[..., Any], name: str, params: Any) -> str:
    """A cache with mamba states gets SGLang's Python TreeCore while an eviction fix is on (their walks run there)."""
    from sglang_replayssm.radix.eviction.order import python_tree_core as body

    return body(original, name, params)


_MAMBA = "sglang.srt.mem_cache.unified_cache.components.mamba.MambaComponent"
_FULL = "sglang.srt.mem_cache.unified_cache.components.full.FullComponent"
EVICTION_HOOKS: tuple[Hook, ...] = (
    gated_hook(f"{_MAMBA}._evict_device_start", "AROUND", reused_states_last,
               at="sglang/srt/mem_cache/unified_cache/components/mamba.py:373", fix="reused_states_last"),
    gated_hook("sglang.srt.mem_cache.unified_cache.tree_core_registry.resolve_tree_core_backend", "AROUND",
               python_tree_core, at="sglang/srt/mem_cache/unified_cache/tree_core_registry.py:109", gate=False),
    gated_hook(f"{_FULL}._evict_device_start", "AROUND", stateless_kv_first,
               at="sglang/srt/mem_cache/unified_cache/components/full.py:209", fix="stateless_kv_first"),
)
