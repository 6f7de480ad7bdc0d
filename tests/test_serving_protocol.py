"""The serving protocol's building blocks (tests/support/serving_protocol.py, lab/scripts/bench_serving_protocol.py)
at tiny shapes on CPU (Triton interpreted; compiled on a GPU): staggered cursors; the interleaved step sequence
over distinct layer pools equals each layer run alone through the torch reference, for the fp32 ring and the
read copy (stale refresh included, records carved out of the fp32 ring); vLLM's packed decode (when its carry is
built) against the fp64 recurrence; the batch statistics."""

from __future__ import annotations

import copy as copymod
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_replayssm.kernels import naive
from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
from sglang_replayssm.kernels.read_copy_refresh import refresh_stale_torch
from sglang_replayssm.kernels.ring_decode import ring_decode
from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
from tests.support.serving_protocol import (
    ARMS,
    FUSED_MIN_BLOCKS,
    Shape,
    Stack,
    arm_step,
    ring_decode_fused,
    stats,
    window,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".gpucarry" / "vllm_fla"


def _shape(is_kda: bool, layers: int = 2) -> Shape:
    return Shape(H=1, HV=1 if is_kda else 2, K=32, V=32, is_kda=is_kda, B=4, L=4, layers=layers)


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))


def _recorded(stack: Stack, step: object) -> tuple[list[tuple[int, torch.Tensor]], object]:
    """``step`` wrapped to record (layer, output) after each call, in call order."""
    seen: list[tuple[int, torch.Tensor]] = []

    def rec(i: int) -> None:
        step(i)  # type: ignore[operator]
        seen.append((i, stack.out[i].clone()))

    return seen, rec


def test_staggered_cursors() -> None:
    s = _shape(False)
    st = Stack(s, ARMS["ours_fp32"], DEV, io=torch.float32)
    start = st.write_pos.clone()
    rows = torch.arange(s.B, device=DEV)
    for t in range(2 * s.L + 1):
        st.cursor()
        assert torch.equal(st.wp.long(), (rows + t) % s.L), t
        assert int(st.ff.abs().sum()) == 0  # the mask is built, never fires
        if t % s.L == s.L - 1:
            assert torch.equal(st.write_pos, start)  # a window brings every cursor back
    assert int(st.write_pos[0]) == 0  # the padding slot is no row's


@pytest.mark.parametrize(
    ("arm", "is_kda"), [("ours_fp32", False), ("ours_fp32", True), ("ours_fp32_fused", False)],
    ids=["gdn", "kda", "gdn-fused-arm"],
)
def test_interleaved_fp32_ring_equals_each_layer_alone(arm: str, is_kda: bool) -> None:
    s = _shape(is_kda)
    st = Stack(s, ARMS[arm], DEV, io=torch.float32, seed=3)
    ref = copymod.deepcopy(st)
    assert st.state[0].data_ptr() != st.state[1].data_ptr() and not torch.equal(st.qkv[0], st.qkv[1])
    kernels: dict[str, Callable[..., Any]] = {"ring_decode": ring_decode, "ring_decode_fused": ring_decode_fused(FUSED_MIN_BLOCKS["ring_decode_fused"])}
    seen, step = _recorded(st, arm_step(st, kernels))
    window(st, step)()  # type: ignore[arg-type]
    assert [i for i, _ in seen] == list(range(s.layers)) * s.L  # interleaved: every layer each step, in order
    rows = torch.arange(s.B, device=DEV)
    for i in range(s.layers):  # each layer alone, cursors by formula, through the torch reference
        for t in range(s.L):
            wp = ((rows + t) % s.L).to(torch.int32)
            ring_decode_torch(ref.qkv[i], ref.a[i], ref.b[i], ref.A_log[i], ref.dt_bias[i], ref.scale, ref.state[i],
                              ref.d[i], ref.k[i], ref.g[i], ref.out[i], ref.slots, wp, torch.zeros_like(wp),
                              use_qk_l2norm_in_kernel=True, is_kda=is_kda)  # fmt: skip
            assert _rel(seen[t * s.layers + i][1], ref.out[i]) < 1e-5, (i, t)
    for name in ("state", "d", "k", "g"):
        assert _rel(getattr(st, name), getattr(ref, name)) < 1e-5, name


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_interleaved_read_copy_equals_each_layer_alone(fmt: str) -> None:
    s = _shape(False)
    st = Stack(s, ARMS[f"copy_{fmt}"], DEV, io=torch.bfloat16, seed=5)
    assert st.copy is not None
    d_rec, v_rec = st.copy[2], st.copy[3]
    lo, hi = st.d.data_ptr(), st.d.data_ptr() + st.d.numel() * st.d.element_size()
    assert lo <= d_rec.data_ptr() < v_rec.data_ptr() < hi  # d~ / v carved out of the fp32 d ring
    ref = copymod.deepcopy(st)
    seen, step = _recorded(st, arm_step(st, {"read_copy_decode": read_copy_decode_torch}))
    window(st, step)()  # type: ignore[arg-type]
    rows = torch.arange(s.B, device=DEV)
    assert ref.copy is not None
    for i in range(s.layers):
        lay = ref.copy_layer(i)
        for t in range(s.L):
            wp = ((rows + t) % s.L).to(torch.int32)
            refresh_stale_torch(ref.state[i], lay.copy, lay.scales, lay.stale, ref.slots)
            read_copy_decode_torch(ref.qkv[i], ref.a[i], ref.b[i], ref.A_log[i], ref.dt_bias[i], ref.scale,
                                   ref.state[i], lay.copy, lay.scales, lay.d, ref.k[i], ref.g[i], lay.v, lay.beta,
                                   ref.out[i], ref.slots, wp, torch.zeros_like(wp), use_qk_l2norm_in_kernel=True,
                                   is_kda=False)  # fmt: skip
            assert torch.equal(seen[t * s.layers + i][1], ref.out[i]), (i, t)
    assert not bool(st.copy[5][:, 1:].any())  # every row refreshed once, then read
    for name in ("state", "d", "k", "g"):
        assert torch.equal(getattr(st, name), getattr(ref, name)), name
    for a, b in zip(st.copy, ref.copy, strict=True):
        if a is None or b is None:
            assert a is None and b is None
        else:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.skipif(not (CARRY / "MODULE").is_file(), reason="no vLLM carry (bash lab/scripts/vllm_carry.sh)")
def test_vllm_packed_decode_matches_fp64() -> None:
    from tests.support.vllm_fla import load_vllm_packed_decode

    s = Shape(H=2, HV=4, K=32, V=32, is_kda=False, B=3, L=2, layers=2)
    st = Stack(s, ARMS["vllm_packed_fp32"], DEV, io=torch.float32, seed=7)
    truth = st.state.double().clone()
    seen, step = _recorded(st, arm_step(st, {"vllm_packed": load_vllm_packed_decode(CARRY)}))
    window(st, step)()  # type: ignore[arg-type]
    for t in range(s.L):
        for i in range(s.layers):
            o, new, *_ = naive.packed_step_fp64(truth[i, 1:], st.qkv[i].double(), st.a[i].double(), st.b[i].double(),
                                                st.A_log[i].double(), st.dt_bias[i].double(), num_k_heads=s.H,
                                                is_kda=False, scale=st.scale)  # fmt: skip
            truth[i, 1:] = new
            assert _rel(seen[t * s.layers + i][1][:, 0], o) < 1e-5, (t, i)
    assert _rel(st.state, truth) < 1e-5
    assert torch.equal(st.state[:, 0].double(), truth[:, 0])  # slot 0 (padding) untouched


def test_stats_by_hand() -> None:
    got = stats([float(x) for x in range(1, 11)], per=2)
    assert got["median"] == 2.75 and got["p90"] == 4.5 and got["min"] == 0.5 and got["max"] == 5.0
    assert got["p90_over_median"] == pytest.approx(4.5 / 2.75) and got["n"] == 10


@pytest.mark.parametrize("script", ["lab/scripts/gpu_serving_protocol.sh", "lab/scripts/vllm_carry.sh",
                                    "lab/gpu_serve/install_carry.sh", "lab/scripts/ring_sweep_carry.sh"])
def test_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(ROOT / script)], check=True)


def test_ring_config_sweep_parses_configs() -> None:
    """lab/scripts/bench_ring_configs.py: configs name real fields, bools stay bools (the build's .so name and
    cache key depend on it), and a typo is refused before any GPU work."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ring_configs", ROOT / "lab/scripts/bench_ring_configs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parse_config("b=warps:1,stages:4,bulk:1") == ("b", {"warps": 1, "stages": 4, "bulk": 1})
    name, got = mod.parse_config("c=fmt:fp8,read_warps:1,flush_prefetch:1", copy=True)
    assert (name, got) == ("c", {"fmt": "fp8", "read_warps": 1, "flush_prefetch": True})
    assert isinstance(got["flush_prefetch"], bool) and not isinstance(got["read_warps"], bool)
    for bad, copy in (("x=wraps:1", False), ("x=bulk:1", True), ("x=fmt:fp4", True), ("x", False)):
        with pytest.raises(ValueError):
            mod.parse_config(bad, copy=copy)
