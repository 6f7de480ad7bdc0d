"""The CPU runtime's PD prefill-side hooks (cpu/hooks_pd.py) on SGLang 0.5.23's own functions.

Each test runs SGLang's real code with the hook installed and fails with its switch off: there, SGLang
builds a ``torch.cuda.Event`` on the CPU runtime (``record`` on a CPU stream raises), or the sender keeps
the pinned-copy + CUDA-event index path.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch

from sglang_replayssm import hook_table
from sglang_replayssm.cpu import hooks_pd
from sglang_replayssm.radix import config


@pytest.fixture(scope="module", autouse=True)
def _installed() -> None:
    assert hook_table.install(hooks_pd.HOOKS) == list(hooks_pd.HOOKS)


def _prefill_scheduler(*, overlap: bool) -> Any:
    """A prefill scheduler as far as ``maybe_send_cached_prefix_chunk`` reads it (page size 1, no
    staging, a CPU forward stream); ``sent`` collects the ``send_kv_chunk`` calls."""
    from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin

    class Scheduler(SchedulerDisaggregationPrefillMixin):
        def __init__(self) -> None:
            self.enable_overlap = overlap
            self.enable_staging = False
            self.forward_stream = torch.cpu.Stream()
            self.token_to_kv_pool_allocator = SimpleNamespace(page_size=1)
            self.sent: list[tuple[Any, bool, int, object]] = []

        def send_kv_chunk(self, req: Any, last_chunk: bool = False, end_idx: int | None = None) -> None:
            self.sent.append((req, last_chunk, end_idx, req.disagg_kv_sender._early_send_wait_event))

    return Scheduler()


def _hit_req(prefix_len: int = 64) -> Any:
    """A request whose radix hit of ``prefix_len`` device tokens is not sent yet."""
    return SimpleNamespace(early_send_prefix_end=None, pending_bootstrap=False, prefix_len=prefix_len,
                           host_hit_length=0, start_send_idx=0,
                           disagg_kv_sender=SimpleNamespace(_early_send_wait_event=None))


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_overlap_early_send_of_a_prefix_hit_runs_on_cpu(fix_on):
    sched, req = _prefill_scheduler(overlap=True), _hit_req()
    with config.override(True, pd_early_send_event=fix_on):
        if not fix_on:  # SGLang: torch.cuda.Event().record(<torch.cpu.Stream>) -> the prefill scheduler dies
            with pytest.raises(RuntimeError, match="stream"):
                sched.maybe_send_cached_prefix_chunk(req)
            return
        sched.maybe_send_cached_prefix_chunk(req)
    assert sched.sent == [(req, False, 64, None)]  # the prefix is sent early, with nothing to wait on
    assert sched.enable_overlap is True  # the scheduler's own flag is back


def test_early_send_keeps_sglangs_behaviour_where_it_needs_no_fix():
    sched = _prefill_scheduler(overlap=False)
    req = _hit_req()
    sched.maybe_send_cached_prefix_chunk(req)
    assert sched.sent == [(req, False, 64, None)]
    sched = _prefill_scheduler(overlap=True)
    sched.maybe_send_cached_prefix_chunk(_hit_req(prefix_len=0))  # no hit: nothing to send
    assert sched.sent == []


def test_overlap_flag_is_restored_when_the_send_raises():
    sched, req = _prefill_scheduler(overlap=True), _hit_req()
    with mock.patch.object(type(sched), "send_kv_chunk", side_effect=ConnectionError("peer gone")):
        with pytest.raises(ConnectionError):
            sched.maybe_send_cached_prefix_chunk(req)
    assert sched.enable_overlap is True


@pytest.mark.parametrize("fix_on", [True, False], ids=["fix-on", "fix-off"])
def test_mooncake_sender_takes_the_host_index_path(fix_on):
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    # A manager that refuses the room at once: SGLang's __init__ returns early, the AFTER hook still runs.
    mgr = mock.MagicMock(sender_trace_module=None, is_dummy_cp_rank=False)
    mgr.deferred_bootstrap.open.return_value = None
    with config.override(True, pd_host_indices=fix_on):
        sender = MooncakeKVSender(mgr, "127.0.0.1:1", 7)
    # SGLang's class says True: prefill.py:1746 then pins a D2H copy and records a CUDA event.
    assert MooncakeKVSender.supports_host_tensor_indices is True
    assert sender.supports_host_tensor_indices is (not fix_on)
