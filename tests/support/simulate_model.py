"""The simulation's configuration, toy model and request record (for :mod:`simulate`).

The toy hybrid layer stack's per-token inputs (packed q|k|v, gate inputs ``a``/``b``) are table
look-ups by token id, so the state of any token path is a well-defined fp64 recurrence
(:meth:`ToyModel.oracle`); the conv state of a path is its last ``conv_kernel - 1`` packed inputs, so
a conv window identifies the depth it belongs to.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SimConfig", "SimReq", "ToyModel", "rel_err", "track_grid_of"]

_F64 = torch.float64


@dataclass(frozen=True)
class SimConfig:
    """Shapes and policies of one simulated server.

    ``kind``: ``"gdn"`` (H=1 key head, HV=2 value heads, scalar gate) or ``"kda"`` (H=HV=2,
    per-channel gate); K=V=``head_dim``. ``strategy``: the mamba radix cache strategy.
    ``track_interval``: ``--mamba-track-interval``; ``chunk``: the mamba cache chunk size (page
    size is 1, so the checkpoint grid is ``chunk`` and the decode track grid is
    ``lcm(chunk, track_interval)``). ``ring_len``: ``--linear-replayssm-cache-len``.
    """

    kind: str = "gdn"
    strategy: str = "no_buffer"
    track_interval: int = 4
    ring_len: int = 4
    chunk: int = 1
    head_dim: int = 32
    mamba_layers: int = 2
    mamba_slots: int = 24
    max_reqs: int = 8
    kv_size: int = 2048
    max_context_len: int = 256
    vocab: int = 10
    conv_kernel: int = 4
    seed: int = 0
    #: Overlap scheduling as the pools see it (sizes the ping-pong buffer: 2 with overlap, else
    #: 1); None = on for the extra_buffer strategies, off for no_buffer (SGLang's defaults).
    overlap: bool | None = None
    #: Run SGLang's Triton track-copy kernel (interpreted on CPU, ~0.1 s a launch) instead of
    #: an equivalent torch copy.
    triton_track_copy: bool = False
    #: Decode rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``, radix/ring/rows.py).
    ring_rows: bool = False
    #: Keep records (``radix/records/pool.py``, GDN): prefix hits at any depth, rebuilt from them.
    records: bool = False
    #: Record-pool capacity in tokens (first in, first out).
    record_tokens: int = 4096
    #: Keep a prefill state every this many tokens (``radix/records/interval_states.py``; 0 = none), on the
    #: grid of ``chunk`` (the simulated extend kernel's chunk length).
    state_interval: int = 0
    #: The io (activation) dtype: the conv pool's dtype, and the packed q|k|v inputs are rounded to it
    #: (as a served model's are), so a read copy's records hold them exactly. States stay fp32.
    io_dtype: torch.dtype = torch.float32

    @property
    def extra_buffer(self) -> bool:
        return self.strategy in ("extra_buffer", "extra_buffer_lazy")

    @property
    def lazy(self) -> bool:
        return self.strategy == "extra_buffer_lazy"

    @property
    def is_kda(self) -> bool:
        return self.kind == "kda"


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / max(||ref||, tiny)`` in float64."""
    x64, r64 = x.to(_F64), ref.to(_F64)
    return float((x64 - r64).norm() / r64.norm().clamp_min(1e-30))


class ToyModel:
    """Per-layer token tables for a GDN or KDA layer stack, and the fp64 oracle of a token path."""

    def __init__(self, cfg: SimConfig):
        from sglang_replayssm.kernels.naive import (
            compute_beta_fp64,
            compute_gate_fp64,
            l2norm_fp64,
            unpack_mixed_qkv,
        )

        self.cfg = cfg
        self.K = self.V = cfg.head_dim
        self.H, self.HV = (2, 2) if cfg.is_kda else (1, 2)
        self.qkv_dim = 2 * self.H * self.K + self.HV * self.V
        self.win = cfg.conv_kernel - 1
        gen = torch.Generator().manual_seed(1000 + cfg.seed)
        n, vocab, HV, K = cfg.mamba_layers, cfg.vocab, self.HV, self.K
        self.qkv = torch.randn(n, vocab, self.qkv_dim, generator=gen).to(cfg.io_dtype).float()
        a_shape = (n, vocab, HV, K) if cfg.is_kda else (n, vocab, HV)
        self.a = 0.5 * torch.randn(*a_shape, generator=gen)
        self.b = torch.randn(n, vocab, HV, generator=gen)
        self.A_log = torch.log(0.2 + 0.6 * torch.rand(n, HV, generator=gen))
        self.dt_bias = 0.1 * torch.randn(*((n, HV, K) if cfg.is_kda else (n, HV)), generator=gen)
        # fp64 per-token recurrence inputs, [layer][token] -> (k [HV, K] normalised, v [HV, V], g, beta)
        rep = HV // self.H
        self._k, self._v, self._g, self._beta = [], [], [], []
        for li in range(n):
            _, k, v = unpack_mixed_qkv(self.qkv[li], self.H, self.K, HV, self.V)
            self._k.append(l2norm_fp64(k).repeat_interleave(rep, dim=-2))  # [vocab, HV, K]
            self._v.append(v.to(_F64))
            self._g.append(compute_gate_fp64(self.a[li], self.A_log[li], self.dt_bias[li], is_kda=cfg.is_kda))
            self._beta.append(compute_beta_fp64(self.b[li]))
        self._memo: OrderedDict[tuple[int, ...], list[torch.Tensor]] = OrderedDict()
        self._memo_cap = 4096
        self._zero = [torch.zeros(HV, self.V, K, dtype=_F64) for _ in range(n)]

    # -- kernel inputs --------------------------------------------------------------------------

    def decode_inputs(
        self, layer: int, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mixed_qkv [B, qkv_dim], a, b [B, HV])`` for one decode step of ``tokens`` ``[B]``."""
        return (
            self.qkv[layer, tokens].contiguous(),
            self.a[layer, tokens].contiguous(),
            self.b[layer, tokens].contiguous(),
        )

    # -- oracle -----------------------------------------------------------------------------------

    def _step(self, states: list[torch.Tensor], tok: int) -> list[torch.Tensor]:
        out = []
        for li, s in enumerate(states):
            g = self._g[li][tok]
            decay = torch.exp(g)[..., None, :] if self.cfg.is_kda else torch.exp(g)[..., None, None]
            s_dec = s * decay
            k, v = self._k[li][tok], self._v[li][tok]
            d = self._beta[li][tok][:, None] * (v - torch.einsum("hvk,hk->hv", s_dec, k))
            out.append(s_dec + d[:, :, None] * k[:, None, :])
        return out

    def oracle(self, path: Sequence[int]) -> list[torch.Tensor]:
        """fp64 state ``[HV, V, K]`` per layer after consuming ``path`` from the zero state."""
        key = tuple(int(t) for t in path)
        n = len(key)
        while n > 0 and key[:n] not in self._memo:
            n -= 1
        states = self._memo[key[:n]] if n > 0 else self._zero
        if n > 0:
            self._memo.move_to_end(key[:n])
        for i in range(n, len(key)):
            states = self._step(states, key[i])
            self._memo[key[: i + 1]] = states
        while len(self._memo) > self._memo_cap:
            self._memo.popitem(last=False)
        return states

    def conv_window(self, path: Sequence[int]) -> list[torch.Tensor]:
        """The conv state of ``path`` per layer, in the pool's layout (GDN ``[dim, w]``, KDA ``[w, dim]``)."""
        tail = [int(t) for t in path[-self.win :]] if self.win > 0 else []
        out = []
        for li in range(self.cfg.mamba_layers):
            rows = torch.zeros(self.win, self.qkv_dim)
            if tail:
                rows[self.win - len(tail) :] = self.qkv[li, tail]
            out.append(rows if self.cfg.is_kda else rows.t().contiguous())
        return out

    def extend_conv(self, window: torch.Tensor, layer: int, tokens: Sequence[int]) -> torch.Tensor:
        """The conv window after appending ``tokens`` to a path whose window is ``window``."""
        rows = window if self.cfg.is_kda else window.t()
        rows = torch.cat([rows.to(torch.float32), self.qkv[layer, list(tokens)]])[-self.win :]
        return rows.contiguous() if self.cfg.is_kda else rows.t().contiguous()


@dataclass
class SimReq:
    """A request driven by the simulation: SGLang's ``Req`` plus the tokens it will generate."""

    req: Any
    script: list[int]
    #: ``req.prefix_len`` right after the admission match (SGLang advances it after prefill).
    matched: int = 0

    @property
    def consumed(self) -> list[int]:
        """Tokens whose state the request's working slot holds (``kv_committed_len`` of them)."""
        fill = list(self.req.origin_input_ids) + list(self.req.output_ids)
        return fill[: self.req.kv.kv_committed_len]



def track_grid_of(cfg: SimConfig) -> int:
    """The decode track grid of ``cfg`` (page 1): ``lcm(chunk, track_interval)``."""
    return math.lcm(cfg.chunk, cfg.track_interval)
