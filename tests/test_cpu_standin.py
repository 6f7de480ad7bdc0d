"""The CPU stand-in's GDN/KDA prefill (chunk form) against the fp64 recurrence oracle."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.cpu.standin import gdn
from sglang_replayssm.kernels.naive import recurrence_fp64


@pytest.mark.parametrize("per_channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("lengths", [[1, 64, 150], [63, 65]])
def test_chunked_prefill_matches_fp64_recurrence(per_channel, lengths):
    torch.manual_seed(0)
    H, HV, K, V, T = 2, 4, 32, 32, sum(lengths)
    q, k = torch.randn(T, H, K), torch.randn(T, H, K)
    v = torch.randn(T, HV, V)
    g = -torch.rand(T, HV, K) * 0.5 if per_channel else -torch.rand(T, HV) * 0.5
    beta = torch.rand(T, HV)
    pool = torch.randn(5, HV, V, K) * 0.1
    start = pool.clone()
    idx = torch.tensor([3, 0, 1][: len(lengths)])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    scale = K ** -0.5
    out, h = gdn.recurrent_varlen(q, k, v, g, beta, pool, idx, cu, scale, True)
    n_h = 0
    for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        ref_o, ref_s, states = recurrence_fp64(start[idx[i]][None].double(), q[lo:hi, None].double(),
                                               k[lo:hi, None].double(), v[lo:hi, None].double(),
                                               g[lo:hi, None].double(), beta[lo:hi, None].double(),
                                               scale=scale, return_states=True)
        rel = (out[lo:hi] - ref_o[:, 0]).norm() / ref_o.norm()
        assert rel < 1e-5
        assert (pool[idx[i]] - ref_s[0]).norm() / ref_s.norm() < 1e-5
        # h: the state before each 64-token chunk of this sequence
        for j in range(0, hi - lo, gdn.CHUNK):
            want = start[idx[i]].double() if j == 0 else states[j - 1][0]
            assert (h[n_h] - want).norm() / want.norm() < 1e-5
            n_h += 1
    assert n_h == h.shape[0]


@pytest.mark.parametrize("all_layers", [False, True])
def test_track_copy_matches_sglang_triton_kernel(all_layers):
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as sglang_track

    from sglang_replayssm.cpu.decode import track_states_copy

    torch.manual_seed(0)
    conv = torch.randn(3, 9, 8, 3) if all_layers else torch.randn(9, 8, 3)
    ssm = torch.randn(3, 9, 2, 4, 4) if all_layers else torch.randn(9, 2, 4, 4)
    cache = torch.tensor([1, 4, -1, 6, 2], dtype=torch.int32)
    mask = torch.tensor([True, False, False, True, True])  # a padded row (-1) is never tracked
    track = torch.tensor([7, 8, 5, 3, 0], dtype=torch.int32)
    if all_layers:
        args = (cache, mask, track, 4, 3, (conv.stride(0), conv.stride(1)), (ssm.stride(0), ssm.stride(1)),
                conv[0, 0].numel(), ssm[0, 0].numel(), False)
    else:
        args = (cache, mask, track, 4, 1, (0, conv.stride(0)), (0, ssm.stride(0)), conv[0].numel(),
                ssm[0].numel(), False)
    want_conv, want_ssm = conv.clone(), ssm.clone()
    sglang_track._launch_track_mamba_states(want_conv, want_ssm, *args)
    track_states_copy(sglang_track._launch_track_mamba_states, conv, ssm, *args)
    assert torch.equal(conv, want_conv) and torch.equal(ssm, want_ssm)
    assert not torch.equal(conv, conv.clone().zero_())  # rows 0 and 3 were copied (row 4 is past batch_size)
