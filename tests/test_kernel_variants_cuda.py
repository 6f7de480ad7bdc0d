"""The plugin's Triton kernels launched outside CUDA-graph capture at per-step row counts (the cursor step, the
materialize fold) compile one variant for every row count: Triton would otherwise compile apart a count of 1, one
divisible by 16 and any other, each 0.1-0.5 s the scheduler waits at a serving step (CUDA only)."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels import cursor, materialize_triton
from sglang_replayssm.kernels.materialize_ref import check_materialize_args, materialize_torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROW_COUNTS = (1, 2, 16, 17, 33, 40)


def _variants(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_the_cursor_step_compiles_one_variant_for_every_row_count():
    dev = torch.device("cuda")
    buf = torch.randint(0, 16, (64,), dtype=torch.int32, device=dev)
    seen = []
    for n in ROW_COUNTS:
        slots = torch.randperm(63, device=dev)[:n].to(torch.int64) + 1
        seq_lens = torch.randint(1, 500, (n,), device=dev)
        want_buf = buf.clone()
        want = cursor.cursor_step_torch(want_buf, slots, 16, seq_lens=seq_lens, track_interval=64)
        got = cursor.cursor_step_triton(buf, slots, 16, seq_lens=seq_lens, track_interval=64)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(buf, want_buf)
        seen.append(_variants(cursor._cursor_step_kernel))
    assert seen == [seen[0]] * len(seen), f"variants after row counts {ROW_COUNTS}: {seen}"


def test_the_materialize_fold_compiles_one_variant_for_every_row_count():
    dev, gen = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(5)
    n_layers, slots, H, HV, K, V, L = 2, 96, 2, 4, 32, 32, 16
    temporal = torch.randn(n_layers, slots, HV, V, K, device=dev, generator=gen)
    ring_d = torch.randn(n_layers, slots, HV, L, V, device=dev, generator=gen)
    ring_k = torch.randn(n_layers, slots, H, L, K, device=dev, generator=gen)
    ring_g = -torch.rand(n_layers, slots, HV, L, device=dev, generator=gen)
    seen = []
    for n in ROW_COUNTS:
        perm = torch.randperm(slots, device=dev, generator=gen)
        src, dst = perm[:n], perm[48:48 + n]
        counts = torch.randint(0, L + 1, (n,), device=dev, generator=gen)
        want = temporal.clone()
        materialize_torch(check_materialize_args(want, ring_d, ring_k, ring_g, src, dst, counts, is_kda=False))
        materialize_triton.materialize_triton(
            check_materialize_args(temporal, ring_d, ring_k, ring_g, src, dst, counts, is_kda=False))
        torch.testing.assert_close(temporal, want, rtol=1e-5, atol=1e-5)
        seen.append(_variants(materialize_triton.materialize_kernel))
    assert seen == [seen[0]] * len(seen), f"variants after row counts {ROW_COUNTS}: {seen}"
