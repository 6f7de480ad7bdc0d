"""The spec-verify ring (``--enable-linear-replayssm-spec``, GDN): one view, its fold, and the
movers that must fold it first.

SGLang 0.5.23's spec ring is **row-keyed** (request-pool rows, ``spec_state_size + 1`` of them) and
**circular**: a request on row ``r`` working in mamba slot ``s`` has the state
``temporal[s]`` folded with its ``write_pos[r]`` accepted records at physical positions
``(cache_base[r] + t) & (L - 1)``, ``t < write_pos[r]`` (records ``d`` / ``k`` in the activation
dtype plus optional lo parts ``replayssm_rawv`` / ``replayssm_rawk``; ``g`` fp32). With an fp32
checkpoint the ring persists across verify steps (it folds only when ``write_pos + 2T > L``), so
up to ``L - 2T`` accepted records pend; no mover reads these cursors (``ring_pool`` views only the
decode ring). KDA and non-fp32 checkpoints fold every commit and are never viewed here.

:meth:`SpecRing.fold` is SGLang's compact commit with the flush forced on: ``temporal[s]`` becomes
the full state, ``cache_base[r] += write_pos[r]``, ``write_pos[r] = 0``, ``is_flush[r] = 0`` -- state
preserving. The movers call it before SGLang reads ``temporal`` alone:

* D1 no_buffer finish donation (``MambaComponent.prepare_for_caching_req``): the node gets the full
  state at the donated depth, where conv and temporal agree (fix ``spec_finish_donation``);
* D2 CPU retraction backup (``Req.offload_kv_cache``, PD decode): the backup carries the full state
  (fix ``spec_retract_backup``);
* D3 / D4 extend over a spec row (a mixed-chunk decode row, a streaming-session turn): the extend
  starts from the full state and the old records are not re-applied (fix ``spec_extend_fold``);
* D5 a GDN spec ring whose length is not a power of two or is < 2 x draft tokens is refused at
  startup in one line (fix ``spec_ring_check``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.kernels.materialize import materialize

__all__ = ["SpecRing", "check_spec_ring_args", "fold_before_copy", "spec_ring", "spec_ring_error"]


@dataclass(frozen=True)
class SpecRing:
    """A GDN spec-ring ``MambaPool`` (``pool``): ring tensors ``[layers, rows, heads, L, dim]`` and
    row cursors ``[rows]``."""

    pool: Any
    write_pos: torch.Tensor
    cache_base: torch.Tensor
    is_flush: torch.Tensor
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    d_lo: torch.Tensor | None
    k_lo: torch.Tensor | None

    @property
    def temporal(self) -> torch.Tensor:
        return self.pool.mamba_cache.temporal

    @property
    def length(self) -> int:
        return int(self.d.shape[-2])

    def _linear(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The records of ``rows`` in commit order (position t = physical ``(base + t) & (L-1)``), fp32,
        lo parts added: d ``[layers, n, HV, L, V]``, k ``[layers, n, H, L, K]``, g ``[layers, n, HV, L]``."""
        length = self.length
        phys = (self.cache_base[rows].to(torch.long)[:, None]
                + torch.arange(length, device=rows.device)) & (length - 1)  # [n, L]

        def gather(t: torch.Tensor | None, lo: torch.Tensor | None, dim_tail: int) -> torch.Tensor:
            assert t is not None
            x = t[:, rows].float()
            if lo is not None:
                x = x + lo[:, rows].float()
            shape = [1, phys.shape[0], 1, length] + [1] * dim_tail
            idx = phys.reshape(shape).expand(x.shape)
            return torch.gather(x, 3, idx)

        return gather(self.d, self.d_lo, 1), gather(self.k, self.k_lo, 1), gather(self.g, None, 0)

    def counts(self, rows: torch.Tensor) -> torch.Tensor:
        return self.write_pos[rows].to(torch.long)

    def folded_temporal(self, slots: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``temporal[:, slots[i]]`` folded with row ``rows[i]``'s pending records (a copy, fp32 math,
        stored in the checkpoint dtype); nothing is modified."""
        temporal = self.temporal[:, slots].clone()
        d, k, g = self._linear(rows)
        ar = torch.arange(slots.numel(), device=slots.device)
        materialize(temporal, d.to(temporal.dtype), k.to(temporal.dtype), g, ar, ar, self.counts(rows),
                    is_kda=False, check_values=not temporal.is_cuda)
        return temporal

    def fold(self, slots: Any, rows: Any) -> None:
        """For each pair with a live slot and row (> 0, pairwise distinct) and pending records:
        ``temporal[:, slot] = full state``, the row's ring emptied (base advanced past its records)."""
        dev = self.write_pos.device
        s = torch.as_tensor(slots).reshape(-1).to(device=dev, dtype=torch.long)
        r = torch.as_tensor(rows).reshape(-1).to(device=dev, dtype=torch.long)
        keep = (s > 0) & (r > 0)
        s, r = s[keep], r[keep]
        if s.numel() == 0:
            return
        live = self.counts(r) > 0
        s, r = s[live], r[live]
        if s.numel() == 0:
            return
        self.temporal[:, s] = self.folded_temporal(s, r)
        length = self.length
        self.cache_base[r] = ((self.cache_base[r].to(torch.long) + self.counts(r)) & (length - 1)).to(
            self.cache_base.dtype)
        self.write_pos[r] = 0
        self.is_flush[r] = 0


def spec_ring(mamba_pool: Any) -> SpecRing | None:
    """The spec-ring view of ``mamba_pool``: a GDN pool with SGLang's circular spec ring and its row
    cursors (an fp32 or lower checkpoint alike), else None (no spec flag, KDA, fold-every-commit)."""
    if mamba_pool is None or getattr(mamba_pool, "replayssm_cache_base", None) is None:
        return None
    if getattr(mamba_pool, "replayssm_spec_fold", False):
        return None
    cache = getattr(mamba_pool, "mamba_cache", None)
    d, k, g = (getattr(cache, n, None) for n in ("replayssm_d", "replayssm_k", "replayssm_g"))
    if d is None or k is None or g is None or g.dim() != 4:  # KDA keeps per-channel gates
        return None
    return SpecRing(mamba_pool, mamba_pool.replayssm_spec_write_pos, mamba_pool.replayssm_cache_base,
                    mamba_pool.replayssm_is_flush, d, k, g, getattr(cache, "replayssm_rawv", None),
                    getattr(cache, "replayssm_rawk", None))


def spec_ring_error(ring_len: int, draft_tokens: int | None) -> str | None:
    """Why a GDN spec ring of ``ring_len`` records cannot serve ``draft_tokens`` drafts, or None."""
    if ring_len <= 0 or ring_len & (ring_len - 1):
        return (f"--linear-replayssm-cache-len {ring_len} is not a power of two; the spec-verify ring "
                f"addresses records modulo L (pass 16, 32, ...)")
    if draft_tokens is not None and ring_len < 2 * draft_tokens:
        return (f"--linear-replayssm-cache-len {ring_len} < 2 x --speculative-num-draft-tokens "
                f"{draft_tokens}: the spec-verify ring needs an early-flush margin of two verify windows "
                f"(pass --linear-replayssm-cache-len {1 << (2 * draft_tokens - 1).bit_length()} or more)")
    return None


def check_spec_ring_args(server_args: Any) -> None:
    """Refuse (ValueError, one line) a GDN spec ring SGLang would only catch in a kernel assert."""
    if not getattr(server_args, "enable_linear_replayssm_spec", False):
        return
    message = spec_ring_error(int(server_args.linear_replayssm_cache_len),
                              getattr(server_args, "speculative_num_draft_tokens", None))
    if message is not None:
        raise ValueError(f"sglang-replayssm: {message}")


def _req_slot_row(req_pool: Any, req: Any) -> tuple[torch.Tensor, Any] | None:
    kv = getattr(req, "kv", None)
    slot = getattr(kv, "mamba_pool_idx", None)
    row = getattr(kv, "req_pool_idx", None)
    if slot is None or row is None:
        return None
    return req_pool.translate_mamba_indices(torch.as_tensor(slot).reshape(1)), row


def fold_before_finish(component: Any, req: Any, is_finished: bool) -> None:
    """D1: before ``MambaComponent.prepare_for_caching_req`` donates a finishing no_buffer slot, fold
    its row's pending spec records (SGLang's cap reads only the decode ring's cursor, None here)."""
    if not is_finished or component.cache.enable_mamba_extra_buffer:
        return
    req_pool = component.cache.req_to_token_pool
    view = spec_ring(getattr(req_pool, "mamba_pool", None))
    pair = _req_slot_row(req_pool, req) if view is not None else None
    if view is not None and pair is not None:
        view.fold(*pair)


def fold_before_copy(req_pool: Any, req: Any) -> None:
    """Before the request's working slot is copied whole (records' extra_buffer end state,
    ``radix/ring/donation.py``): fold its row's pending spec records, so ``temporal`` is the full state."""
    view = spec_ring(getattr(req_pool, "mamba_pool", None))
    pair = _req_slot_row(req_pool, req) if view is not None else None
    if view is not None and pair is not None:
        view.fold(*pair)


def fold_before_offload(req: Any, req_to_token_pool: Any) -> None:
    """D2: before ``Req.offload_kv_cache`` backs up conv + temporal (``get_cpu_copy`` gets no row, and
    the resumed row is fresh, its cursors zeroed), fold the request's pending spec records."""
    view = spec_ring(getattr(req_to_token_pool, "mamba_pool", None))
    if view is None or not getattr(getattr(req, "kv", None), "holds_mamba", True):
        return
    pair = _req_slot_row(req_to_token_pool, req)
    if pair is not None:
        view.fold(*pair)


def fold_before_extend(runner: Any, forward_batch: Any) -> None:
    """D3 / D4: before an extend or MIXED forward (not a verify / draft extend / draft worker) reads
    ``temporal``, fold every row's pending spec records (a mixed-chunk decode row, a streaming
    session's next turn on the row it kept); extends whose rows cannot hold records skip it, as the
    decode ring's fold does (:func:`~sglang_replayssm.radix.ring.movers.rows_may_hold_records`)."""
    from sglang_replayssm.radix.ring.movers import _reads_extend_state, rows_may_hold_records

    pool: Any = getattr(runner, "req_to_token_pool", None)
    view = spec_ring(getattr(pool, "mamba_pool", None))
    rows = getattr(forward_batch, "req_pool_indices", None)
    if (view is None or rows is None or not _reads_extend_state(runner, forward_batch)
            or not rows_may_hold_records(runner, forward_batch)):
        return
    view.fold(pool.translate_mamba_indices(pool.get_mamba_indices(rows)), rows)
