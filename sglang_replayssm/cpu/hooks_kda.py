"""CPU runtime hooks for Kimi-Linear (KDA + MLA + MoE) on CPU tensors; each hook names the SGLang file it targets.

SGLang 0.5.23's CPU engine has no KDA path (kda_triton.py imports its Triton kernels only off CPU,
kda_backend.py always launches the Triton prefill conv) and Kimi's `o_norm` goes to a Triton
kernel without AMX. The hooks below route those calls, on CPU tensors only, to torch references
(cpu/kda.py); on any other device each hook calls SGLang's original.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_replayssm.cpu import kda
from sglang_replayssm.cpu.hooks import register_table

_KERNEL = "sglang.srt.layers.attention.linear.kernels.kda_triton.TritonKDAKernel"


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hooks = [
        # sglang/srt/layers/attention/linear/kernels/kda_triton.py: chunk_kda (prefill) is Triton-only
        # and not even imported on CPU.
        (f"{_KERNEL}.extend", kda.extend, HookType.AROUND, "kda-chunk-prefill"),
        # sglang/srt/layers/attention/linear/kernels/kda_triton.py: packed decode; with the pool's
        # ReplaySSM rings the ring decode (fused_recurrent_linear_replayssm_decode, is_kda=True).
        (f"{_KERNEL}.packed_decode", kda.packed_decode, HookType.AROUND, "kda-ring-decode"),
        # sglang/srt/layers/attention/linear/kernels/kda_triton.py: unpacked recurrent decode.
        (f"{_KERNEL}.decode", kda.decode, HookType.AROUND, "kda-decode"),
        # sglang/srt/layers/attention/linear/kernels/kda_triton.py: speculative verify (CPU: clear error).
        (f"{_KERNEL}.target_verify", kda.target_verify, HookType.AROUND, "kda-verify-unsupported"),
        # sglang/srt/layers/attention/linear/kda_backend.py: prefill conv always uses Triton causal_conv1d_fn.
        ("sglang.srt.layers.attention.linear.kda_backend.KDAAttnBackend._convolve_prefill",
         kda.convolve_prefill, HookType.AROUND, "kda-prefill-conv"),
        # sglang/kernels/ops/attention/fla/fused_norm_gate.py: Kimi's o_norm (sigmoid gate) is Triton,
        # or an AMX op that only supports silu.
        ("sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward",
         kda.fused_rmsnorm_gated_forward, HookType.AROUND, "fused-rmsnorm-gated"),
    ]
    names = register_table(hooks)
    # sglang/srt/layers/attention/linear/kernels/kda_triton.py: `supports_packed_decode = not is_cpu()
    # and ...` is a class attribute (HookRegistry cannot hook it); the packed path is where SGLang
    # passes the ReplaySSM ring, so it is turned on and served by the packed_decode hook above.
    from sglang.srt.layers.attention.linear.kernels.kda_triton import TritonKDAKernel

    TritonKDAKernel.supports_packed_decode = True
    return names + ["kda-packed-decode-on"]
