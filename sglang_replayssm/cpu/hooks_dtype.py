"""Dtype agreement hooks for GDN/KDA hybrids served at a dtype other than their checkpoint's; any device.

SGLang 0.5.23 serves an fp32 checkpoint at float16 under ``--dtype auto`` (``_get_and_verify_dtype``)
and at whatever ``--dtype`` says otherwise. Two places then disagree with the serving dtype, on CPU
and on CUDA alike:

* the mamba conv pool's dtype is ``SGLANG_MAMBA_CONV_DTYPE`` (default bfloat16) whatever the model
  is, while extra_buffer's prefill track writes the model's activations into it
  (``conv_states[mask_indices] = mixed_qkv_to_track``, layers/attention/linear/gdn_backend.py:1066):
  ``Index put requires the source and destination dtypes match``. Here, unless the user set
  ``SGLANG_MAMBA_CONV_DTYPE``, the conv pool takes the serving dtype (what SGLang writes into it);
  a bfloat16 model keeps today's bfloat16 pool;
* Kimi-Linear's ``fused_fg_b_proj`` (models/kimi_linear.py:322) is a ``ColumnParallelBatchedLinear``
  built at the checkpoint's ``config.dtype`` while its input is at the serving dtype: ``torch.bmm``
  raises ``expected scalar type Float but found Half``. Here a mismatched call computes in fp32 and
  returns the input's dtype (a matched call is SGLang's own).

A user-set ``SGLANG_MAMBA_CONV_DTYPE`` that differs from the serving dtype is kept (the user's choice),
but with ``extra_buffer(_lazy)`` that is the index-put crash above at the first tracked prefill, so it
is refused at startup in one line (an AFTER hook on ``ServerArgs.resolve_once``, in the main process,
before any scheduler starts), naming the value that works.

The serving dtype is recorded from SGLang's own resolution (an AFTER hook on
``_get_and_verify_dtype``), which each process runs while building its ModelConfig, before any pool.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook

logger = logging.getLogger("sglang_replayssm")

#: The model dtype this process's SGLang resolved last (None until a ModelConfig was built).
_serving_dtype: torch.dtype | None = None
_logged = False


def record_serving_dtype(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook body for ``model_config._get_and_verify_dtype``: remember the resolved dtype."""
    global _serving_dtype
    if isinstance(result, torch.dtype):
        _serving_dtype = result


def conv_dtype_follows_model(original: Callable[..., Any], config: Any = None) -> Any:
    """AROUND hook body for ``mamba_utils.mamba2_state_dtype``: the conv dtype is the serving dtype
    unless ``SGLANG_MAMBA_CONV_DTYPE`` is set; the temporal (ssm) dtype is SGLang's choice."""
    global _logged
    chosen = original(config)
    if os.environ.get("SGLANG_MAMBA_CONV_DTYPE") or _serving_dtype is None or chosen.conv == _serving_dtype:
        return chosen
    if not _logged:
        _logged = True
        logger.warning("sglang-replayssm: mamba conv pool at the model's %s (SGLang's default %s differs; "
                       "set SGLANG_MAMBA_CONV_DTYPE to choose)", _serving_dtype, chosen.conv)
    return dataclasses.replace(chosen, conv=_serving_dtype)


class ConvDtypeError(SystemExit):
    """A conv-pool dtype SGLang cannot write into: a SystemExit, so the launcher prints this one line."""

    def __init__(self, message: str) -> None:
        super().__init__(f"sglang-replayssm: {message}")

    def __str__(self) -> str:
        return str(self.code)


_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def conv_dtype_refusal(user_conv: str | None, strategy: str, serving: torch.dtype | None) -> str | None:
    """The refusal for a user-set conv dtype ``user_conv`` under ``strategy`` at ``serving``, or None."""
    if not user_conv or serving is None or strategy not in ("extra_buffer", "extra_buffer_lazy"):
        return None
    want = _DTYPE_NAMES.get(serving)
    if user_conv == want:
        return None
    return (f"SGLANG_MAMBA_CONV_DTYPE={user_conv} differs from the served dtype {want}, and "
            f"--mamba-radix-cache-strategy {strategy} writes the model's {want} activations into the conv pool "
            f"(gdn_backend.py:1066 fails: 'Index put requires the source and destination dtypes match'); "
            f"unset SGLANG_MAMBA_CONV_DTYPE or set it to {want}.")


def refuse_conv_dtype_mismatch(result: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook body for ``ServerArgs.resolve_once`` (main process, before the schedulers start)."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    model_config = getattr(server_args, "_model_config", None)
    if model_config is None or not os.environ.get("SGLANG_MAMBA_CONV_DTYPE"):
        return None
    message = conv_dtype_refusal(os.environ["SGLANG_MAMBA_CONV_DTYPE"],
                                 str(resolved_view(server_args).mamba_radix_cache_strategy),
                                 getattr(model_config, "dtype", None))
    if message is not None:
        raise ConvDtypeError(message)
    return None


def batched_linear_forward(original: Callable[..., Any], self: Any, input: torch.Tensor) -> torch.Tensor:
    """AROUND hook body for ``ColumnParallelBatchedLinear.forward``: input [B, N, in] at the serving
    dtype, weight [B, out, in] at the checkpoint's; on a mismatch bmm in fp32, result in input's dtype."""
    weight = self.weight
    if input.dtype == weight.dtype:
        return original(self, input)
    return torch.bmm(input.float(), weight.float().transpose(-1, -2)).to(input.dtype)


#: The dtype-agreement hooks (registered on every device).
HOOKS: tuple[Hook, ...] = (
    # _get_and_verify_dtype resolves --dtype (auto: an fp32 checkpoint -> float16).
    Hook("sglang.srt.configs.model_config._get_and_verify_dtype", "AFTER", record_serving_dtype,
         "sglang/srt/configs/model_config.py:2284", "serving-dtype"),
    # mamba2_state_dtype takes the conv pool dtype from SGLANG_MAMBA_CONV_DTYPE only.
    Hook("sglang.srt.configs.mamba_utils.mamba2_state_dtype", "AROUND", conv_dtype_follows_model,
         "sglang/srt/configs/mamba_utils.py:47", "conv-pool-dtype"),
    # resolve_once resolves the strategy (auto -> extra_buffer) and builds the ModelConfig.
    Hook("sglang.srt.server_args.ServerArgs.resolve_once", "AFTER", refuse_conv_dtype_mismatch,
         "sglang/srt/server_args.py:244", "conv-dtype-refusal"),
    # Kimi-Linear's fused_fg_b_proj runs this bmm with a checkpoint-dtype weight.
    Hook("sglang.srt.layers.linear.ColumnParallelBatchedLinear.forward", "AROUND", batched_linear_forward,
         "sglang/srt/layers/linear.py:1949", "batched-linear-dtype"),
)


def register() -> list[str]:
    """Register the dtype hooks and set the Triton interpreter's bf16 patches (cpu/interpret_bf16.py;
    used wherever TRITON_INTERPRET=1 runs a kernel); returns their short names for the load log line."""
    from sglang_replayssm.cpu import interpret_bf16

    hook_table.register(HOOKS)
    return [h.name for h in HOOKS] + hook_table.apply_patches(interpret_bf16.PATCHES)
