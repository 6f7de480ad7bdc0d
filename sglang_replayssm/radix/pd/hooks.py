"""The pd room's hooks: the decode ring on the PD decode server's mamba pool (:mod:`decode_pool`) and
the decode server's own prefix hits (:mod:`hits`). :func:`install` puts the PD part of the admission
in place (the disaggregation modes the decode ring serves, SGLang's decode-side check answered)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix.gated import gated_hook, lazy

__all__ = ["PD_HOOKS", "install"]


def decode_pool_ring(original: Callable[..., Any], req_to_token_pool: Any, *args: Any, **kwargs: Any) -> Any:
    """The PD decode server's mamba pool gets the decode ring (radix/pd/decode_pool.py)."""
    from sglang_replayssm.radix.pd.decode_pool import ring_on_decode_pool

    return ring_on_decode_pool(original, req_to_token_pool, *args, **kwargs)


@contextmanager
def _admit(mode: str, error: Callable[[str], BaseException], guard_module: str) -> Iterator[None]:
    """Refuse a disaggregation mode the decode ring cannot serve, then answer SGLang's decode check."""
    import importlib

    from sglang_replayssm.radix.pd.decode_pool import admit_disaggregation, decode_check_answered

    admit_disaggregation(mode, error)
    with decode_check_answered(importlib.import_module(guard_module)):
        yield


def install() -> None:
    """Install the PD part of the admission (idempotent)."""
    from sglang_replayssm.radix import admission

    admission.use_disaggregation(_admit)


#: The pd room's hooks.
PD_HOOKS: tuple[Hook, ...] = (
    gated_hook("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool", "AROUND",
               decode_pool_ring, at="sglang/srt/mem_cache/memory_pool.py:1426", fix="pd_decode_ring"),
    gated_hook("sglang.srt.disaggregation.decode.DecodePreallocQueue._pre_alloc", "AFTER",
               lazy("sglang_replayssm.radix.pd.hits", "count_admission", "count_decode_hits",
                    "A PD decode admission logs its own prefix hit (the decode tree's) and the running hit rate."),
               at="sglang/srt/disaggregation/decode.py:2237", fix="pd_hits"),
)
