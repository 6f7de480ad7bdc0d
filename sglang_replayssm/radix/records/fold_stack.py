"""Every GDN layer's extend of one rebuild step as one varlen call over the mamba pool's layer stack.

A rebuild folds the same spans into every GDN layer; only the inputs (each layer's conv output and gate
rows) and the layer's rows of the pool differ. Where the pool keeps its states as one contiguous stack
``temporal [L, slots, HV, V, K]`` (SGLang's ``MambaPool``; the per-layer caches are its rows), the
stack flattened to ``[L * slots, HV, V, K]`` holds every layer's slots, so the extend kernel runs once
with the sequences ``(layer, span)``, layer-major: state index ``row(layer) * slots + dst`` and the
layer's q, k, v, g, beta rows. The gates run once too, the layers side by side as heads
(``fused_gdn_gating`` is elementwise per head: ``A_log``, ``dt_bias`` of every layer concatenated).

Each sequence's recurrence reads and writes only its own state and rows, so the result is the per-layer
calls' (bit for bit where the kernel treats sequences independently, as SGLang's Triton chunk kernels
do). The conv runs once too (:func:`conv_stacked`): it is depthwise, so the layers' channels side by side
(``[T, L * conv_dim]``, every layer's weights and windows concatenated) give each channel its own layer's
result, from the records' ``x`` stack ``[L, R + 1, conv_dim]`` and the pool's conv stack
``[L, slots, conv_dim, W - 1]`` gathered into (and written back from) slot-major work windows.
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass
from typing import Any

import torch

from sglang_replayssm.host_lists import on_device

__all__ = ["CONV_WORK_ROWS", "StackedStates", "conv_stacked", "extend_stacked", "gdn_extend", "stacked_states",
           "work_rows"]


@dataclass(frozen=True)
class StackedStates:
    """The pool's state stack flattened (``flat [L * slots, *state]``) and each layer's row in it; ``conv``:
    the conv windows' stack ``[L, slots, conv_dim, W - 1]`` with the same rows, or None."""

    flat: torch.Tensor
    slots: int
    rows: dict[int, int]
    conv: torch.Tensor | None = None


def _rows_of(tensors: list[torch.Tensor], layer_ids: list[int]) -> tuple[torch.Tensor, dict[int, int]] | None:
    """The one contiguous ``[L, ...]`` tensor whose rows are ``tensors`` (each a whole row), and each
    layer's row; None otherwise."""
    base = tensors[0]._base
    if base is None or base.dim() != tensors[0].dim() + 1 or not base.is_contiguous():
        return None
    rows: dict[int, int] = {}
    for layer_id, t in zip(layer_ids, tensors):
        row, rem = divmod(int(t.storage_offset()) - int(base.storage_offset()), int(base.stride(0)))
        if (t._base is not base or rem or not 0 <= row < base.shape[0] or t.shape != base.shape[1:]
                or t.stride() != base.stride()[1:]):
            return None
        rows[layer_id] = row
    return base, rows


def stacked_states(caches: dict[int, Any]) -> StackedStates | None:
    """The stack behind every ``caches[layer_id].temporal`` (``mamba2_layer_cache`` rows of one
    contiguous ``[L, slots, *state]`` tensor), or None where the layers' states are not laid out so; with
    the conv windows' stack where ``conv[0]`` is laid out so too, in the same rows."""
    temporals: list[torch.Tensor] = [t for c in caches.values() if isinstance(t := getattr(c, "temporal", None),
                                                                            torch.Tensor)]
    if not temporals or len(temporals) != len(caches):
        return None
    found = _rows_of(temporals, list(caches))
    if found is None:
        return None
    base, rows = found
    convs = [c.conv[0] for c in caches.values() if isinstance(getattr(c, "conv", None), (list, tuple))]
    conv = _rows_of(convs, list(caches)) if len(convs) == len(caches) else None
    return StackedStates(base.flatten(0, 1), base.shape[1], rows,
                         conv[0] if conv is not None and conv[1] == rows and conv[0].dim() == 4 else None)


def conv_stacked(layers: list[Any], xs: torch.Tensor, conv: torch.Tensor, rows: dict[int, int], slots: torch.Tensor,
                 dst: torch.Tensor, conv_init: torch.Tensor, conv_cu: torch.Tensor,
                 conv_lens: list[int]) -> torch.Tensor:
    """Every layer's conv over the records ``slots`` (``T`` of them: the jobs' spans, lead rows included)
    in one call: ``xs [L, R + 1, conv_dim]`` (row ``i``: ``layers[i]``), each job's window
    ``conv[rows[layer], dst[job]]`` read (where ``conv_init``) and left updated, through work windows of
    :func:`work_rows` rows (one compiled conv for any count of jobs up to :data:`CONV_WORK_ROWS`). Returns the conv
    outputs ``[L * T, conv_dim]``, layer-major."""
    from sglang.srt.layers.attention.linear import gdn_backend  # its conv is the platform's

    L, T, dim, n = len(layers), int(slots.numel()), int(xs.shape[-1]), int(dst.numel())
    x = xs.index_select(1, slots).transpose(0, 1).reshape(T, L * dim)  # channels of every layer side by side
    at = (_layout([rows[lay.layer_id] for lay in layers], torch.int64, dst.device)[:, None], dst.long()[None, :])
    win = conv.shape[-1]
    work = conv.new_empty((work_rows(n), L * dim, win))  # slot-major windows; rows past n are never read
    work[:n].view(n, L, dim, win).copy_(conv[at].transpose(0, 1))
    bias = None if layers[0].bias is None else torch.cat([lay.bias for lay in layers])
    out = gdn_backend.causal_conv1d_fn(
        x.transpose(0, 1), torch.cat([lay.conv_weights for lay in layers]), bias, activation=layers[0].activation,
        conv_states=work, has_initial_state=conv_init,
        cache_indices=torch.arange(n, device=dst.device, dtype=dst.dtype),
        query_start_loc=conv_cu, seq_lens_cpu=conv_lens,
    ).transpose(0, 1)[:T]
    conv[at] = work[:n].view(n, L, dim, win).transpose(0, 1)
    return out.reshape(T, L, dim).transpose(0, 1).reshape(L * T, dim)


#: The layout lists already on the device: ``(values, dtype, device)`` -> the tensor (a server has one or two).
_LAYOUTS: dict[tuple[tuple[int, ...], torch.dtype, str], torch.Tensor] = {}


def _layout(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (the layers' rows in a stack: the same at every rebuild of a server) on ``device``, copied there
    once (:func:`on_device`) and reused; never written, so a reused tensor always holds ``values``."""
    key = (tuple(values), dtype, str(device))
    found = _LAYOUTS.get(key)
    if found is None:
        if len(_LAYOUTS) >= 64:  # layouts of pools that come and go (tests): keep the cache small
            _LAYOUTS.clear()
        found = _LAYOUTS[key] = on_device(values, dtype, device)
    return found


#: The stacked conv's work windows come in row counts of powers of two, at least this many. SGLang's Triton conv
#: compiles a variant per row count of its ``conv_states`` (``num_cache_lines`` is a ``tl.constexpr``): a count per
#: number of jobs in a step would compile anew (0.1-0.3 s, the scheduler waiting) at every new count a server sees.
CONV_WORK_ROWS = 16


def work_rows(jobs: int) -> int:
    """Rows of the stacked conv's work windows for ``jobs`` rebuilds: one variant for up to
    :data:`CONV_WORK_ROWS` jobs, then one per power of two."""
    return max(CONV_WORK_ROWS, 1 << max(jobs - 1, 0).bit_length())


def extend_stacked(backend: Any, layers: list[Any], mixed: list[torch.Tensor] | torch.Tensor, keep: torch.Tensor | None,
                   a: torch.Tensor, b: torch.Tensor, stack: StackedStates, ext_dst: torch.Tensor, ext_lens: list[int],
                   ext_prefix: torch.Tensor) -> None:
    """Fold every layer's extended rows into its states at ``ext_dst`` in one extend call.

    ``layers[i]``: the GDN layer of ``mixed[i]`` (its conv output ``[rows, q + k + v]``, or all of them as one
    layer-major tensor, :func:`conv_stacked`'s; of each, ``keep``
    picks the extended rows, None: all) and of ``a[i]``, ``b[i]`` (``[L, n, HV]``, the gate inputs of the
    extended rows); ``ext_lens``: the spans' lengths (summing to ``n``), ``ext_dst`` their state slots,
    ``ext_prefix`` the extend's prefix flags."""
    first, L = layers[0], len(layers)
    n, hv = a.shape[1], a.shape[2]
    rows = mixed if isinstance(mixed, torch.Tensor) else torch.cat(mixed)  # [L * rows, q + k + v], layer-major
    if keep is not None:  # every layer's extended rows in one gather
        per_layer = rows.shape[0] // L
        rows = rows[(torch.arange(L, device=keep.device) * per_layer)[:, None].add(keep[None, :]).reshape(-1)]
    q, k, v = torch.split(rows, [first.q_dim, first.k_dim, first.v_dim], dim=-1)
    q = q.reshape(1, L * n, first.num_q_heads, first.head_q_dim)
    k = k.reshape(1, L * n, first.num_k_heads, first.head_k_dim)
    v = v.reshape(1, L * n, first.num_v_heads, first.head_v_dim)
    heads = types.SimpleNamespace(A_log=torch.cat([lay.A_log for lay in layers]),
                                  dt_bias=torch.cat([lay.dt_bias for lay in layers]))
    g, beta = backend._prefill_gates(heads, a.transpose(0, 1).reshape(n, L * hv), b.transpose(0, 1).reshape(n, L * hv))
    g = g.reshape(n, L, hv).transpose(0, 1).reshape(1, L * n, hv)
    beta = beta.reshape(n, L, hv).transpose(0, 1).reshape(1, L * n, hv)
    offsets = _layout([stack.rows[lay.layer_id] * stack.slots for lay in layers], ext_dst.dtype, ext_dst.device)
    indices = (offsets[:, None] + ext_dst[None, :]).reshape(-1)
    ends = list(itertools.accumulate(ext_lens))
    cu = on_device([0] + [i * n + e for i in range(L) for e in ends], torch.int32, ext_dst.device)
    gdn_extend(backend, q, k, v, g, beta, stack.flat, indices, cu, first.layer_id, ext_prefix.repeat(L))


def gdn_extend(backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               ssm_states: torch.Tensor, indices: torch.Tensor, cu: torch.Tensor, layer_id: int,
               prefix: torch.Tensor) -> None:
    """SGLang's GDN extend kernel (``backend.kernel_dispatcher.extend``) over the varlen sequences ``cu``
    from and into ``ssm_states[indices]``, as a prefill without tracked or checkpointed states calls it."""
    backend.kernel_dispatcher.extend(
        q=q, k=k, v=v, g=g, beta=beta, ssm_states=ssm_states, cache_indices=indices, query_start_loc=cu,
        state_checkpoint_cu_starts=None, num_state_checkpoints=0, state_checkpoint_every_n_tokens=0, output=None,
        layer_id=layer_id, extend_prefix_lens=prefix, track_state=None, track_chunk_idx=None,
    )
