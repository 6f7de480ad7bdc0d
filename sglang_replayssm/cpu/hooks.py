"""Every hook and patch the CPU reference runtime installs into SGLang 0.5.23, in the tables below.

Active only where libcuda cannot load (see cpu/autoload.py); on a GPU machine nothing here is
registered. The invariant: SGLang's own scheduler, radix cache, pools and model code run unchanged;
only device kernels that cannot run without CUDA are replaced by torch references on CPU tensors.
"""

from __future__ import annotations

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import decode, norm
from sglang_replayssm.hook_table import Hook, Patch


def _true(*args, **kwargs) -> bool:
    return True


def _no_host_register(buffer, registration_granularity_bytes=None) -> None:
    """CPU host pools need no cudaHostRegister: there is no device to DMA from."""
    return None


def _pin_memory_noop(self, device=None):
    """Without a CUDA driver page-locking is meaningless (and raises); the tensor is returned as is."""
    return self


_GDN_KERNEL = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel"

#: The CPU runtime's HookRegistry hooks (why each is needed: its name and the function's docstring).
HOOKS: tuple[Hook, ...] = (
    # Gated RMSNorm is Triton or AMX-only.
    Hook("sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward", "AROUND", norm.rmsnorm_gated_forward,
         "sglang/kernels/ops/attention/fla/layernorm_gated.py:515", "gated-rmsnorm"),
    # extra_buffer needs platform snapshot support; the CPU runtime's snapshots are the torch copies
    # SGLang's pool already does on CPU tensors.
    Hook("sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer", "REPLACE", _true,
         "sglang/srt/arg_groups/mamba_hook.py:102", "extra_buffer-snapshots"),
    # HiCache host pools call cudaHostRegister.
    Hook("sglang.srt.mem_cache.pool_host.common._cuda_host_register", "REPLACE", _no_host_register,
         "sglang/srt/mem_cache/pool_host/common.py:143", "hicache-host-pool"),
    # Packed / ReplaySSM ring decode.
    Hook(f"{_GDN_KERNEL}.packed_decode", "AROUND", decode.gdn_packed_decode,
         "sglang/srt/layers/attention/linear/kernels/gdn_triton.py:46", "gdn-ring-decode"),
    # The extra_buffer track copy is a Triton kernel (interpreted on CPU: ~0.15 s a launch, every
    # decode step); a torch copy on CPU tensors.
    Hook("sglang.kernels.ops.mamba.mamba_state_scatter_triton._launch_track_mamba_states", "AROUND",
         decode.track_states_copy, "sglang/kernels/ops/mamba/mamba_state_scatter_triton.py:144", "track-copy"),
)

#: What HookRegistry cannot express, set directly.
PATCHES: tuple[Patch, ...] = (
    # `supports_packed_decode = not is_cpu() ...` is a class attribute (HookRegistry cannot hook it);
    # the packed path is where the ring decode runs.
    Patch(f"{_GDN_KERNEL}.supports_packed_decode", True,
          "sglang/srt/layers/attention/linear/kernels/gdn_triton.py:43", "gdn-packed-decode-on"),
    # prepare_for_decode (mamba track mask) and others call `.pin_memory()` on host tensors before an
    # async H2D copy; with no CUDA driver that raises. A method of torch's tensor type, for every caller.
    Patch("torch.Tensor.pin_memory", _pin_memory_noop,
          "sglang/srt/managers/schedule_batch.py:3830", "pin_memory-noop"),
)


def register() -> list[str]:
    """Register the CPU runtime's hooks and set its patches; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS] + hook_table.apply_patches(PATCHES)
