"""CPU runtime hook on SGLang's server-argument handling: the launch defaults and refusals of
cpu/launch_args.py, applied to the command line in the server's main process."""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookType

from sglang_replayssm.cpu import launch_args
from sglang_replayssm.cpu.hooks import register_table


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hooks = [
        # sglang/srt/server_args.py: prepare_server_args(argv) parses the launcher's command line
        # (python -m sglang.launch_server, sglang serve); defaults are appended before it parses.
        ("sglang.srt.server_args.prepare_server_args", launch_args.before_prepare_server_args, HookType.BEFORE,
         "launch-defaults"),
    ]
    return register_table(hooks)
