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


def chunk_forward(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact chunk form of `delta_rule_step` over C tokens of one sequence (fp32).

    state [HV,V,K]; q,k [C,HV,K] (normed, scaled, head-expanded); v [C,HV,V]; g [C,HV] or [C,HV,K];
    beta [C,HV]. With G the in-chunk cumulative log-decay, the corrected values U solve the unit
    lower-triangular system (I + diag(beta) A) U = diag(beta) (V - S0 (exp(G) * k)), A[t,i] =
    sum_k k_t exp(G_t - G_i) k_i (i < t); then o_t = S0 (exp(G_t) * q_t) + sum_{i<=t} (q_t exp(G_t-G_i) k_i) u_i
    and S_C = S0 diag(exp(G_C)) + sum_i u_i (exp(G_C - G_i) * k_i)^T. Returns (o [C,HV,V], S_C)."""
    c = q.shape[0]
    qh, kh, vh = q.permute(1, 0, 2), k.permute(1, 0, 2), v.permute(1, 0, 2)  # [HV,C,*]
    bh = beta.t()  # [HV,C]
    lower = torch.ones(c, c, dtype=torch.bool).tril()
    strict = lower.clone().fill_diagonal_(False)
    if g.dim() == 2:  # GDN: one decay per head, the decay matrix factors out of the k.k products
        G = g.t().cumsum(1)  # [HV,C]
        diff = torch.exp((G[:, :, None] - G[:, None, :]).clamp(max=0.0))  # [HV,t,i]
        kk = (kh @ kh.transpose(1, 2)) * diff * strict
        qk = (qh @ kh.transpose(1, 2)) * diff * lower
        eg = torch.exp(G)[..., None]  # [HV,C,1]
        tail = torch.exp(G[:, -1:] - G)[..., None]  # [HV,C,1]
        last = eg[:, -1, None, :]  # [HV,1,1]
    else:  # KDA: per-channel decay
        G = g.permute(1, 0, 2).cumsum(1)  # [HV,C,K]
        diff = torch.exp((G[:, :, None, :] - G[:, None, :, :]).clamp(max=0.0))  # [HV,t,i,K], <= 1 for i <= t
        kk = torch.einsum("htk,htik,hik->hti", kh, diff, kh) * strict
        qk = torch.einsum("htk,htik,hik->hti", qh, diff, kh) * lower
        eg = torch.exp(G)
        tail = torch.exp(G[:, -1:, :] - G)  # [HV,C,K]
        last = eg[:, -1, None, :]  # [HV,1,K]
    rhs = bh[..., None] * (vh - (eg * kh) @ state.transpose(1, 2))
    system = torch.eye(c) + bh[..., None] * kk
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # [HV,C,V]
    o = (eg * qh) @ state.transpose(1, 2) + qk @ u
    new_state = state * last + u.transpose(1, 2) @ (tail * kh)
    return o.permute(1, 0, 2), new_state


#: Chunk length of SGLang's chunked prefill kernels (fla chunk_delta_h.CHUNK_SIZE); the per-chunk
#: states `h` that extra_buffer's prefill tracking reads are taken on this grid.
CHUNK = 64


def unpack_mixed_qkv(mixed_qkv: torch.Tensor, hv: int, v_dim: int, k_dim: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed decode input [N, 2*H*K + HV*V] (q | k | v) -> fp32 q,k [N,H,K], v [N,HV,V]."""
    n = mixed_qkv.shape[0]
    h = (mixed_qkv.shape[1] - hv * v_dim) // (2 * k_dim)
    x = mixed_qkv.float()
    return (x[:, : h * k_dim].reshape(n, h, k_dim), x[:, h * k_dim : 2 * h * k_dim].reshape(n, h, k_dim),
            x[:, 2 * h * k_dim :].reshape(n, hv, v_dim))


def decode_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: float, ssm_states: torch.Tensor, cache_indices: torch.Tensor, l2: bool = True) -> torch.Tensor:
    """One token per row: q,k [N,H,K], v [N,HV,V], g [N,HV(,K)] fp32, beta [N,HV] fp32. Rows with a
    negative slot give zeros and touch nothing; a slot may appear in one live row only. Updates
    ssm_states in place; returns o [N,HV,V] fp32."""
    qe, ke = prepare_qk(q, k, v.shape[1], scale, l2)
    out = torch.zeros(v.shape, dtype=torch.float32)
    idx = cache_indices.long()
    rows = (idx >= 0).nonzero().flatten()
    if rows.numel():
        slots = idx[rows]
        if torch.unique(slots).numel() != slots.numel():
            raise ValueError(f"decode: a state slot appears in two rows: {slots.tolist()}")
        o, s = delta_rule_step(ssm_states[slots].float(), qe[rows], ke[rows], v[rows].float(), g[rows].float(),
                               beta[rows].float())
        ssm_states[slots] = s.to(ssm_states.dtype)
        out[rows] = o
    return out


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
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.zeros(v.shape, dtype=torch.float32)
    cu = cu_seqlens.tolist()
    h: list[torch.Tensor] = []
    for i in range(len(cu) - 1):
        slot = int(state_indices[i])
        lo, hi = cu[i], cu[i + 1]
        if hi <= lo:
            continue
        if slot < 0:
            h += [torch.zeros(state_pool.shape[1:])] * ((hi - lo - 1) // CHUNK + 1)
            continue
        s = state_pool[slot].float().clone()  # h keeps it: must not alias the pool
        for c0 in range(lo, hi, CHUNK):
            c1 = min(c0 + CHUNK, hi)
            h.append(s)
            out[c0:c1], s = chunk_forward(s, qe[c0:c1], ke[c0:c1], vf[c0:c1], gf[c0:c1], bf[c0:c1])
        state_pool[slot] = s.to(state_pool.dtype)
    hs = torch.stack(h) if h else torch.zeros((0, *state_pool.shape[1:]))
    return out.to(v.dtype), hs
