"""CPU runtime hooks for speculative decoding (EAGLE / NEXTN, chain drafts) on CPU tensors; the
table names each target with its SGLang file:line.

SGLang 0.5.23 commits a hybrid model's speculative step with two Triton scatters that refuse CPU
tensors (``only supports CUDA/XPU tensors``), so upstream cannot commit a spec step on CPU at all.
The hooks route them, on CPU tensors only, to torch (cpu/spec_standin.py); on any other device each
calls SGLang's original. The verify-mode conv and recurrent updates are the stand-in's
``sgl_kernel`` ops (cpu/standin), the EAGLE bookkeeping functions cpu/standin/spec.py and the
attention ops cpu/standin/attention.py.
"""

from __future__ import annotations

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import spec_standin
from sglang_replayssm.hook_table import Hook

_SCATTER = "sglang.kernels.ops.mamba.mamba_state_scatter_triton"

#: The spec part's HookRegistry hooks.
HOOKS: tuple[Hook, ...] = (
    Hook(f"{_SCATTER}.fused_mamba_state_scatter_with_mask", "AROUND", spec_standin.mamba_state_scatter,
         "sglang/kernels/ops/mamba/mamba_state_scatter_triton.py:312", "spec-state-scatter"),
    Hook(f"{_SCATTER}.fused_conv_window_scatter_with_mask", "AROUND", spec_standin.conv_window_scatter,
         "sglang/kernels/ops/mamba/mamba_state_scatter_triton.py:487", "spec-conv-scatter"),
)


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS]
