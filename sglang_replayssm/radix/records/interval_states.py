"""Interval states: GDN / KDA states every ``interval`` tokens of a prefill, keyed by KV slot.

A rebuild from records (:mod:`record_rebuild`) folds every record between the deepest kept state
and the matched depth; with only the tree's states that is up to a whole shared prefix (a second
visitor of a 1,024-token system prompt folds 1,024 records, about half a prefill). The extend
kernel already computes the state before each of its 64-token chunks (``h``, the per-chunk states
SGLang's extra_buffer tracking reads); keeping one of them per ``interval`` tokens bounds every
rebuild to fewer than ``interval + 64`` records, for ``1 / interval`` of a state per token.

A kept state is the state *after* one token of a prefill; it is keyed by that token's KV index,
like a record, so node splits are free and a reused KV index never inherits a state (the allocator
choke point invalidates both, :meth:`IntervalStates.invalidate`). The conv window at that depth is
the last ``width - 1`` records before it, so a state is usable while those records exist.

Layout (``M`` = capacity in states, ``KV`` = the token KV pool's size):

* ``state_of [KV + 1]`` int64: the state slot holding the state after the token at that KV index,
  or -1 (the last entry is a sink that stays -1);
* ``owner [M + 1]`` int64: the KV index a state slot was assigned to, or ``KV`` (never assigned; :mod:`.fifo`);
* per linear layer ``ssm [M + 1, *state]`` in the dtype of ``h`` (:meth:`IntervalStates.keeps`): the mamba
  pool's state dtype, or the activation dtype of a rounded state; row ``M`` is a sink. With
  ``layer_ids`` (the mamba pool's linear layers in its order) the layers' ``ssm`` are rows ``i`` of one
  ``stack [L, M + 1, *state]`` (:meth:`IntervalStates.stacked`): a rebuild copies its start states into every
  layer's pool slot in one op.

Exactness: per-chunk states in the pool's own state dtype are exact (fp32 on the CPU runtime's fp32
models). SGLang's kernels round ``h`` to the activation dtype (bf16 serving): there a kept state is
a state rounded once to the activation dtype. ``SGLANG_REPLAYSSM_STATE_INTERVAL_ROUNDED`` (on) keeps that
``h`` as it is, in the activation dtype (half an fp32 state's bytes, the same values), widened to the state dtype
when a rebuild copies it into a pool slot: a rebuild folds < ``interval + 64`` records from it (measured on the H200:
a rebuilt hit's KL to a cold prefill at or below an exact state's, docs/BENCHMARKS.md); off, such a layer
keeps no interval state and a rebuild folds from the tree's deepest state (exact, up to a whole prefix).

Which chunk states a prefill keeps (:func:`kept_positions`): for a sequence with ``p`` cached and
``L`` new tokens, the extend kernel's chunk ``c`` starts at depth ``p + 64 c``; the first chunk start
at or past each multiple of ``interval`` (``0 < 64 c < L``) is kept. Scheduler (slot assignment at
``prepare_for_extend``) and forward (the write) compute the same list from the same lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_replayssm import settings
from sglang_replayssm.radix.records import fifo

__all__ = [
    "CHUNK",
    "DEFAULT_INTERVAL",
    "INTERVAL_ENV",
    "IntervalStates",
    "even_slice",
    "interval_from_env",
    "kept_positions",
]

#: Interval in tokens between kept prefill states (``0`` keeps none); a multiple of :data:`CHUNK`.
INTERVAL_ENV = settings.STATE_INTERVAL.name
#: Default: one state per 256 tokens (a rebuild folds < 320 records; 1/256 of a state per token).
DEFAULT_INTERVAL: int = settings.STATE_INTERVAL.default
#: Chunk length of SGLang's chunked prefill kernels: the grid of the per-chunk states ``h``.
CHUNK = 64


def interval_from_env() -> int:
    """``SGLANG_REPLAYSSM_STATE_INTERVAL`` (tokens, a multiple of 64; 0 = off), else the default."""
    return settings.STATE_INTERVAL.value()


def kept_positions(prefix_lens: list[int], extend_lens: list[int], interval: int,
                   chunk: int = CHUNK) -> tuple[list[int], list[int]]:
    """The chunk states one extend keeps: ``(token, chunk)`` lists, where ``token`` indexes the
    batch's new tokens (the state is the one after that token) and ``chunk`` indexes the kernel's
    per-chunk states ``h`` (sequences concatenated, ``ceil(L / chunk)`` each, the j-th before chunk j)."""
    tokens: list[int] = []
    chunks: list[int] = []
    if interval <= 0:
        return tokens, chunks
    start = chunk0 = 0
    for p, n in zip(prefix_lens, extend_lens):
        last = p // interval
        for c in range(1, (n - 1) // chunk + 1):
            depth = p + c * chunk
            if depth // interval > last:
                last = depth // interval
                tokens.append(start + c * chunk - 1)
                chunks.append(chunk0 + c)
        start += n
        chunk0 += (n + chunk - 1) // chunk if n > 0 else 0
    return tokens, chunks


def even_slice(positions: list[int]) -> slice | None:
    """Ascending ``positions`` (:func:`kept_positions`' tokens or chunks) as a slice where they are evenly spaced
    (one sequence's: a state every ``interval`` tokens, every ``interval // chunk`` chunks), else None."""
    if not positions:
        return None
    step = positions[1] - positions[0] if len(positions) > 1 else 1
    if step <= 0 or any(b - a != step for a, b in zip(positions, positions[1:])):
        return None
    return slice(positions[0], positions[-1] + 1, step)


@dataclass
class IntervalStates:
    """Kept prefill states (see the module docstring)."""

    kv_size: int
    capacity: int
    interval: int
    device: torch.device
    chunk: int = CHUNK  # the extend kernel's chunk length (the grid of its per-chunk states)
    rounded: bool = False  # also keep ``h`` rounded to the activation dtype, widened to the state dtype
    state_of: torch.Tensor = field(init=False)
    owner: torch.Tensor = field(init=False)
    iota: torch.Tensor = field(init=False)  # arange(capacity): the slot numbers (radix/records/fifo.py)
    head: int = 0
    ssm: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> [M + 1, *state]
    skipped: set[int] = field(default_factory=set)  # layers whose chunk states are not exact
    layer_ids: tuple[int, ...] = ()  # linear layer ids in the mamba pool's order: the rows of ``stack``
    stack: torch.Tensor | None = None  # [L, M + 1, *state]: every layer's ``ssm`` (views), or None
    stack_rows: dict[int, torch.Tensor] = field(default_factory=dict)  # layer id -> its view of ``stack``

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.interval < self.chunk or self.interval % self.chunk:
            raise ValueError(f"interval states need capacity >= 1 and an interval that is a multiple of "
                             f"{self.chunk}, got {self.capacity}, {self.interval}")
        self.state_of = torch.full((self.kv_size + 1,), -1, dtype=torch.int64, device=self.device)
        self.owner = fifo.unassigned_owner(self.capacity, self.kv_size, self.device)
        self.iota = torch.arange(self.capacity, dtype=torch.int64, device=self.device)

    # ---- bookkeeping (scheduler side) ---------------------------------------------------------

    def invalidate(self, kv: torch.Tensor) -> None:
        """KV indices a new token will own carry no state."""
        self.state_of.index_fill_(0, kv.reshape(-1).to(self.state_of.device, torch.int64), -1)  # no H2D scalar

    def assign(self, keys: torch.Tensor) -> None:
        """Give every key (the KV index of a kept state's last token) a state slot, oldest first."""
        keys = keys.reshape(-1).to(self.state_of.device, torch.int64)[-self.capacity:]
        if keys.numel():
            self.head = fifo.assign(self.state_of, self.owner, self.iota, self.head, keys)

    def deepest(self, span: torch.Tensor) -> tuple[int, int] | None:
        """``(j, slot)``: the last token ``span[j]`` of ``span`` (KV indices, path order) with a kept
        state, and its slot; None when no token of ``span`` has one."""
        if span.numel() == 0:
            return None
        found = self.state_of[span.reshape(-1).to(self.state_of.device, torch.int64)]
        hits = (found >= 0).nonzero()
        if hits.numel() == 0:
            return None
        j = int(hits[-1])
        return j, int(found[j])

    # ---- data (forward side) -------------------------------------------------------------------

    def dest_of(self, keys: torch.Tensor) -> torch.Tensor:
        """The state rows of ``keys`` (KV indices): their slots, the sink row for keys without one."""
        slots = self.state_of[keys.to(self.state_of.device, torch.int64)]
        return slots.remainder(self.capacity + 1)  # -1 (no slot) -> the sink row ``capacity``, one launch

    def write(self, layer_id: int, keys: torch.Tensor, h: torch.Tensor, chunks: torch.Tensor | slice,
              state_dtype: torch.dtype) -> None:
        """Store ``h[chunks]`` (per-chunk states ``[NT, *state]``) as the states of ``keys`` (KV
        indices); keys without a slot go to the sink row (:meth:`write_rows` with :meth:`dest_of`)."""
        self.write_rows(layer_id, self.dest_of(keys), h, chunks, state_dtype)

    def keeps(self, h_dtype: torch.dtype, state_dtype: torch.dtype) -> bool:
        """Whether states computed in ``h_dtype`` are kept (in ``h_dtype``) for a pool whose states are
        ``state_dtype``: where it is the state dtype (exact), or a floating ``h`` while ``rounded`` (a state
        rounded once)."""
        return h_dtype == state_dtype or (self.rounded and h_dtype.is_floating_point)

    def write_rows(self, layer_id: int, dest: torch.Tensor, h: torch.Tensor, chunks: torch.Tensor | slice,
                   state_dtype: torch.dtype) -> None:
        """Store ``h[chunks]`` in state rows ``dest`` (:meth:`dest_of`, computed once per forward), in ``h``'s
        dtype (no conversion) where :meth:`keeps`; else the layer is marked ``skipped``. ``chunks`` a slice (the
        kept chunks evenly spaced, as in one sequence: :func:`even_slice`): one copy from a view of ``h``; an index
        tensor: one gather and one copy. No host sync."""
        if not self.keeps(h.dtype, state_dtype):
            self.skipped.add(layer_id)
            return
        ssm = self.ssm.get(layer_id)
        if ssm is None:
            ssm = self.ssm[layer_id] = self._new_rows(layer_id, tuple(h.shape[1:]), h.dtype, h.device)
        if isinstance(chunks, slice):
            kept = h[chunks]
        else:
            kept = h.index_select(0, chunks if chunks.device == h.device else chunks.to(h.device))
        ssm.index_copy_(0, dest if dest.device == ssm.device else dest.to(ssm.device),
                        kept if kept.dtype == ssm.dtype else kept.to(ssm.dtype))

    def _new_rows(self, layer_id: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Layer ``layer_id``'s ``[M + 1, *shape]`` rows: its row of ``stack`` (allocated for every layer of
        ``layer_ids`` at the first), or its own tensor (not one of ``layer_ids``, another shape or dtype)."""
        if layer_id in self.layer_ids:
            if self.stack is None:
                self.stack = torch.zeros((len(self.layer_ids), self.capacity + 1, *shape), dtype=dtype, device=device)
            rows = self.stack[self.layer_ids.index(layer_id)]
            if tuple(rows.shape[1:]) == shape and rows.dtype == dtype and rows.device == device:
                self.stack_rows[layer_id] = rows
                return rows
        return torch.zeros((self.capacity + 1, *shape), dtype=dtype, device=device)

    def stacked(self) -> torch.Tensor | None:
        """``stack`` when every one of ``layer_ids`` keeps its states there and no other layer keeps any
        (row ``i``: ``layer_ids[i]``), else None."""
        stack = self.stack
        if stack is None or len(self.ssm) != len(self.layer_ids):
            return None
        held = all(lid in self.stack_rows and self.ssm.get(lid) is self.stack_rows[lid] for lid in self.layer_ids)
        return stack if held else None

    def usable(self, layer_ids: list[int]) -> bool:
        """Every linear layer keeps states (one that does not makes a rebuild from a state impossible)."""
        return not self.skipped and all(i in self.ssm for i in layer_ids)

    @property
    def nbytes(self) -> int:
        maps = (self.state_of.numel() + self.owner.numel()) * self.state_of.element_size()
        return maps + sum(t.numel() * t.element_size() for t in self.ssm.values())
