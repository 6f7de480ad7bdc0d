"""The product's read-copy decode step on CUDA (radix/read_copy.decode_step with the CUDA passes: the
device-side stale refresh, then read_copy_decode_cuda) captured once in a CUDA graph and replayed over
staggered cursors, against the same step eager on CPU (torch reference and torch refresh) (GPU only).

Rows enter use stale in the middle of the run (a slot's checkpoint rewritten and its flag set between
replays, as the alloc / copy-on-write marks do), so the captured refresh has work in some replays."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.kernels.read_copy_format import alloc_read_copy
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from sglang_replayssm.radix.read_copy.store import ReadCopyLayer, decode_step

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

L, K, V = 16, 128, 128


def _layer(n: int, HV: int, fmt: str, device: str) -> ReadCopyLayer:
    copy, scales = alloc_read_copy(n, HV, V, K, fmt, False, device=device)  # type: ignore[arg-type]
    return ReadCopyLayer(copy=copy, scales=scales, d=torch.zeros(n, HV, L, V, device=device),
                         v=torch.zeros(n, HV, L, V, device=device), beta=torch.zeros(n, HV, L, device=device),
                         stale=torch.ones(n, dtype=torch.bool, device=device))  # fmt: skip


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_captured_step_equals_eager_reference(fmt: str) -> None:
    from sglang_replayssm.kernels.read_copy_cuda import read_copy_decode_cuda

    g = torch.Generator().manual_seed(3)
    B, H, HV, n = 8, 2, 4, 11
    slots = torch.arange(1, B + 1, dtype=torch.int32)
    state = torch.randn(n, HV, V, K, generator=g) * 0.05
    # rows start at staggered cursors, so their first records are live unwritten ones: zeros (k = 0,
    # g = 0, v = beta = 0) replay as no-ops on both paths (NaN here would poison both states)
    rings = [torch.zeros(n, H, L, K), torch.zeros(n, HV, L)]
    A_log, dt_bias = torch.randn(HV, generator=g) * 0.3, torch.randn(HV, generator=g) * 0.3
    T = 2 * L + 5
    qkv = torch.randn(T, B, 2 * H * K + HV * V, generator=g)
    a, b = torch.randn(T, B, HV, generator=g), torch.randn(T, B, HV, generator=g)
    wps = torch.stack([(torch.arange(B) + t) % L for t in range(T)]).to(torch.int32)  # staggered cursors
    fresh = {L + 2: (3, torch.randn(HV, V, K, generator=g) * 0.05)}  # slot 3 re-enters use mid-run

    def run(device: str, graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
        st, kr, gr = state.to(device, copy=True), *(r.to(device, copy=True) for r in rings)  # each run its own
        layer = _layer(n, HV, fmt, device)
        x, aa, bb, wp = (t[0].to(device, copy=True) for t in (qkv, a, b, wps))  # static inputs, refilled per step
        out = torch.zeros(B, 1, HV, V, device=device)
        idx, al, dt = slots.to(device).long() if device == "cpu" else slots.to(device), A_log.to(device), dt_bias.to(device)
        fn = read_copy_decode_cuda if device == "cuda" else read_copy_decode_torch

        def step() -> None:
            decode_step(fn, layer, x, aa, bb, al, dt, 0.25, st, kr, gr, out, idx, wp, None, False)

        outs = []
        cap = None
        for t in range(T):
            x.copy_(qkv[t]), aa.copy_(a[t]), bb.copy_(b[t]), wp.copy_(wps[t])
            if t in fresh:
                s, new = fresh[t]
                st[s] = new.to(device)
                layer.stale[s] = True
                wp[s - 1] = 0  # its row restarts an empty ring
                wps[t + 1:, s - 1] = torch.arange(1, T - t) % L
            if graph and cap is None:
                step()  # compile and warm up outside the capture (this is step 0)
                torch.cuda.synchronize()
                cap = torch.cuda.CUDAGraph()
                saved = (st.clone(), layer.copy.clone(), layer.d.clone(), layer.v.clone(), layer.beta.clone(),
                         layer.stale.clone(), kr.clone(), gr.clone())  # fmt: skip
                with torch.cuda.graph(cap):
                    step()
                for dst, src in zip((st, layer.copy, layer.d, layer.v, layer.beta, layer.stale, kr, gr), saved):
                    dst.copy_(src)  # capture runs nothing, but restore to be exact about it
            elif cap is not None:
                cap.replay()
            else:
                step()
            outs.append(out.clone().cpu())
        return torch.stack(outs), st.cpu()

    wps_saved = wps.clone()
    ref_out, ref_state = run("cpu", False)
    wps.copy_(wps_saved)
    got_out, got_state = run("cuda", True)
    assert float((got_state - ref_state).norm() / ref_state.norm()) <= 1e-5  # flushed checkpoints: fp32
    err = (got_out - ref_out).norm(dim=-1) / ref_out.norm(dim=-1).clamp_min(1e-30)
    assert float(err.max()) <= (1e-2 if fmt == "bf16" else 4e-2)
    assert float(err.median()) <= 1e-3
