"""The record pool: the inputs of every linear-attention layer, per cached token, keyed by KV slot.

A GDN or KDA layer's state after token ``n`` is a function of its state at an earlier depth ``s`` and
the layer's inputs for tokens ``s..n-1`` only: the pre-conv row ``x`` (``mixed_qkv``, ``[conv_dim]``)
and the gate inputs ``a``, ``b`` (``[HV]`` each; KDA's ``a`` is per channel, ``[HV * K]``), in the
serving dtype. The conv window at ``n`` is
``x[n-3..n-1]``. So a radix node whose tokens have records is a valid prefix hit at its own depth
even without a state: :mod:`record_rebuild` folds the records into the deepest state above it.

Layout (``R`` = capacity in tokens, ``KV`` = the token KV pool's size):

* ``slot_of [KV + 1]`` int64: the record slot holding the inputs of the token whose KV is at that
  index, or -1; the last entry is a sink that stays -1.
* ``owner [R + 1]`` int64: the KV index a record slot was assigned to, or ``KV`` (``slot_of``'s sink) for a slot
  never assigned (:mod:`~sglang_replayssm.radix.records.fifo`).
* per layer: ``x [R + 1, conv_dim]``, ``a``, ``b`` ``[R + 1, HV]``; row ``R`` is a sink that absorbs
  the writes of tokens without a slot, so no write needs a host-side mask. With ``layer_ids`` (the
  mamba pool's GDN layers, in its order: :func:`~sglang_replayssm.radix.records.startup.prepare_layers`)
  a GDN layer's ``a`` and ``b`` are rows ``i`` of two stacks ``[L, R + 1, HV]`` (:attr:`RecordPool.ab`), the
  halves of one tensor ``[2, L, R + 1, HV]`` (:attr:`RecordPool.gate_stack`), so a rebuild gathers both for every
  layer in one op.

Invariant: ``slot_of[i] == r >= 0`` only if the token whose KV is at ``i`` was assigned ``r`` by
:meth:`RecordPool.assign` when its KV was allocated, and no later assignment reused ``r``; the forward
that computes that token writes its inputs to ``r`` (``write``) before any rebuild can read it.
Every KV index handed out by the allocator starts without a record (:meth:`invalidate`), so a
reused index never inherits another token's record. Slots are reused first in, first out: when
the pool is full the oldest records go first; their tokens' hits fall back to the deepest state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_replayssm import settings
from sglang_replayssm.radix.records import fifo
from sglang_replayssm.state import peek, state_of

__all__ = [
    "CAPACITY_ENV",
    "DEFAULT_CAPACITY",
    "LayerRecords",
    "RecordPool",
    "capacity_from_env",
    "pool_of",
]

#: Record-pool capacity in tokens (``0`` turns the records off).
CAPACITY_ENV = settings.RECORD_TOKENS.name
#: Default capacity: the last 16,384 computed tokens (at most one per KV slot).
DEFAULT_CAPACITY = 16384


def capacity_from_env(kv_size: int | None = None, reserved: int | None = None) -> int:
    """The record capacity: ``SGLANG_REPLAYSSM_RECORD_TOKENS`` if set, else ``reserved`` (what the memory
    budget reserved, :mod:`budget`), else :data:`DEFAULT_CAPACITY`; at most ``kv_size`` (one per KV
    slot) when given."""
    value = settings.RECORD_TOKENS.value()
    if value is None:
        value = DEFAULT_CAPACITY if reserved is None else reserved
    return value if kv_size is None else min(value, kv_size)


@dataclass
class LayerRecords:
    """One linear layer's records and what is needed to fold them (the layer module, its backend)."""

    x: torch.Tensor  # [R + 1, conv_dim]
    a: torch.Tensor  # [R + 1, HV] (GDN) or [R + 1, HV * K] (KDA: a per-channel gate input)
    b: torch.Tensor  # [R + 1, HV]
    layer: Any
    backend: Any
    kda: bool = False  # a KDA layer (KDAAttnBackend): its conv window is stored [W - 1, conv_dim]
    stack_row: int | None = None  # x, a, b are rows ``stack_row`` of the pool's ``xs``, ``ab`` stacks, or own tensors

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.x, self.a, self.b))


@dataclass
class RecordPool:
    """Per-token layer inputs for the tokens of the KV pool (see the module docstring)."""

    kv_size: int
    capacity: int
    device: torch.device
    slot_of: torch.Tensor = field(init=False)
    owner: torch.Tensor = field(init=False)
    iota: torch.Tensor = field(init=False)  # arange(capacity): the slot numbers (radix/records/fifo.py)
    head: int = 0
    used: int = 0  # slots ever assigned, at most the capacity
    evicted: int = 0  # assignments that took a slot from an older token (first in, first out)
    capture_decode: bool = True  # decode tokens get records too (False: only prefill tokens)
    layers: dict[int, LayerRecords] = field(default_factory=dict)
    pending: list[Any] = field(default_factory=list)  # rebuilds to run at the next forward
    states: Any = None  # IntervalStates: kept prefill states (radix/records/interval_states.py), or None
    hicache: Any = None  # HiCacheRecords: the host copy and queued loads (radix/records/hicache/host_records.py), or None
    sequential_tokens: int = 0  # rebuild spans up to this long fold token by token (radix/records/rebuild.py)
    layer_ids: tuple[int, ...] = ()  # GDN layer ids in the mamba pool's order: the rows of ``ab`` (startup)
    ab: tuple[torch.Tensor, torch.Tensor] | None = None  # a, b of the layer_ids [L, R + 1, HV] (views in layers)
    gate_stack: torch.Tensor | None = None  # ``ab`` as one [2, L, R + 1, HV] tensor (where a and b share a dtype)
    xs: torch.Tensor | None = None  # x of the layer_ids [L, R + 1, conv_dim] (views in layers)
    staged: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (row, a, b) to write
    staged_at: tuple[torch.Tensor, torch.Tensor] | None = None  # (kv, dest) of the staged rows' forward
    last_row: int = -1  # the deepest row of ``ab`` a layer with records holds: a forward's last stacked layer
    warmed: bool = False  # the warm-up rebuilds ran (radix/records/warmup.py)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"record capacity must be >= 1 token, got {self.capacity}")
        self.slot_of = torch.full((self.kv_size + 1,), -1, dtype=torch.int64, device=self.device)
        self.owner = fifo.unassigned_owner(self.capacity, self.kv_size, self.device)
        self.iota = torch.arange(self.capacity, dtype=torch.int64, device=self.device)

    # ---- bookkeeping (scheduler side) ---------------------------------------------------------

    def invalidate(self, kv: torch.Tensor | None) -> None:
        """KV indices that a new token will own carry no record (allocator choke point)."""
        if kv is None or kv.numel() == 0:
            return
        # index_fill_, not `slot_of[kv] = -1`: that copies the scalar host-to-device on every decode step
        self.slot_of.index_fill_(0, kv.reshape(-1).to(self.slot_of.device, torch.int64), -1)
        if self.states is not None:
            self.states.invalidate(kv)

    def assign(self, kv: torch.Tensor | None) -> None:
        """Give every token of ``kv`` (freshly allocated KV indices, in order) a record slot, the
        oldest slots first; the tokens that held those slots lose their records (:func:`fifo.assign`)."""
        if kv is None or kv.numel() == 0:
            return
        kv = kv.reshape(-1).to(self.slot_of.device, torch.int64)[-self.capacity:]
        n = kv.numel()
        self.head = fifo.assign(self.slot_of, self.owner, self.iota, self.head, kv)
        self.evicted += max(0, self.used + n - self.capacity)
        self.used = min(self.capacity, self.used + n)

    def covered(self, kv: torch.Tensor | None) -> bool:
        """Whether every token of ``kv`` has a record (an empty span is covered)."""
        if kv is None:
            return False
        if kv.numel() == 0:
            return True
        return bool((self.slot_of[kv.reshape(-1).to(self.slot_of.device, torch.int64)] >= 0).all())

    @property
    def conv_lead(self) -> int:
        """Records before a depth that make its conv window (``width - 1``; 3 for SGLang's GDN)."""
        for rec in self.layers.values():
            return int(rec.layer.conv_weights.shape[-1]) - 1
        return 0

    def slots(self, kv: torch.Tensor) -> torch.Tensor:
        """The record slots of ``kv`` (each >= 0 where :meth:`covered`)."""
        return self.slot_of[kv.reshape(-1).to(self.slot_of.device, torch.int64)]

    # ---- data (forward side) -------------------------------------------------------------------

    def dest_of(self, kv: torch.Tensor) -> torch.Tensor:
        """The record rows of the tokens at KV indices ``kv [T]``: their slots, the sink row for tokens
        without one. Every layer of a forward writes its tokens to the same rows (:func:`capture`
        computes them once per forward). No host sync."""
        slots = self.slot_of[kv.reshape(-1).to(self.slot_of.device, torch.int64)]
        return slots.remainder(self.capacity + 1)  # -1 (no slot) -> the sink row ``capacity``, one launch

    def write(self, layer: Any, backend: Any, kv: torch.Tensor, x: torch.Tensor, a: torch.Tensor,
              b: torch.Tensor, dest: torch.Tensor | None = None, stage: bool = False) -> None:
        """Store one layer's inputs ``x [T, conv_dim]``, ``a``/``b`` ``[T, *]`` for the tokens at KV
        indices ``kv [T]`` (tokens without a slot go to the sink row; ``dest``: :meth:`dest_of` of ``kv``,
        when the caller has it). No host sync.

        ``stage`` (a forward's capture, every layer with the same ``kv`` and ``dest``): a stacked layer's
        ``a``, ``b`` are kept (referenced, not copied: only tensors that own their storage) and written for
        every layer at once when the deepest stacked layer with records (``last_row``) stores its inputs
        (:meth:`_write_staged`), so before the forward ends; what a forward left staged is dropped with its
        tokens' records (:meth:`settle`)."""
        rec = self.layers.get(layer.layer_id)
        if rec is None:
            rec = self._new_layer(layer, backend, x, a, b)
        if dest is None:
            dest = self.dest_of(kv)
        rx, ra, rb = rec.x, rec.a, rec.b
        rx.index_copy_(0, dest, x if x.dtype == rx.dtype else x.to(rx.dtype))
        n = dest.shape[0]
        a, b = _rows(a, n), _rows(b, n)
        if self.staged_at is not None and self.staged_at[1] is not dest:
            self.settle()  # another forward's leftovers
        row = rec.stack_row
        if stage and row is not None and _stageable(a, ra) and _stageable(b, rb):
            self.staged_at = (kv, dest)
            self.staged.append((row, a, b))
        else:
            ra.index_copy_(0, dest, a if a.dtype == ra.dtype else a.to(ra.dtype))
            rb.index_copy_(0, dest, b if b.dtype == rb.dtype else b.to(rb.dtype))
        if row is not None and row == self.last_row:
            self._write_staged()

    def _write_staged(self) -> None:
        """Write the staged ``a``, ``b`` rows: one ``index_copy_`` per stack when every layer is staged in
        order, else one per layer."""
        staged, at = self.staged, self.staged_at
        self.staged, self.staged_at = [], None
        if at is None or self.ab is None or not staged:
            return
        dest, n = at[1], len(staged)
        if [row for row, _, _ in staged] == list(range(n)):
            self.ab[0][:n].index_copy_(1, dest, torch.stack([a for _, a, _ in staged]))
            self.ab[1][:n].index_copy_(1, dest, torch.stack([b for _, _, b in staged]))
            return
        for row, a, b in staged:
            self.ab[0][row].index_copy_(0, dest, a)
            self.ab[1][row].index_copy_(0, dest, b)

    def settle(self) -> None:
        """Before anything reads records (a rebuild, the next forward's capture): rows a forward staged but
        did not write (its last stacked layer never stored its inputs) lose their tokens' records."""
        if self.staged:
            self.invalidate(self.staged_at[0] if self.staged_at is not None else None)
        self.staged, self.staged_at = [], None

    def _new_layer(self, layer: Any, backend: Any, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> LayerRecords:
        rows = self.capacity + 1
        kda = type(backend).__name__ == "KDAAttnBackend"
        a2, b2 = a.reshape(x.shape[0], -1), b.reshape(x.shape[0], -1)
        xab = stacked = None if kda else self._stacked_rows(layer.layer_id, x, a2, b2)
        if xab is None:
            xab = (torch.zeros(rows, x.shape[1], dtype=x.dtype, device=x.device),
                   torch.zeros(rows, a2.shape[1], dtype=a.dtype, device=x.device),
                   torch.zeros(rows, b2.shape[1], dtype=b.dtype, device=x.device))
        rec = LayerRecords(x=xab[0], a=xab[1], b=xab[2],
                           layer=layer, backend=backend, kda=kda,
                           stack_row=None if stacked is None else self.layer_ids.index(layer.layer_id))
        if rec.stack_row is not None:
            self.last_row = max(self.last_row, rec.stack_row)
        self.layers[layer.layer_id] = rec
        return rec

    def _stacked_rows(self, layer_id: int, x: torch.Tensor, a: torch.Tensor,
                      b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Layer ``layer_id``'s rows of :attr:`xs` and :attr:`ab` (allocated for every layer at the first one),
        or None (not one of ``layer_ids``, or a shape / dtype the stacks do not have). KDA layers are never
        stacked: their per-channel ``a`` gathered for every layer at once would be large."""
        if layer_id not in self.layer_ids:
            return None
        if self.ab is None or self.xs is None:
            shape = (len(self.layer_ids), self.capacity + 1)
            self.xs = torch.zeros(*shape, x.shape[1], dtype=x.dtype, device=x.device)
            if a.shape[1] == b.shape[1] and a.dtype == b.dtype:
                self.gate_stack = torch.zeros(2, *shape, a.shape[1], dtype=a.dtype, device=a.device)
                self.ab = (self.gate_stack[0], self.gate_stack[1])
            else:
                self.ab = (torch.zeros(*shape, a.shape[1], dtype=a.dtype, device=a.device),
                           torch.zeros(*shape, b.shape[1], dtype=b.dtype, device=a.device))
        i = self.layer_ids.index(layer_id)
        rows = (self.xs[i], self.ab[0][i], self.ab[1][i])
        if any(r.shape[1:] != t.shape[1:] or r.dtype != t.dtype or r.device != t.device
               for r, t in zip(rows, (x, a, b))):
            return None
        return rows

    def stacked_ab(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:attr:`ab` when every layer with records holds its ``x``, ``a``, ``b`` in the stacks (row ``i``:
        ``layer_ids[i]``) and every one of ``layer_ids`` has records, else None."""
        ab = self.ab
        if ab is None or len(self.layers) != len(self.layer_ids):
            return None
        held = (self.layers.get(lid) for lid in self.layer_ids)
        return ab if all(r is not None and r.stack_row == i for i, r in enumerate(held)) else None

    @property
    def nbytes(self) -> int:
        """Bytes held: the records of every layer seen so far, plus the two index maps."""
        maps = (self.slot_of.numel() + self.owner.numel()) * self.slot_of.element_size()
        states = 0 if self.states is None else self.states.nbytes
        return maps + states + sum(rec.nbytes for rec in self.layers.values())


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as ``[n, -1]`` (itself where it already is: a forward's capture passes its rows so)."""
    return t if t.dim() == 2 and t.shape[0] == n else t.reshape(n, -1)


def _stageable(t: torch.Tensor, rows: torch.Tensor) -> bool:
    """``t`` can be kept until the forward's last layer: the rows' dtype, and it pins at most twice its
    own bytes (not a view of a large projection output)."""
    return t.dtype == rows.dtype and t.untyped_storage().nbytes() <= 2 * t.numel() * t.element_size()


def pool_of(req_to_token_pool: Any) -> RecordPool | None:
    """The record pool attached to a ``HybridReqToTokenPool``, if any."""
    state = peek(req_to_token_pool)
    return None if state is None else state.record_pool


def detach(req_to_token_pool: Any) -> None:
    """Turn records off for ``req_to_token_pool`` for good (what exists is dropped, nothing is created)."""
    state = state_of(req_to_token_pool)
    state.record_pool, state.records_off = None, True


def attach(req_to_token_pool: Any, pool: RecordPool) -> RecordPool:
    """Attach ``pool`` to ``req_to_token_pool`` (one per pool); returns it."""
    state_of(req_to_token_pool).record_pool = pool
    return pool
