"""Every hook the CPU reference runtime installs into SGLang 0.5.23, each naming the file it targets.

Active only where libcuda cannot load (see cpu/autoload.py); on a GPU machine nothing here is
registered. The invariant: SGLang's own scheduler, radix cache, pools and model code run unchanged;
only device kernels that cannot run without CUDA are replaced by torch references on CPU tensors.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_replayssm.cpu import decode, norm


def _true(*args, **kwargs) -> bool:
    return True


def _no_host_register(buffer, registration_granularity_bytes=None) -> None:
    """CPU host pools need no cudaHostRegister: there is no device to DMA from."""
    return None


def _pin_memory_noop(self, device=None):
    """Without a CUDA driver page-locking is meaningless (and raises); the tensor is returned as is."""
    return self


def register_table(hooks: list[tuple]) -> list[str]:
    """Register ``(target, fn, HookType, short name)`` rows with SGLang's HookRegistry; return the names."""
    for target, fn, kind, _ in hooks:
        HookRegistry.register(target, fn, kind)
    return [name for *_, name in hooks]


def register() -> list[str]:
    """Register the CPU runtime's hooks; returns their short names for the load log line."""
    hooks = [
        # sglang/kernels/ops/attention/fla/layernorm_gated.py: gated RMSNorm is Triton or AMX-only.
        ("sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward", norm.rmsnorm_gated_forward,
         HookType.AROUND, "gated-rmsnorm"),
        # sglang/srt/arg_groups/mamba_hook.py: extra_buffer needs platform snapshot support; the CPU
        # runtime's snapshots are the torch copies SGLang's pool already does on CPU tensors.
        ("sglang.srt.arg_groups.mamba_hook._platform_supports_mamba_cache_extra_buffer", _true,
         HookType.REPLACE, "extra_buffer-snapshots"),
        # sglang/srt/mem_cache/pool_host/common.py: HiCache host pools call cudaHostRegister.
        ("sglang.srt.mem_cache.pool_host.common._cuda_host_register", _no_host_register,
         HookType.REPLACE, "hicache-host-pool"),
        # sglang/srt/layers/attention/linear/kernels/gdn_triton.py: packed / ReplaySSM ring decode.
        ("sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode",
         decode.gdn_packed_decode, HookType.AROUND, "gdn-ring-decode"),
        # sglang/kernels/ops/mamba/mamba_state_scatter_triton.py: the extra_buffer track copy is a Triton
        # kernel (interpreted on CPU: ~0.15 s a launch, every decode step); a torch copy on CPU tensors.
        ("sglang.kernels.ops.mamba.mamba_state_scatter_triton._launch_track_mamba_states",
         decode.track_states_copy, HookType.AROUND, "track-copy"),
    ]
    names = register_table(hooks)
    # sglang/srt/layers/attention/linear/kernels/gdn_triton.py: `supports_packed_decode = not is_cpu()`
    # is a class attribute (HookRegistry cannot hook it); the packed path is where the ring decode runs.
    from sglang.srt.layers.attention.linear.kernels.gdn_triton import TritonGDNKernel

    TritonGDNKernel.supports_packed_decode = True
    # sglang/srt/managers/schedule_batch.py (prepare_for_decode, mamba track mask) and others call
    # `.pin_memory()` on host tensors before an async H2D copy; with no CUDA driver that raises.
    import torch

    torch.Tensor.pin_memory = _pin_memory_noop  # type: ignore[method-assign]  # a class attribute, not hookable
    return names + ["pin_memory-noop"]
