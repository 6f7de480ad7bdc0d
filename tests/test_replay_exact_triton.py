"""The read copy's exact replay kernel (kernels/replay_exact_triton.py) against its torch reference and an
fp64 oracle (the same reference in float64), on CPU under TRITON_INTERPRET=1 and on CUDA where present."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.read_copy_ref import replay_exact
from sglang_replayssm.kernels.replay_exact_triton import replay_exact_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SLOTS, H, HV, K, V, L = 7, 2, 4, 32, 32, 16


def _pool(is_kda: bool, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    k = torch.nn.functional.normalize(r(SLOTS, H, L, K), dim=-1)
    g_shape = (SLOTS, HV, L, K) if is_kda else (SLOTS, HV, L)
    return {"temporal": r(SLOTS, HV, V, K, scale=0.5), "k": k, "g": -torch.rand(*g_shape, generator=gen).to(DEVICE),
            "v": r(SLOTS, HV, L, V).to(torch.bfloat16), "beta": torch.rand(SLOTS, HV, L, generator=gen).to(DEVICE)}


def _oracle(temporal: torch.Tensor, p: dict[str, torch.Tensor], slot: int, m: int, is_kda: bool) -> torch.Tensor:
    """The recurrence in float64, one head at a time: S <- S Diag(alpha); S <- S + beta (v - S k) k^T."""
    G = HV // H
    S = temporal[slot].double().clone()  # [HV, V, K]
    for j in range(m):
        for hv in range(HV):
            k = p["k"][slot, hv // G, j].double()
            alpha = torch.exp(p["g"][slot, hv, j].double())
            S[hv] = S[hv] * (alpha[None, :] if is_kda else alpha)
            d = p["beta"][slot, hv, j].double() * (p["v"][slot, hv, j].double() - S[hv] @ k)
            S[hv] = S[hv] + torch.outer(d, k)
    return S


@pytest.mark.interpret
@pytest.mark.parametrize("is_kda", [False, True])
def test_replay_matches_reference_and_fp64_oracle(is_kda: bool) -> None:
    p = _pool(is_kda, 3 + is_kda)
    # rows: a full ring, a partial one, one record, then the rows that must leave their dst alone
    src = torch.tensor([1, 2, 3, -1, 4, 5], device=DEVICE)
    dst = torch.tensor([6, 0, 4, 2, -1, 3], device=DEVICE)
    counts = torch.tensor([16, 5, 1, 7, 9, 0], device=DEVICE)
    before = p["temporal"].clone()
    G = HV // H
    live = torch.tensor([0, 1, 2], device=DEVICE)
    want = replay_exact(before, p["k"], p["g"], p["v"], p["beta"], src[live], counts[live], G, is_kda)
    oracle = torch.stack([_oracle(before, p, int(src[i]), int(counts[i]), is_kda) for i in live.tolist()])
    # the rows read their sources before any write: src 4 (row 2) is written by row 2 itself only
    replay_exact_triton(p["temporal"], p["k"], p["g"], p["v"], p["beta"], src, dst, counts, is_kda=is_kda)
    got = p["temporal"][dst[live]]
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert (got.double() - oracle).abs().max() < 1e-4
    assert (want.double() - oracle).abs().max() < 1e-4
    untouched = [s for s in range(SLOTS) if s not in (6, 0, 4)]
    assert torch.equal(p["temporal"][untouched], before[untouched])  # skipped rows wrote nothing


@pytest.mark.interpret
def test_replay_refuses_mismatched_shapes() -> None:
    p = _pool(False, 1)
    idx = torch.zeros(1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="shapes disagree"):
        replay_exact_triton(p["temporal"], p["k"], p["g"][..., None].expand(-1, -1, -1, K).contiguous(), p["v"],
                            p["beta"], idx, idx, idx, is_kda=False)
    with pytest.raises(ValueError, match="must be fp32"):
        replay_exact_triton(p["temporal"].double(), p["k"], p["g"], p["v"], p["beta"], idx, idx, idx, is_kda=False)
