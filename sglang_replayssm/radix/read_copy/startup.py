"""What the read copy checks and charges at server start: :func:`check_read_copy` (an admission check,
:func:`sglang_replayssm.radix.admission.add_check`) and :func:`bytes_per_slot_charged` (its bytes per
mamba slot beside the decode ring, :func:`sglang_replayssm.radix.budget.add_slot_charge`), both
installed by :func:`sglang_replayssm.radix.read_copy.hooks.install`.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_replayssm.radix import config
from sglang_replayssm.radix.admission import ReplaySSMArgsError, _value

__all__ = ["bytes_per_slot_charged", "check_read_copy"]
logger = logging.getLogger(__name__)


def bytes_per_slot_charged(configurator: Any, cache_params: Any, record_len: int) -> int:
    """The read copy's bytes per slot (radix/read_copy/store.py: copy, scales, d~, v, beta, stale mark; not
    the d~ / v records where they are carved out of SGLang's ``replayssm_d``, fix ``read_copy_d_ring``),
    0 while ``SGLANG_REPLAYSSM_READ_COPY=off``; logged in one line when charged.

    The records' io dtype is the conv pool's (``cache_params.dtype.conv``, what ``attach`` allocates
    them in), else the served dtype."""
    from sglang_replayssm.radix.read_copy.store import bytes_per_slot, records_in_d_ring

    mode = config.read_copy_mode()
    if mode == "off":
        return 0
    served = getattr(getattr(configurator, "model_config", None), "dtype", None)
    io_itemsize = getattr(getattr(cache_params.dtype, "conv", None), "itemsize", getattr(served, "itemsize", 4))
    nbytes = bytes_per_slot(cache_params, record_len, mode, io_itemsize)
    hv, v_dim, _ = cache_params.shape.temporal
    records = 2 * hv * record_len * v_dim * io_itemsize * len(cache_params.layers)
    carved = records_in_d_ring(cache_params.dtype.temporal.itemsize, io_itemsize, hv * record_len * v_dim)
    logger.info("sglang-replayssm read copy (%s): %d B (%.3f MiB) per mamba slot charged beside the decode ring; "
                "d~ / v records %.3f MiB per slot %s", mode, nbytes, nbytes / (1 << 20), records / (1 << 20),
                "carved out of SGLang's replayssm_d (not charged)" if carved else "allocated (charged)")  # fmt: skip
    return nbytes




def check_read_copy(server_args: Any) -> None:
    """Refuse ``SGLANG_REPLAYSSM_READ_COPY`` in one line where it cannot be exact or run: a bad value,
    no decode ring, the spec ring or speculative decoding, an explicit non-fp32 ``--mamba-ssm-dtype``
    (an unset ssm dtype is checked on the allocated checkpoint, :func:`read_copy.attach`), the Helion
    decode backend."""
    from sglang_replayssm.radix.read_copy.store import refusal

    try:
        mode = config.read_copy_mode()
    except ValueError as exc:
        raise ReplaySSMArgsError(f"sglang-replayssm: {exc}") from None
    decode_backend = _value(server_args, "linear_attn_decode_backend", None) or _value(
        server_args, "linear_attn_backend", None)
    why = refusal(mode, ssm_dtype=_value(server_args, "mamba_ssm_dtype", None),
                  decode_ring=bool(_value(server_args, "enable_linear_replayssm", False)),
                  spec_ring=bool(_value(server_args, "enable_linear_replayssm_spec", False)),
                  speculative=_value(server_args, "speculative_algorithm", None) is not None,
                  decode_backend=decode_backend)  # fmt: skip
    if why is not None:
        raise ReplaySSMArgsError(why)


