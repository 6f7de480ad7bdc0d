"""Lane-level emulator of the read copy's tensor-core flush (GDN), the index math of
``lab/kernels/csrc/read_copy.cu``'s ``flush_item_tc`` in numpy, for CPU tests.

The flush replays ``m`` records and this token exactly from the fp32 checkpoint. The sequential
recurrence (``flush_item``) costs two FMAs per state element per record plus a reduction over K;
the Gram (WY) form does the same with three small matrix products per 16-row block, which
``mma.sync.m16n8k8`` (tf32, three products per fp32 product: hi*hi + hi*lo + lo*hi) runs:

* ``G_j`` cumulative log decay over steps ``0..j`` (step ``m`` = this token), ``A_j = exp(G_j)``;
* ``X = S0 K^T`` (``[rows, 16]``, ``X[r, j] = S0[r] . k_j``), ``X'_j = A_j X_j``;
* ``d = M (beta o (v - X'))`` per row, ``M = (I + B)^-1``, ``B[j, i] = beta_j exp(G_j - G_i) k_i . k_j``
  for ``i < j`` (one 16 x 16 inverse per item: the triangular solve as a product);
* output ``o = A_m S0 q + sum_{i<m} exp(G_m - G_i) (k_i . q) d_i + d_m (k_m . q)``;
* new state ``A_m S0 + sum_j exp(G_m - G_j) d_j k_j^T``.

Fragments (PTX ISA, ``mma.m16n8k8`` tf32; ``g = lane >> 2``, ``t = lane & 3``): A 16x8 row-major,
``a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]``; B 8x8, ``b0 = B[t][g], b1 = B[t+4][g]``;
C/D 16x8, ``c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]``. The order of a product's k index is
free, so the kernel picks it to match what each lane already holds: a lane loads state rows
``g, g+8`` at columns ``16p + 4t .. +3`` (one float4 each, p = 0..7), which are its A values of
k-steps ``2p, 2p+1`` for ``X`` and, with the fold's column order chosen to match, its C values of
the fold's n-tiles ``2p, 2p+1``; a C fragment of ``X`` or ``d`` is an A fragment over ``j`` with
``j = 8 ks + 2t (+1)`` for logical ``k = t (t+4)``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["flush_item_tc_emulated", "flush_item_sequential"]

LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``D = A B + C`` for one m16n8k8, fragments per lane: a ``[32, 4]``, b ``[32, 2]``, c ``[32, 4]``."""
    A = np.zeros((16, 8))
    B = np.zeros((8, 8))
    C = np.zeros((16, 8))
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[ln]
        B[t, g], B[t + 4, g] = b[ln]
        C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = c[ln]
    D = A @ B + C
    d = np.zeros((32, 4))
    for ln in range(32):
        g, t = ln >> 2, ln & 3
        d[ln] = D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]
    return d


def fold_col(nt: int, cl: int) -> int:
    """State column of the fold's n-tile ``nt``, logical column ``cl`` (matches the lanes' float4 loads)."""
    return 16 * (nt >> 1) + 4 * (cl >> 1) + 2 * (nt & 1) + (cl & 1)


def flush_item_tc_emulated(S0: np.ndarray, K: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
                           q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """One (row, head) flush: ``S0`` ``[128, 128]``, keys ``K`` / values ``v`` ``[16, 128]`` (steps 0..m,
    step m this token), ``beta`` / log decays ``g`` ``[16]``, scaled query ``q`` ``[128]``. Steps past
    ``m`` are zeroed here as the kernel zeroes them (the rings hold garbage there). Returns (o, S_new)."""
    live = np.arange(16) <= m
    K, v = np.where(live[:, None], K, 0.0), np.where(live[:, None], v, 0.0)
    beta, g = np.where(live, beta, 0.0), np.where(live, g, 0.0)
    Gc = np.cumsum(g)  # lanes 0..15: inclusive scan; dead steps add 0, so Gc[j > m] = Gc[m]
    Am = np.exp(Gc[m])
    kq = K @ q  # lane j: k_j . q
    cq = np.where(np.arange(16) < m, np.exp(Gc[m] - Gc) * kq, np.where(np.arange(16) == m, kq, 0.0))
    # ---- per item: Gram via mma (A and B from the same key-table float4s), B matrix, inverse M
    gram = np.zeros((2, 32, 4))
    for p in range(8):
        for e in range(2):
            cols = 16 * p + 4 * T + 2 * e
            a = np.stack([K[G, cols], K[G + 8, cols], K[G, cols + 1], K[G + 8, cols + 1]], 1)
            for nt in range(2):
                b = np.stack([K[8 * nt + G, cols], K[8 * nt + G, cols + 1]], 1)
                gram[nt] = mma(a, b, gram[nt])
    BL = np.zeros((16, 16))  # BL[j, i] = beta_j exp(G_j - G_i) (k_i . k_j), i < j, from the C fragments
    for ln in range(32):
        gg, t = ln >> 2, ln & 3
        for nt in range(2):
            for r, (i, db) in enumerate(((gg, 0), (gg, 1), (gg + 8, 0), (gg + 8, 1))):
                j = 8 * nt + 2 * t + db
                if i < j:
                    BL[j, i] = beta[j] * np.exp(Gc[j] - Gc[i]) * gram[nt][ln, r]
    Mcols = np.zeros((16, 16))
    for col in range(16):  # lane `col`: column `col` of M = (I + BL)^-1 by forward substitution
        mc = np.zeros(16)
        for i in range(16):
            mc[i] = (1.0 if i == col else 0.0) - sum(BL[i, k] * mc[k] for k in range(i))
        Mcols[:, col] = mc
    # the solve's B fragments: b0 = M[8nt+g][8ks+2t], b1 = M[8nt+g][8ks+2t+1], (nt, ks) != (0, 1)
    mb = {(nt, ks): np.stack([Mcols[8 * nt + G, 8 * ks + 2 * T], Mcols[8 * nt + G, 8 * ks + 2 * T + 1]], 1)
          for nt, ks in ((0, 0), (1, 0), (1, 1))}  # fmt: skip
    # the lane's own four steps j = 2t, 2t+1, 8+2t, 9+2t (order of the C fragments' columns)
    own = np.stack([2 * T, 2 * T + 1, 8 + 2 * T, 9 + 2 * T], 1)  # [32, 4]
    o = np.zeros(128)
    S_new = np.zeros_like(S0)
    for r0 in range(0, 128, 16):
        F0 = np.stack([S0[r0 + G, 16 * p + 4 * T + c] for p in range(8) for c in range(4)], 1).reshape(32, 8, 4)
        F1 = np.stack([S0[r0 + G + 8, 16 * p + 4 * T + c] for p in range(8) for c in range(4)], 1).reshape(32, 8, 4)
        X = np.zeros((2, 32, 4))
        for p in range(8):
            for e in range(2):
                a = np.stack([F0[:, p, 2 * e], F1[:, p, 2 * e], F0[:, p, 2 * e + 1], F1[:, p, 2 * e + 1]], 1)
                cols = 16 * p + 4 * T + 2 * e
                for nt in range(2):
                    b = np.stack([K[8 * nt + G, cols], K[8 * nt + G, cols + 1]], 1)
                    X[nt] = mma(a, b, X[nt])
        # x_q partials (CUDA cores): rows g, g+8 over the lane's 32 columns
        qv = np.stack([q[16 * p + 4 * T + c] for p in range(8) for c in range(4)], 1).reshape(32, 8, 4)
        xq0, xq1 = (F0 * qv).sum((1, 2)), (F1 * qv).sum((1, 2))
        # U = beta (v - A_j X_j) in C layout: [tile][lane][c0..c3] with c0/c1 row g, c2/c3 row g+8
        U = np.zeros((2, 32, 4))
        for nt in range(2):
            for r in range(4):
                jv = 8 * nt + 2 * T + (r & 1)
                row = r0 + G + (8 if r >= 2 else 0)
                U[nt][:, r] = beta[jv] * (v[jv, row] - np.exp(Gc[jv]) * X[nt][:, r])
        # d = U M^T: A fragments of U over j (a0 = c0, a1 = c2, a2 = c1, a3 = c3 of tile ks)
        ua = [np.stack([U[ks][:, 0], U[ks][:, 2], U[ks][:, 1], U[ks][:, 3]], 1) for ks in range(2)]
        D = np.zeros((2, 32, 4))
        D[0] = mma(ua[0], mb[0, 0], D[0])
        D[1] = mma(ua[0], mb[1, 0], D[1])
        D[1] = mma(ua[1], mb[1, 1], D[1])
        # output: own steps' cq . d plus A_m x_q, reduced over the quad (lanes of one t group share g)
        part0 = Am * xq0 + sum(cq[own[:, c]] * D[c >> 1][:, c & 1] for c in range(4))
        part1 = Am * xq1 + sum(cq[own[:, c]] * D[c >> 1][:, 2 + (c & 1)] for c in range(4))
        for ln in range(32):
            if ln & 3 == 0:
                o[r0 + (ln >> 2)] = part0[ln:ln + 4].sum()
                o[r0 + (ln >> 2) + 8] = part1[ln:ln + 4].sum()
        # fold: C = A_m S0 (tiles 2p, 2p+1 = the lane's float4s), A = d' = d exp(G_m - G_j), B = keys
        Dp = np.zeros((2, 32, 4))
        for nt in range(2):
            for r in range(4):
                jv = 8 * nt + 2 * T + (r & 1)
                Dp[nt][:, r] = D[nt][:, r] * np.exp(Gc[m] - Gc[jv])
        da = [np.stack([Dp[ks][:, 0], Dp[ks][:, 2], Dp[ks][:, 1], Dp[ks][:, 3]], 1) for ks in range(2)]
        for p in range(8):
            for e in range(2):
                nt = 2 * p + e
                acc = Am * np.stack([F0[:, p, 2 * e], F0[:, p, 2 * e + 1], F1[:, p, 2 * e], F1[:, p, 2 * e + 1]], 1)
                bcol = np.array([fold_col(nt, cl) for cl in G])  # b column: logical n = g
                for ks in range(2):
                    b = np.stack([K[8 * ks + 2 * T, bcol], K[8 * ks + 2 * T + 1, bcol]], 1)
                    acc = mma(da[ks], b, acc)
                # c0, c1: row g, columns 16p + 4t + 2e + {0, 1}; c2, c3: row g + 8
                for ln in range(32):
                    gg, t = ln >> 2, ln & 3
                    base = 16 * p + 4 * t + 2 * e
                    S_new[r0 + gg, base:base + 2] = acc[ln, :2]
                    S_new[r0 + gg + 8, base:base + 2] = acc[ln, 2:]
    return o, S_new


def flush_item_sequential(S0: np.ndarray, K: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray,
                          q: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The same step by step (``read_copy_ref._replay_exact``'s recurrence for one (row, head))."""
    S = S0.copy()
    o = np.zeros(128)
    for j in range(m + 1):
        S = S * np.exp(g[j])
        d = beta[j] * (v[j] - S @ K[j])
        if j == m:
            o = S @ q + d * (K[j] @ q)
        S = S + np.outer(d, K[j])
    return o, S
