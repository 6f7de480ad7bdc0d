"""Torch reference of the gated delta rule pieces SGLang's CPU engine calls (fp32 math).

Conventions (SGLang 0.5.23): state [HV, V, K] (K contiguous); q/k have H heads, v has HV heads, value
head hv reads key head hv // (HV // H); q and k are L2-normalised (eps 1e-6) and q is scaled by
K^-1/2; g is the log-decay (scalar per head for GDN, per channel [HV, K] for KDA);
S_t = decay(S_{t-1}) + beta_t (v_t - decay(S_{t-1}) k_t) k_t^T and o_t = S_t q_t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """[..., H, D] -> [..., HV, D] by repeating each key head over its value-head group."""
    h = x.shape[-2]
    return x if h == hv else x.repeat_interleave(hv // h, dim=-2)


def delta_rule_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for N sequences. state [N,HV,V,K] fp32; q,k [N,HV,K] (normed, scaled); v [N,HV,V];
    g [N,HV] or [N,HV,K]; beta [N,HV]. Returns (o [N,HV,V], new state)."""
    decay = torch.exp(g)
    if decay.dim() == 2:
        s = state * decay[..., None, None]
    else:
        s = state * decay[:, :, None, :]
    kv = torch.einsum("nhvk,nhk->nhv", s, k)
    delta = (v - kv) * beta[..., None]
    s = s + delta[..., :, None] * k[..., None, :]
    o = torch.einsum("nhvk,nhk->nhv", s, q)
    return o, s


def gdn_gate(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, beta_sp: float = 1.0,
             threshold: float = 20.0) -> torch.Tensor:
    """g = -exp(A_log) * softplus(a + dt_bias), fp32."""
    return -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=beta_sp, threshold=threshold)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, hv: int, scale: float, l2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = q.float(), k.float()
    if l2:
        q, k = l2norm(q), l2norm(k)
    return expand_heads(q * scale, hv), expand_heads(k, hv)


#: Chunk length of SGLang's chunked prefill kernels (fla chunk_delta_h.CHUNK_SIZE); the per-chunk
#: states `h` that extra_buffer's prefill tracking reads are taken on this grid.
CHUNK = 64


def recurrent_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state_pool: torch.Tensor, state_indices: torch.Tensor, cu_seqlens: torch.Tensor, scale: float, l2: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill over packed sequences: q,k [T,H,K], v [T,HV,V], g [T,HV(,K)], beta [T,HV].

    Reads and writes state_pool[state_indices[i]] in place. Returns (o [T,HV,V] in v's dtype,
    h [NT,HV,V,K]): for sequence i with L_i tokens, ceil(L_i/CHUNK) states, the j-th being the
    state before its chunk j (after j*CHUNK of its tokens), sequences concatenated in order."""
    hv = v.shape[-2]
    qe, ke = prepare_qk(q, k, hv, scale, l2)
    out = torch.empty(v.shape, dtype=torch.float32)
    cu = cu_seqlens.tolist()
    h: list[torch.Tensor] = []
    for i in range(len(cu) - 1):
        slot = int(state_indices[i])
        lo, hi = cu[i], cu[i + 1]
        if hi <= lo:
            continue
        if slot < 0:
            out[lo:hi] = 0
            h += [torch.zeros(state_pool.shape[1:])] * ((hi - lo - 1) // CHUNK + 1)
            continue
        s = state_pool[slot].float().unsqueeze(0)
        for t in range(lo, hi):
            if (t - lo) % CHUNK == 0:
                h.append(s[0].clone())
            o, s = delta_rule_step(s, qe[t : t + 1], ke[t : t + 1], v[t : t + 1].float(),
                                   g[t : t + 1].float(), beta[t : t + 1].float())
            out[t] = o[0]
        state_pool[slot] = s[0].to(state_pool.dtype)
    hs = torch.stack(h) if h else torch.zeros((0, *state_pool.shape[1:]))
    return out.to(v.dtype), hs
