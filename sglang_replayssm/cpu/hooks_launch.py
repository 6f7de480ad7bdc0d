"""CPU runtime hook on SGLang's server-argument handling: the launch defaults and refusals of
cpu/launch_args.py, applied to the command line in the server's main process."""

from __future__ import annotations

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import launch_args, launch_tp
from sglang_replayssm.hook_table import Hook, Patch

HOOKS: tuple[Hook, ...] = (
    # prepare_server_args(argv) parses the launcher's command line (python -m sglang.launch_server,
    # sglang serve); the CPU runtime's defaults are appended before it parses.
    Hook("sglang.srt.server_args.prepare_server_args", "BEFORE", launch_args.before_prepare_server_args,
         "sglang/srt/server_args.py:668", "launch-defaults"),
    # resolve_once() resolves every ServerArgs, also one built from keyword arguments
    # (sglang.Engine(**kwargs), no command line): the same defaults on its fields.
    Hook("sglang.srt.server_args.ServerArgs.resolve_once", "BEFORE", launch_args.before_resolve_once,
         "sglang/srt/server_args.py:244", "engine-defaults"),
    # Every process group asks for PyNccl, which needs a CUDA device (--tp/--dp on CPU: gloo).
    Hook("sglang.srt.distributed.parallel_state.GroupCoordinator.__init__", "BEFORE", launch_tp.no_pynccl,
         "sglang/srt/distributed/parallel_state.py:295", "tp-no-pynccl"),
)


#: What HookRegistry cannot express (a method the class lacks), set directly.
PATCHES: tuple[Patch, ...] = (
    # DP attention's batch padding asks the attention backend for its CPU fill value.
    Patch("sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.get_cpu_graph_seq_len_fill_value",
          launch_tp.cpu_graph_seq_len_fill_value, "sglang/srt/model_executor/forward_batch_info.py:2014",
          "dp-attention-fill-value"),
)


def register() -> list[str]:
    """Register this part's hooks and set its patches; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS] + hook_table.apply_patches(PATCHES)
