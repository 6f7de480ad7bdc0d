"""KDA force flush at radix track boundaries.

SGLang's decode metadata (``MambaAttnBackendBase._forward_metadata`` eager, ``_replay_metadata``
for CUDA graphs) computes ``force_flush = seq_lens % mamba_track_interval == 0`` and folds the
ring into ``temporal[slot]`` on those steps, so the extra_buffer decode track copies an exact
state. It skips this when ``mamba_pool.replayssm_is_kda`` is set, so a KDA track snapshot copies a
checkpoint that lags by up to L-1 tokens.

Fix: for the duration of those two metadata functions only, the pool reports
``replayssm_is_kda = False``; inside them the flag gates nothing but the force-flush mask (the
kernel's gate layout comes from the layer, not from this flag), so KDA is force-flushed exactly
like GDN, on the same steps the track snapshot is taken (``track_grid`` is a multiple of
``mamba_track_interval``). Every other reader of the flag (spec paths) sees the true value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["with_kda_force_flush"]


def with_kda_force_flush(original: Callable[..., Any], backend: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a decode-metadata function with the pool's KDA flag lowered (decode ring only)."""
    mamba_pool = getattr(getattr(backend, "req_to_token_pool", None), "mamba_pool", None)
    if (
        mamba_pool is None
        or not getattr(mamba_pool, "replayssm_is_kda", False)
        or not getattr(mamba_pool, "enable_linear_replayssm", False)
    ):
        return original(backend, *args, **kwargs)
    mamba_pool.replayssm_is_kda = False
    try:
        return original(backend, *args, **kwargs)
    finally:
        mamba_pool.replayssm_is_kda = True
