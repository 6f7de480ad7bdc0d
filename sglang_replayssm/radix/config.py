"""Switches for the radix adapter: one per fix, so every fix can be A/B'd against SGLang.

Environment (read once per process, inherited by SGLang's spawned scheduler processes):

* ``SGLANG_REPLAYSSM_ADAPTER=0`` turns the whole adapter off: :func:`hooks.register` installs
  nothing, so SGLang runs exactly as shipped (the CPU runtime's own fixes, :data:`RUNTIME_FIXES`, stay on).
* ``SGLANG_REPLAYSSM_DISABLE_FIXES=a,b`` turns single fixes off (names in :data:`FIXES`); a
  disabled fix's hook calls straight through to SGLang's function with the same arguments.

* ``SGLANG_REPLAYSSM_READ_COPY=off|bf16|fp8`` (default ``off``): the decode ring's non-flush steps
  read a low-precision read copy of each slot's fp32 checkpoint (bf16, or fp8 e4m3 with fp32
  per-row scales); flushes replay the raw records against the fp32 checkpoint, so flushed
  checkpoints are those of fp32 decode (:mod:`read_copy`). Refused at startup in one line where
  it cannot be exact or run (:func:`sglang_replayssm.radix.read_copy.refusal`).

Tests flip fixes at run time with :func:`override` (the read copy with :func:`override_read_copy`);
hooks read :func:`enabled` on every call, so an installed hook with its fix off is a pure
pass-through (SGLang's behaviour).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "ADAPTER_ENV",
    "DISABLE_ENV",
    "FIXES",
    "RUNTIME_FIXES",
    "READ_COPY_ENV",
    "READ_COPY_MODES",
    "adapter_enabled",
    "cuda_kernels_enabled",
    "enabled",
    "enabled_fixes",
    "override",
    "override_read_copy",
    "read_copy_mode",
    "reload",
]

ADAPTER_ENV = "SGLANG_REPLAYSSM_ADAPTER"
READ_COPY_ENV = "SGLANG_REPLAYSSM_READ_COPY"
#: The values of :data:`READ_COPY_ENV` (``off``: no read copy, today's fp32 ring decode).
READ_COPY_MODES = ("off", "bf16", "fp8")
DISABLE_ENV = "SGLANG_REPLAYSSM_DISABLE_FIXES"

#: Every fix the adapter can make, with what it changes (the keys are the switch names).
FIXES: dict[str, str] = {
    "admission": "admit extra_buffer / extra_buffer_lazy with --enable-linear-replayssm (GDN, and KDA "
    "when a KDA snapshot fix is on); refuse --enable-mixed-chunk / --enable-streaming-session with the "
    "decode ring",
    "kda_force_flush": "KDA decode force-flushes the ring at track boundaries like GDN",
    "device_cursor": "advance the decode ring cursor and build the forced-flush mask on the device from "
    "the device seq_lens (no host sync, CUDA-graph safe) instead of SGLang's host-side advance",
    "cursor_reset": "every mamba slot handed out by the allocator (or loaded from an int8 "
    "checkpoint) starts with an empty ring",
    "materialize_copy": "MambaPool.copy_from folds the source's pending ring records into the copy "
    "(only while cursor_reset is on: a record count is trusted only if every slot starts empty)",
    "materialize_track": "the decode track snapshot folds the working slot's pending records",
    "finish_donation": "no_buffer finish: materialise the full state, donate at the real depth",
    "ring_budget": "charge the decode ring to the mamba memory budget",
    "lost_hit_metric": "count prompt tokens whose KV hit was dropped for lack of a mamba state",
    "ring_kernels": "on CUDA, run sglang-replayssm's Triton ring decode in place of SGLang's ReplaySSM "
    "kernel (same ring layout and semantics)",
    "extend_fold": "before an extend or MIXED forward, fold every row's pending ring records into its "
    "checkpoint (mixed-chunk decode rows, streaming-session turns); admits --enable-mixed-chunk and "
    "--enable-streaming-session with the decode ring",
    "retract_backup": "MambaPool.get_cpu_copy (CPU retraction backup) carries the full state, pending "
    "records folded in; load_cpu_copy leaves the destination with an empty ring",
    "record_hits": "keep every computed token's linear-layer inputs (a budgeted record pool, "
    "SGLANG_REPLAYSSM_RECORD_TOKENS) so a prefix hit at any depth rebuilds the exact state from the "
    "deepest state above it (GDN, with the decode ring)",
    "record_spec_decode": "speculative decode batches (NEXTN / EAGLE) assign no record slots: SGLang's "
    "spec prepare_for_decode leaves the batch's out_cache_loc from an earlier forward (the prefill's, "
    "schedule_batch.py:3754-3762, 3859-3861), so assigning it re-pointed cached prompt tokens at unwritten "
    "record slots and their hits rebuilt wrong states; verify forwards capture nothing either way",
    "record_spec_ring": "records also with the spec-verify ring (--enable-linear-replayssm-spec, GDN): "
    "capture, match and rebuild as with the decode ring (a planted tree slot has no row, so no spec cursors); "
    "end_state folds the finishing row's pending accepted records before it copies the working slot",
    "end_state": "extra_buffer finish: donate the exact state at the request's full depth (the "
    "working slot, pending records folded) instead of the last tracked state",
    "pd_decode_ring": "PD disaggregation: the decode server's mamba pool (HybridMambaDecodeReqToTokenPool) "
    "gets the decode ring and --disaggregation-mode decode is admitted with --enable-linear-replayssm "
    "(radix/pd.py); a prefill server is refused with the ring",
    "pd_hits": "PD decode server with its radix cache: log each admission's own prefix hit (the decode "
    "tree's device hit, host hit, mamba-lost hit) and the running decode hit rate (radix/pd_hits.py)",
    # PD on the CPU runtime (cpu/hooks_pd.py): SGLang's prefill side records CUDA events on the host
    "pd_host_indices": "CPU runtime, PD prefill: every KV sender takes SGLang's host page-index path "
    "(kv_to_page_indices) instead of a pinned D2H copy + CUDA event (no NVIDIA driver)",
    "pd_early_send_event": "CPU runtime, PD prefill under overlap scheduling: a prefix hit's early KV send "
    "records no CUDA event (every CPU forward has finished when the scheduler gets control back: there is "
    "nothing to wait for)",
    # the spec-verify ring (--enable-linear-replayssm-spec, GDN; radix/spec_ring.py)
    "spec_finish_donation": "spec ring, no_buffer finish: fold the row's pending accepted records before "
    "SGLang donates the slot (D1)",
    "spec_retract_backup": "spec ring: fold the row's pending accepted records before Req.offload_kv_cache "
    "backs the slot up to CPU (D2)",
    "spec_extend_fold": "spec ring: before an extend or MIXED forward, fold every row's pending accepted "
    "records (mixed-chunk decode rows, streaming-session turns; D3, D4)",
    "spec_ring_check": "refuse a GDN spec ring whose length is not a power of two or is < 2 x draft "
    "tokens at startup, in one line (D5)",
    "session_state_depth": "streaming session, a finished turn (no overlap): the kept record's committed "
    "length is the depth its KV and mamba state reached, not prompt + output (a speculative turn ending on "
    "a bonus token); a turn whose mamba state ran past its kept tokens (a verify past max_new_tokens or a "
    "stop) releases its slot, so the next turn starts from the radix tree",
    # records with HiCache (radix/record_hicache.py)
    "record_hicache": "HiCache: records go to host with their node's KV (a host record pool, "
    "SGLANG_REPLAYSSM_HOST_RECORD_TOKENS) and come back with it on load-back, so hits inside loaded-back "
    "nodes rebuild exactly; a planted state is locked and kept out of host backups until rebuilt; "
    "off: records are not used while HiCache is on",
    "record_host_hits": "HiCache: a match whose KV runs on into host-only nodes past its deepest (device) "
    "state, with host records covering them, is a host hit to the KV depth: the KV is loaded back, then "
    "the state planted and rebuilt from the records (radix/record_host_hits.py)",
    "record_storage": "HiCache L3 storage (--hicache-storage-backend): a page's records are stored beside it "
    "through the same backend (key: page hash + layout) and come back as host records with a prefetch, so "
    "hits inside a prefetched span rebuild exactly (radix/record_storage.py)",
    # the read copy (SGLANG_REPLAYSSM_READ_COPY, radix/read_copy.py); no effect while it is off
    "read_copy_refresh": "read copy: a slot whose checkpoint was written by anything but the flush (alloc, "
    "copy-on-write, HiCache load-back, load_cpu_copy, materialize, extend) is marked stale and its copy "
    "rewritten from the fp32 checkpoint by its next decode step, per layer",
    "read_copy_exact_fold": "read copy: a mover that folds a slot's pending records (copy-on-write, track "
    "snapshot, extend fold, retraction backup) replays the raw records (k, g, v, beta) against the fp32 "
    "checkpoint, as the flush does, instead of folding the copy-based deltas",
    "read_copy_d_ring": "read copy: with a 2-byte io dtype (bf16 / fp16) and SGLang's fp32 decode ring, the copy's "
    "d~ and v records live in SGLang's replayssm_d (dead while the copy is on: nothing else reads or writes "
    "it) as views, per slot [2, HV, L, V] of the io dtype, instead of a second allocation; the budget no "
    "longer charges them (off: allocated beside the ring and charged)",
}

_state: dict[str, bool] | None = None
_read_copy: str | None = None


def cuda_kernels_enabled() -> bool:
    """False when ``SGLANG_REPLAYSSM_CUDA_KERNELS`` is ``0``: the ring decode's default launch then
    never picks the CUDA passes (read on every call)."""
    return os.environ.get("SGLANG_REPLAYSSM_CUDA_KERNELS", "1") != "0"


def adapter_enabled() -> bool:
    """False when ``SGLANG_REPLAYSSM_ADAPTER`` is ``0``/``false``/``off``/``no``."""
    return os.environ.get(ADAPTER_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


#: Fixes of the CPU runtime (cpu/), not of the adapter: ``SGLANG_REPLAYSSM_ADAPTER=0`` leaves them on (without
#: them SGLang cannot serve that path on CPU at all); only ``SGLANG_REPLAYSSM_DISABLE_FIXES`` turns them off.
RUNTIME_FIXES = ("pd_host_indices", "pd_early_send_event")


def read_copy_mode() -> str:
    """The read-copy mode of this process (:data:`READ_COPY_MODES`), read once from
    :data:`READ_COPY_ENV`; an unknown value is a ``ValueError`` naming the valid ones (a startup
    refusal: :func:`sglang_replayssm.radix.read_copy.refusal`). ``off`` while the adapter is off."""
    global _read_copy
    if _read_copy is None:
        value = os.environ.get(READ_COPY_ENV, "off").strip().lower() or "off"
        if value not in READ_COPY_MODES:
            raise ValueError(f"{READ_COPY_ENV}={value!r}: expected one of {', '.join(READ_COPY_MODES)}")
        _read_copy = value if adapter_enabled() else "off"
    return _read_copy


@contextmanager
def override_read_copy(mode: str) -> Iterator[None]:
    """Temporarily set the read-copy mode (tests); restores the previous one on exit."""
    global _read_copy
    if mode not in READ_COPY_MODES:
        raise ValueError(f"unknown read-copy mode {mode!r}")
    saved = _read_copy
    _read_copy = mode
    try:
        yield
    finally:
        _read_copy = saved


def _from_env() -> dict[str, bool]:
    disabled = {x.strip() for x in os.environ.get(DISABLE_ENV, "").split(",") if x.strip()}
    unknown = disabled - set(FIXES)
    if unknown:
        raise ValueError(f"{DISABLE_ENV}: unknown fix name(s) {sorted(unknown)}; known: {sorted(FIXES)}")
    on = adapter_enabled()
    return {name: (on or name in RUNTIME_FIXES) and name not in disabled for name in FIXES}


def _current() -> dict[str, bool]:
    global _state
    if _state is None:
        _state = _from_env()
    return _state


def reload() -> list[str]:
    """Re-read the environment (e.g. after a test changed it); returns the enabled fixes."""
    global _state, _read_copy
    _state = _from_env()
    _read_copy = None
    return enabled_fixes()


def enabled(fix: str) -> bool:
    """Whether ``fix`` is on in this process (a KeyError for an unknown name is a bug)."""
    return _current()[fix]


def enabled_fixes() -> list[str]:
    """Names of the fixes that are on, in :data:`FIXES` order."""
    state = _current()
    return [name for name in FIXES if state[name]]


@contextmanager
def override(all_fixes: bool | None = None, **fixes: bool) -> Iterator[None]:
    """Temporarily set fixes: ``override(False)`` is SGLang's behaviour, ``override(True,
    cursor_reset=False)`` everything but one fix. Restores the previous state on exit."""
    global _state
    unknown = set(fixes) - set(FIXES)
    if unknown:
        raise KeyError(f"unknown fix name(s) {sorted(unknown)}")
    saved = dict(_current())
    new = dict(saved) if all_fixes is None else dict.fromkeys(FIXES, bool(all_fixes))
    new.update({k: bool(v) for k, v in fixes.items()})
    _state = new
    try:
        yield
    finally:
        _state = saved
