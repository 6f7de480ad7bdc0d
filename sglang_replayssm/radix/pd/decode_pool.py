"""PD disaggregation with the decode ring: the decode server's mamba pool runs the ring; admission.

SGLang 0.5.23 refuses ``--enable-linear-replayssm`` under any ``--disaggregation-mode``
(``arg_groups/attention_hook.py:424-432``) because its decode-side pool,
``HybridMambaDecodeReqToTokenPool`` (``disaggregation/decode.py:275-354``), calls
``_init_mamba_pool`` without ``enable_linear_replayssm``: the decode server would run SGLang's
plain decode while the flag says ring.

Why the ring is exact on a PD decode server (the invariant this module relies on):

* the prefill server never decodes, so its slot's ``temporal`` is the exact post-prefill state;
  the transfer carries conv + temporal only (``MambaPool._NON_TRANSFER_STATE_FIELDS``,
  ``mem_cache/memory_pool.py:1245-1257``, excludes the ring tensors), and the per-layer transfer
  buffers are the same with and without the ring on either side;
* the decode slot that receives the state is handed out by ``MambaSlotAllocator.alloc``
  (``HybridReqToTokenPool.alloc``, ``memory_pool.py:1590-1608``) before the transfer lands, so the
  cursor choke point (:mod:`alloc_reset`, fix ``cursor_reset``) gives it an empty ring: after the
  import ``temporal[slot]`` is the slot's whole state;
* everything that reads a live slot on the decode side afterwards (CPU retraction backup,
  decode-radix copy-on-write, finish donation, track snapshots) goes through the adapter's
  existing movers.

With rings keyed by request row (radix/ring/rows.py) the decode pool's rings are its request rows
(running requests and pre-allocated transfers, ``size + pre_alloc_size + 1``); its ``alloc`` is
``HybridReqToTokenPool.alloc``, where the slot -> row map is written, so a receiving slot reads the
empty ring of its request's row.

Admitted here (fix ``pd_decode_ring``): ``--disaggregation-mode decode`` with the ring; SGLang's own
PD refusal is answered "not disaggregated" for the duration of its function only (every other check
in it runs unchanged). Refused in one line: a prefill server with the ring (it never decodes; the
ring would be unused memory), and with the fix off, PD with the ring as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sglang_replayssm.radix import config

logger = logging.getLogger(__name__)
__all__ = ["admit_disaggregation", "decode_check_answered", "ring_on_decode_pool"]

#: The decode-side pool class whose ``_init_mamba_pool`` call lacks ``enable_linear_replayssm``.
_DECODE_POOL = ("sglang.srt.disaggregation.decode", "HybridMambaDecodeReqToTokenPool")


def admit_disaggregation(mode: str, error: Callable[[str], BaseException]) -> None:
    """Raise ``error(one line)`` unless ``--disaggregation-mode mode`` can run the decode ring exactly."""
    if mode == "prefill":
        raise error(
            "sglang-replayssm: --disaggregation-mode prefill with --enable-linear-replayssm is unsupported: "
            "a prefill server never decodes; launch it without --enable-linear-replayssm (the decode server "
            "keeps the ring)."
        )
    if mode != "decode" or not config.enabled("pd_decode_ring"):
        raise error(
            f"sglang-replayssm: --disaggregation-mode {mode} with --enable-linear-replayssm is unsupported"
            + ("" if mode != "decode" else " while the pd_decode_ring fix is off")
            + ": SGLang's decode-side mamba pool is not wired for the ring."
        )


class _Aggregated:
    """A resolving view of the server args that reads ``disaggregation_mode`` as ``"null"``."""

    def __init__(self, view: Any) -> None:
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name: str) -> Any:
        if name == "disaggregation_mode":
            return "null"
        return getattr(object.__getattribute__(self, "_view"), name)


@contextmanager
def decode_check_answered(module: Any) -> Iterator[None]:
    """While the body runs, ``module.resolving_view`` (SGLang's ``attention_hook`` global) returns
    views whose ``disaggregation_mode`` is ``"null"``; restored afterwards, also on error.

    Only ``handle_linear_attn_backend`` runs in the body: its one PD check with the decode ring is
    ``attention_hook.py:424``; its other reads of the mode are in the spec-ring branch, which is
    refused with the decode ring before it (``attention_hook.py:499-505``)."""
    original = module.__dict__["resolving_view"]
    setattr(module, "resolving_view", lambda server_args: _Aggregated(original(server_args)))  # noqa: B010
    try:
        yield
    finally:
        setattr(module, "resolving_view", original)  # noqa: B010


def _is_decode_pool(req_to_token_pool: Any) -> bool:
    import importlib

    module = importlib.import_module(_DECODE_POOL[0])
    return isinstance(req_to_token_pool, getattr(module, _DECODE_POOL[1]))


def _decode_ring_on() -> bool:
    """The server runs the decode ring (not the spec ring), from SGLang's resolved exec config."""
    from sglang.srt.runtime_context import get_exec

    mamba = get_exec().mamba
    return bool(mamba.enable_linear_replayssm) and not bool(getattr(mamba, "enable_linear_replayssm_spec", False))


def ring_on_decode_pool(original: Callable[..., Any], req_to_token_pool: Any, *args: Any, **kwargs: Any) -> Any:
    """``HybridReqToTokenPool._init_mamba_pool``, with ``enable_linear_replayssm`` passed on for the PD
    decode pool's own call (``disaggregation/decode.py:338``) when the server runs the decode ring.

    Invariant: only that call changes (it passes ``linear_replayssm_cache_len`` but not the flag);
    the aggregated pool's call (which passes the flag) and draft clones (``clone_with_new_mamba``,
    neither) are SGLang's, as in a non-PD server."""
    if (
        "enable_linear_replayssm" not in kwargs
        and "linear_replayssm_cache_len" in kwargs
        and _is_decode_pool(req_to_token_pool)
        and _decode_ring_on()
    ):
        kwargs["enable_linear_replayssm"] = True
        _log_unpriced_rings(kwargs, req_to_token_pool)
    return original(req_to_token_pool, *args, **kwargs)


def _log_unpriced_rings(kwargs: dict[str, Any], req_to_token_pool: Any) -> None:
    """Log the decode-ring bytes the mamba budget did not charge. A ring per slot: the slots the decode pool
    adds above the budgeted ``--max-mamba-cache-size`` (``decode.py:322-333`` raises it to ``(reqs + extra
    slots) x slots per request``; SGLang prices neither their conv + temporal nor, here, their ring:
    :mod:`budget` charged the budgeted slots). Rings per request row: the rows of the pre-allocated transfers
    (``--disaggregation-decode-extra-slots``), beyond the running requests' rows the budget charged."""
    from sglang.srt.runtime_context import get_schedule

    from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot, ring_row_bytes
    from sglang_replayssm.radix.ring.rows import rows_on

    params, record_len = kwargs["cache_params"], kwargs["linear_replayssm_cache_len"]
    if rows_on():
        extra = req_to_token_pool.pre_alloc_size  # set by DecodeReqToTokenPool.__init__ before this call
        if extra:
            logger.warning("sglang-replayssm: the PD decode pool has %d request rows for pre-allocated transfers "
                           "(--disaggregation-decode-extra-slots); their decode rings (%.1f MiB) are not in the "
                           "mamba budget", extra, extra * ring_row_bytes(params, record_len) / (1 << 20))  # fmt: skip
        return
    budgeted, size = get_schedule().max_mamba_cache_size, kwargs.get("mamba_size")
    if budgeted is None or size is None or size <= budgeted:
        return
    ring = (size - budgeted) * decode_ring_bytes_per_slot(params, record_len)
    logger.warning("sglang-replayssm: the PD decode pool has %d mamba slots, %d above --max-mamba-cache-size %d; "
                   "their decode rings (%.1f MiB) are not in the mamba budget", size, size - budgeted, budgeted,
                   ring / (1 << 20))
