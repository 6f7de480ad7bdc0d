"""Record capture: every token a forward computes gets its layer inputs stored (:mod:`records`).

Scheduler side (the thread that allocates KV and matches prefixes):

* every KV index the token allocator hands out starts without a record (:func:`invalidate_allocated`);
* ``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode`` give the batch's new tokens
  (``out_cache_loc``) record slots (:func:`assign_batch`), so a later match sees them at once.

Forward side: ``GDNAttnBackend`` / ``KDAAttnBackend`` ``.forward_extend`` / ``forward_decode`` write each layer's pre-conv
``mixed_qkv`` and ``a``, ``b`` rows to the slots of ``out_cache_loc`` (:func:`capture`; the rows are found
at the forward's first layer, and the GDN layers' ``a``, ``b`` are written for all layers at the last one,
``RecordPool.write(stage=True)``). A forward
that cannot capture (a fused decode path passing a tuple, a target-verify forward) drops the slots
of its tokens instead, so an assigned slot always holds its token's inputs before any rebuild reads
it (rebuilds run at the start of the next forward, :mod:`record_rebuild`).

Interval states (:mod:`interval_states`): ``prepare_for_extend`` also gives the chunk states the
prefill keeps a state slot (keyed by the KV index of their last token), and the extend kernel's
per-chunk states ``h`` are written to them as each layer's ``GDNKernelDispatcher.extend`` /
``KDAKernelDispatcher.extend`` returns (:func:`keep_chunk_states`; only inside a forward's own extend, never
inside a rebuild's). KDA's extend returns ``h`` only while SGLang tracks a request of the batch; a forward
without it keeps none and its assigned keys lose their slots.

Speculative decoding: SGLang's spec ``prepare_for_decode`` leaves ``out_cache_loc`` as an earlier
forward left it, so a spec decode batch assigns nothing (fix ``record_spec_decode``); its tokens are
computed by target-verify forwards, which capture none.

The pool exists only with a ReplaySSM ring (the decode ring, or the spec-verify ring with fix
``record_spec_ring``, :func:`ring_captured`); it is built with SGLang's memory pools (:mod:`startup`).
On CUDA only prefill tokens are captured (a decode step replayed from a CUDA graph could not be
captured); decode tokens keep the deepest state. The CUDA graphs SGLang captures at startup hold no
record operation (capture, invalidation, kept chunk states): graph-capture forwards touch no record. A
breakable prefill graph breaks at each linear layer (GDN's always; KDA's with fix ``record_kda_graph_eager``,
:func:`graph_extend_unless_captured`), so the layer's capture runs, on SGLang's break body: ``out_cache_loc``
narrowed to the real tokens (a new view every layer: the forward's rows are keyed by what it views), the inputs weak
views of the graph's pool (written during the layer's own break, never held: :func:`_prefill_graph`); a prefill
graph that replays a linear layer's extend inside the graph (KDA's with that fix off; every layer in a full one)
runs none of it: its tokens get no records (:func:`drop_graph_replayed`, before each replay).
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

import torch

from sglang_replayssm.host_lists import on_device
from sglang_replayssm.radix import config
from sglang_replayssm.radix.records.interval_states import even_slice, kept_positions
from sglang_replayssm.radix.records.pool import RecordPool, detach, pool_of
from sglang_replayssm.radix.ring.pool import ring_pool
from sglang_replayssm.radix.spec.ring import spec_ring
from sglang_replayssm.state import peek, state_of

__all__ = ["ForwardCapture", "assign_batch", "capture", "extending", "graph_extend_unless_captured",
           "invalidate_allocated", "keep_chunk_states", "ring_captured"]

_LOG = logging.getLogger(__name__)

#: Token allocators whose allocations :func:`invalidate_allocated` sees (``radix/records/hooks.py``).
_HOOKED_ALLOCATORS = frozenset({"TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"})


def invalidate_allocated(allocator: Any, kv: Any) -> None:
    """After a KV allocation: the handed-out indices carry no record."""
    state = peek(allocator)
    pool: RecordPool | None = None if state is None else state.record_pool
    if pool is not None and isinstance(kv, torch.Tensor):
        pool.invalidate(kv)


def assign_batch(batch: Any, *, decode: bool) -> None:
    """After ``prepare_for_extend`` / ``prepare_for_decode``: record slots for the new tokens."""
    pool = pool_of(getattr(batch, "req_to_token_pool", None))
    if pool is None:
        return
    allocator = getattr(batch, "token_to_kv_pool_allocator", None)
    linked = peek(allocator)
    if allocator is not None and (None if linked is None else linked.record_pool) is not pool:
        if type(allocator).__name__ not in _HOOKED_ALLOCATORS:  # its allocations would keep stale records
            detach(batch.req_to_token_pool)
            return
        state_of(allocator).record_pool = pool
    if decode and not pool.capture_decode:
        return
    if decode and _speculative(batch) and config.enabled("record_spec_decode"):
        # SGLang's spec prepare_for_decode allocates in req_to_token and leaves out_cache_loc as an
        # earlier forward left it (schedule_batch.py:3754-3762; filter_batch keeps it, :3859-3861): those
        # tokens already hold their records. The verify that computes this step's tokens captures none.
        return
    loc = getattr(batch, "out_cache_loc", None)
    pool.assign(loc)
    if not decode:
        _assign_states(pool, loc, getattr(batch, "prefix_lens", None), getattr(batch, "extend_lens", None))


def _assign_states(pool: RecordPool, loc: Any, prefix_lens: Any, extend_lens: Any) -> None:
    """State slots for the chunk states a prefill of these lengths keeps."""
    states = pool.states
    if states is None or loc is None or prefix_lens is None or extend_lens is None:
        return
    tokens, _ = kept_positions(list(prefix_lens), list(extend_lens), states.interval, states.chunk)
    if tokens and max(tokens) < loc.numel():
        states.assign(loc[_positions(tokens, loc.device)])


def _positions(positions: list[int], device: torch.device) -> slice | torch.Tensor:
    """``positions`` (:func:`kept_positions`') as an index: a slice where evenly spaced (one sequence's: a view,
    no gather), else an index tensor on ``device``."""
    even = even_slice(positions)
    return even if even is not None else on_device(positions, torch.int64, device)


def ring_captured(req_pool: Any) -> bool:
    """Whether forwards over ``req_pool`` capture records: a ReplaySSM ring (the decode ring, or the
    spec-verify ring with ``record_spec_ring``) and no int8 checkpoints (not supported)."""
    if getattr(req_pool, "mamba_ckpt_pool", None) is not None:
        return False
    mamba_pool = getattr(req_pool, "mamba_pool", None)
    if ring_pool(mamba_pool) is not None:
        return True
    return config.enabled("record_spec_ring") and spec_ring(mamba_pool) is not None


def _wanted(backend: Any, forward_batch: Any) -> bool:
    mode = forward_batch.forward_mode
    if mode.is_target_verify() or mode.is_draft_extend_v2() or getattr(forward_batch, "spec_info", None) is not None:
        return False
    return ring_captured(backend.req_to_token_pool)


def _graph_capturing() -> bool:
    """A CUDA graph is being captured (startup): no record operation goes into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _speculative(batch: Any) -> bool:
    """A ``ScheduleBatch`` / ``ForwardBatch`` of a speculative server (NEXTN, EAGLE, ...)."""
    spec = getattr(batch, "spec_algorithm", None)
    return spec is not None and not spec.is_none()


class ForwardCapture(NamedTuple):
    """Where one forward captures, decided at its first linear layer for all (:func:`_forward_plan`): the record
    pool, the record rows of its ``tokens`` new tokens (``dest [tokens]``), whether a stacked layer's ``a``, ``b``
    may be held for the last layer (``stage``: not inside a prefill CUDA graph's execution, :func:`_prefill_graph`),
    and whether it keeps chunk states (``keeps``: an extend whose lengths cross an interval, :func:`kept_positions`;
    else its layers' :class:`extending` marks nothing)."""

    pool: RecordPool
    dest: torch.Tensor
    tokens: int
    stage: bool
    keeps: bool


def capture(backend: Any, layer: Any, forward_batch: Any, mixed_qkv: Any, a: Any, b: Any) -> ForwardCapture | None:
    """Before a GDN layer's extend/decode: store its inputs for the forward's new tokens. Returns the forward's
    capture (None where it captures nothing) for the layer's :class:`extending`."""
    plan = _forward_plan(backend, forward_batch)
    if plan is None:
        return None
    n = plan.tokens
    rows = [_token_rows(t) for t in (mixed_qkv, a, b)]
    if any(r is None or r.shape[0] < n for r in rows):
        plan.pool.invalidate(forward_batch.out_cache_loc)
        return plan
    x, ra, rb = (r if r.shape[0] == n else r[:n] for r in rows if r is not None)
    plan.pool.write(layer, backend, forward_batch.out_cache_loc, x, ra, rb, plan.dest, stage=plan.stage)
    return plan


def _prefill_graph() -> bool:
    """Inside a prefill CUDA graph's execution (breakable, SGLang's CUDA default, or piecewise): a GDN layer runs
    between captured segments and its inputs are views of the graph's memory pool (weak views in a breakable graph),
    which a later segment may reuse before the forward's last layer. Its inputs are written at once, never held for
    the last layer (``RecordPool.write``'s ``stage``)."""
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import is_in_breakable_cuda_graph
    from sglang.srt.model_executor.runner_utils.prefill_graph import is_in_prefill_graph_scope

    return bool(is_in_breakable_cuda_graph() or is_in_prefill_graph_scope())


def _loc_key(loc: torch.Tensor) -> tuple[Any, int, int]:
    """What names a forward's ``out_cache_loc`` for all its layers: the tensor it views (a breakable graph's break
    narrows it to the real tokens, a new view at every layer: ``radix_linear_attention.py:189``), where in it the
    view starts and its length."""
    return (loc if loc._base is None else loc._base), int(loc.storage_offset()), loc.numel()


def _forward_plan(backend: Any, forward_batch: Any) -> ForwardCapture | None:
    """Where this forward captures records (:class:`ForwardCapture`), else None; decided at its first linear layer
    for every layer (one pool, one mode, one graph state a forward), kept in the batch's state (``record_dest``,
    keyed by ``out_cache_loc``: :func:`_loc_key`). A forward that cannot capture drops its tokens' records there,
    once. Without a record pool nothing is kept on the batch."""
    pool = pool_of(backend.req_to_token_pool)
    loc = getattr(forward_batch, "out_cache_loc", None)
    if pool is None or loc is None:
        return None
    batch_state = state_of(forward_batch)
    cached = batch_state.record_dest
    key = _loc_key(loc)
    if cached is not None and cached[0][0] is key[0] and cached[0][1:] == key[1:]:
        return cached[1]
    plan: ForwardCapture | None = None
    capturing = _graph_capturing()
    if loc.numel() > 0 and not _wanted(backend, forward_batch):
        if not capturing:
            pool.invalidate(loc)
    elif loc.numel() > 0 and not capturing and (pool.capture_decode or not forward_batch.forward_mode.is_decode()):
        # one gather for every layer; the graph state is the forward's (every layer runs in its execution or none)
        plan = ForwardCapture(pool, pool.dest_of(loc), loc.numel(), not _prefill_graph(),
                              _keeps_states(pool, forward_batch))
    batch_state.record_dest = (key, plan)
    return plan


def _keeps_states(pool: RecordPool, forward_batch: Any) -> bool:
    """Whether the forward's extend keeps chunk states (the positions :func:`keep_chunk_states` writes)."""
    states = pool.states
    prefix = getattr(forward_batch, "extend_prefix_lens_cpu", None)
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    if states is None or prefix is None or lens is None or forward_batch.forward_mode.is_decode():
        return False
    return bool(kept_positions(list(prefix), list(lens), states.interval, states.chunk)[0])


def drop_graph_replayed(backend: Any, forward_batch: Any) -> None:
    """Before a prefill CUDA graph replays a linear layer's extend inside the graph (KDA's in a breakable
    graph, ``refresh_prefill_graph_metadata``; every layer's in a full one, ``PrefillCudaGraphRunner.execute``;
    ``backend``: anything holding the ``req_to_token_pool``): no Python of the layers runs, so nothing is
    captured; the batch's tokens lose their record slots and interval states (their hits are lost, never
    rebuilt from rows no forward wrote)."""
    pool = pool_of(backend.req_to_token_pool)
    loc = getattr(forward_batch, "out_cache_loc", None)
    if pool is not None and loc is not None and not _graph_capturing():
        pool.invalidate(loc)


def graph_extend_unless_captured(original: Any, backend: Any) -> bool:
    """``KDAAttnBackend.supports_prefill_graph_extend`` (read once, when SGLang builds the hybrid backend): False
    where forwards over its pool capture records (fix ``record_kda_graph_eager``), so a breakable prefill CUDA graph
    breaks at each KDA layer and runs its extend eagerly, as it does GDN's: the layer's Python, and the capture
    with it, runs on every prefill. Else SGLang's answer (its extend in the graph: :func:`drop_graph_replayed`)."""
    supported = bool(original(backend))
    pool = getattr(backend, "req_to_token_pool", None)
    if supported and pool_of(pool) is not None and ring_captured(pool):
        _LOG.info("sglang-replayssm records: KDA's extend runs between breakable prefill CUDA graph segments "
                  "(as GDN's), so records capture it (fix record_kda_graph_eager)")
        return False
    return supported


#: :class:`extending` without a plan: find the forward's.
_FIND: Any = object()


def _token_rows(t: Any) -> torch.Tensor | None:
    """A layer input as one row per token: GDN's ``[T, *]``; KDA's ``[1, T, *]`` (extend gates,
    decode beta) lose the leading batch dim. None for what is not a tensor (fused decode tuples)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return None
    if t.dim() >= 3 and t.shape[0] == 1:
        t = t[0]
    return t if t.dim() == 2 else t.reshape(t.shape[0], -1)


class extending:  # noqa: N801 - a context manager named for what it marks
    """Marks a GDN layer's ``forward_extend``: the dispatcher's extend inside it is the forward's own.

    While it runs, the backend's kernel dispatcher (what the extend hook receives) carries this step's
    ``(record pool, layer, forward_batch)`` in its state's ``extending`` (:func:`keep_chunk_states`);
    cleared on exit, never left for a later extend (a rebuild's). ``plan``: the forward's capture as
    :func:`capture` returned it for this layer (found again when not given)."""

    def __init__(self, backend: Any, layer: Any, forward_batch: Any, plan: Any = _FIND) -> None:
        if plan is _FIND:
            plan = _forward_plan(backend, forward_batch)
        self.ctx = (plan.pool, layer, forward_batch) if plan is not None and plan.keeps else None
        self.dispatcher = getattr(backend, "kernel_dispatcher", None)

    def __enter__(self) -> None:
        if self.ctx is not None and self.dispatcher is not None:
            state_of(self.dispatcher).extending = self.ctx
        else:
            self.__exit__()

    def __exit__(self, *exc: object) -> None:
        state = peek(self.dispatcher)
        if state is not None:
            state.extending = None


def keep_chunk_states(result: Any, dispatcher: Any, ssm_states: Any, h_at: int = 2) -> None:
    """After ``dispatcher``'s extend inside a forward (:class:`extending`): keep the chunk states of this
    layer's ``h`` (``result[h_at]``, ``[1, NT, *state]``: GDN's ``(o, final, h)``, KDA's ``(o, h)``) that the
    batch assigned state slots to. A result without ``h`` (KDA's extend returns one only while SGLang tracks
    a request of the batch) keeps nothing, and the keys the batch assigned lose their slots: no slot a
    forward did not write is ever read."""
    dispatcher_state = peek(dispatcher)
    ctx = None if dispatcher_state is None else dispatcher_state.extending
    if ctx is None:
        return
    pool, layer, forward_batch = ctx
    states = pool.states
    if states is None or not isinstance(ssm_states, torch.Tensor):
        return
    batch_state = peek(forward_batch)
    kept = None if batch_state is None else batch_state.kept_chunk_states
    if kept is None:
        prefix, lens = forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
        tokens, chunk_ids = ([], []) if prefix is None or lens is None else kept_positions(
            list(prefix), list(lens), states.interval, states.chunk)
        loc = forward_batch.out_cache_loc
        total = 0 if lens is None else sum((n + states.chunk - 1) // states.chunk for n in lens)
        # Once per forward: the kept chunks' keys, state rows and chunk indices (slices where evenly spaced, as in
        # one sequence: views, no gather; else index tensors on the device).
        keys = loc[_positions(tokens, loc.device)] if tokens else None
        kept = (keys, states.dest_of(keys), _positions(chunk_ids, ssm_states.device),
                total) if keys is not None else ()
        state_of(forward_batch).kept_chunk_states = kept
    if not kept:
        return
    keys, dest, chunks, total = kept
    h = result[h_at] if isinstance(result, tuple) and len(result) > h_at else None
    if not isinstance(h, torch.Tensor):
        states.invalidate(keys)
        state_of(forward_batch).kept_chunk_states = ()  # once per forward
        return
    shape = tuple(ssm_states.shape[1:])
    if h.numel() != total * math.prod(shape) or tuple(h.shape[-len(shape):]) != shape:
        states.skipped.add(layer.layer_id)  # not the per-chunk states of this batch: keep none
        return
    states.write_rows(layer.layer_id, dest, h.reshape(total, *shape), chunks, ssm_states.dtype)
