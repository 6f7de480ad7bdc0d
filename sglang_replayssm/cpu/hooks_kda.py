"""CPU runtime hooks for Kimi-Linear (KDA + MLA + MoE) on CPU tensors; the table names each target with its SGLang file:line.

SGLang 0.5.23's CPU engine has no KDA path (kda_triton.py imports its Triton kernels only off CPU,
kda_backend.py always launches the Triton prefill conv) and Kimi's `o_norm` goes to a Triton
kernel without AMX. The hooks below route those calls, on CPU tensors only, to torch references
(cpu/kda.py); on any other device each hook calls SGLang's original.
"""

from __future__ import annotations

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import kda
from sglang_replayssm.hook_table import Hook, Patch

_KERNEL = "sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel"


#: The KDA part's HookRegistry hooks.
HOOKS: tuple[Hook, ...] = (
    # chunk_kda (prefill) is Triton-only and not even imported on CPU.
    Hook(f"{_KERNEL}.extend", "AROUND", kda.extend,
         "sglang/srt/layers/attention/linear/kernels/kda_triton.py:223", "kda-chunk-prefill"),
    # Packed decode; with the pool's ReplaySSM rings the ring decode
    # (fused_recurrent_linear_replayssm_decode, is_kda=True).
    Hook(f"{_KERNEL}.packed_decode", "AROUND", kda.packed_decode,
         "sglang/srt/layers/attention/linear/kernels/kda_triton.py:37", "kda-ring-decode"),
    # Unpacked recurrent decode.
    Hook(f"{_KERNEL}.decode", "AROUND", kda.decode,
         "sglang/srt/layers/attention/linear/kernels/kda_triton.py:129", "kda-decode"),
    # Speculative verify (CPU: clear error).
    Hook(f"{_KERNEL}.target_verify", "AROUND", kda.target_verify,
         "sglang/srt/layers/attention/linear/kernels/kda_triton.py:163", "kda-verify-unsupported"),
    # The prefill conv always uses Triton causal_conv1d_fn.
    Hook("sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend._convolve_prefill", "AROUND",
         kda.convolve_prefill, "sglang/srt/layers/attention/linear/kda_backend.py:1021", "kda-prefill-conv"),
    # Kimi's o_norm (sigmoid gate) is Triton, or an AMX op that only supports silu.
    Hook("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward", "AROUND",
         kda.fused_rmsnorm_gated_forward, "sglang/kernels/ops/attention/fla/fused_norm_gate.py:435",
         "fused-rmsnorm-gated"),
)

#: What HookRegistry cannot express, set directly.
PATCHES: tuple[Patch, ...] = (
    # `supports_packed_decode = not is_cpu() and ...` is a class attribute (HookRegistry cannot hook
    # it); the packed path is where SGLang passes the ReplaySSM ring, so it is turned on and served
    # by the packed_decode hook above.
    Patch(f"{_KERNEL}.supports_packed_decode", True,
          "sglang/srt/layers/attention/linear/kernels/kda_triton.py:33", "kda-packed-decode-on"),
)


def register() -> list[str]:
    """Register this part's hooks and set its patches; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS] + hook_table.apply_patches(PATCHES)
