"""CPU runtime hooks for PD disaggregation: the prefill side records no CUDA event.

Two places on SGLang's prefill side build ``torch.cuda.Event``s, which raise on the CPU runtime:

* ``MooncakeKVSender.supports_host_tensor_indices = True`` (disaggregation/mooncake/conn.py:3312) sends
  every KV chunk into a pinned D2H copy plus ``torch.cuda.Event().record(...)``
  (disaggregation/prefill.py:1746-1761): ``RuntimeError: Found no NVIDIA driver``. Fix
  ``pd_host_indices``: every sender answers False, SGLang's own ``kv_to_page_indices`` path (the same
  page indices, no device).
* Under overlap scheduling a prefix hit's early send records an event on the forward stream
  (disaggregation/prefill.py:1495-1497) so the transfer worker can wait for the previous forward's
  prefix writes; on CPU ``forward_stream`` is a ``torch.cpu.Stream`` and ``record`` raises
  ``expected stream to be a torch.Stream or torch.cuda.Stream object`` (the prefill scheduler dies at
  the first request that hits). Fix ``pd_early_send_event``: the early send runs as without overlap
  (no event, the worker does not wait). Invariant that makes this exact: on the CPU runtime every
  forward runs synchronously on the scheduler thread (a CPU stream queues nothing), so when
  ``run_batch`` reaches the early send the previous forward's KV writes have all landed.

Both fixes have switches in radix/config.py; off, the hook calls straight through to SGLang.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm import hook_table
from sglang_replayssm.hook_table import Hook
from sglang_replayssm.radix import config

__all__ = ["HOOKS", "early_send_without_event", "host_indices_off", "register"]


def host_indices_off(result: Any, sender: Any, *args: Any, **kwargs: Any) -> None:
    """After a KV sender is built: no device-side transfer indices (there is no device)."""
    if config.enabled("pd_host_indices"):
        sender.supports_host_tensor_indices = False


def early_send_without_event(original: Callable[..., Any], scheduler: Any, req: Any, *args: Any,
                             **kwargs: Any) -> Any:
    """The cached-prefix early send with ``enable_overlap`` read as False for this call only: SGLang's
    non-overlap branch (no completion event). ``scheduler.enable_overlap`` is restored before return,
    also when the send raises; the flag is read by nothing else during the call (one scheduler thread)."""
    overlap = getattr(scheduler, "enable_overlap", False)
    if not overlap or not config.enabled("pd_early_send_event"):
        return original(scheduler, req, *args, **kwargs)
    scheduler.enable_overlap = False
    try:
        return original(scheduler, req, *args, **kwargs)
    finally:
        scheduler.enable_overlap = overlap


HOOKS: tuple[Hook, ...] = (
    Hook("sglang.srt.disaggregation.common.conn.CommonKVSender.__init__", "AFTER", host_indices_off,
         "sglang/srt/disaggregation/common/conn.py:2110", "pd-host-transfer-indices", fix="pd_host_indices"),
    Hook("sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk",
         "AROUND", early_send_without_event, "sglang/srt/disaggregation/prefill.py:1460", "pd-early-send-no-event",
         fix="pd_early_send_event"),
)


def register() -> list[str]:
    """Register this part's hooks; returns their short names for the load log line."""
    hook_table.register(HOOKS)
    return [h.name for h in HOOKS]
