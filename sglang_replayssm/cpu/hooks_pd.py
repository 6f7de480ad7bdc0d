"""CPU runtime hook for PD disaggregation: the prefill side's transfer indices stay on the host path.

``MooncakeKVSender.supports_host_tensor_indices = True`` (disaggregation/mooncake/conn.py:3312) sends
the prefill server into a pinned D2H copy plus ``torch.cuda.Event().record(...)``
(disaggregation/prefill.py:1746-1761), which raises without an NVIDIA driver. On the CPU runtime
every sender answers False: SGLang's own ``kv_to_page_indices`` path (the same page indices, no device).
"""

from __future__ import annotations

from typing import Any

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook

__all__ = ["HOOKS", "host_indices_off", "register"]


def host_indices_off(result: Any, sender: Any, *args: Any, **kwargs: Any) -> None:
    """After a KV sender is built: no device-side transfer indices (there is no device)."""
    sender.supports_host_tensor_indices = False


HOOKS: tuple[Hook, ...] = (
    Hook("sglang.srt.disaggregation.common.conn.CommonKVSender.__init__", "AFTER", host_indices_off,
         "sglang/srt/disaggregation/common/conn.py:2110", "pd-host-transfer-indices"),
)


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS]
