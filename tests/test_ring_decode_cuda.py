"""The CUDA passes' build and selection rules (the kernels themselves are checked on the GPU in
tests/test_ring_decode_triton.py, engine="cuda", against the fp64 recurrence); on the GPU, the one-launch
build (``cuda_fused``) against the same recurrence and bit for bit against the two passes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from lab.kernels.ring_decode_research import ring_decode_research
from sglang_replayssm.kernels import naive
from sglang_replayssm.kernels import ring_decode_cuda as rdc
from sglang_replayssm.kernels.ring_decode import RingDecodeConfig
from tests.test_ring_decode_triton import GDN, KDA, _run

CUDA = torch.cuda.is_available()
#: register budgets of the one-launch builds checked (4: the non-flush pass's; 3: fewer spills in the flush items)
FUSED = [4, 3]
#: pick_config's CUDA launch at serving batch sizes (its build, DEFAULT_BUILD), forced at the small test batch
SERVING_CUDA = {"engine": "cuda", "cuda_warps": 2, "cuda_stages": 3, "cuda_flush_stages": 3, "cuda_flush_waves": 1,
                "cuda_tail": 4, "cuda_overlap": True}  # fmt: skip
#: launches checked two-pass vs one-launch at B=80, all of DEFAULT_BUILD's build (each other build is another
#: nvcc run on the GPU box): pick_config's, several items per warp, two warps per item, no tail
FUSED_VARIANTS = [
    {},
    {"cuda_waves": 1, "cuda_flush_waves": 1},
    {"cuda_vsplit": 2, "cuda_waves": 1, "cuda_flush_waves": 2, "cuda_tail": 0},
    {"cuda_warps": 4, "cuda_tail": 0, "cuda_flush_waves": 0, "cuda_overlap": False},
]
FUSED_IDS = ["serving", "waves", "vsplit2", "warps4"]


def test_missing_nvcc_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVCC", str(tmp_path / "no-such-nvcc"))
    with pytest.raises(rdc.CudaReadUnsupported, match="nvcc"):
        rdc.build("90a", 4, out_dir=tmp_path)
    assert not list(tmp_path.glob("*.so"))  # nothing half-written is left to be loaded later


def test_failing_nvcc_reports_its_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'error: this is not nvcc' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("NVCC", str(fake))
    with pytest.raises(RuntimeError, match="this is not nvcc"):
        rdc.build("90a", 4, out_dir=tmp_path / "cache")


def _fake_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    """``NVCC`` set to a script that writes ``output`` (shell words) into the object it is asked for."""
    fake = tmp_path / "nvcc"
    fake.write_text(f'#!/bin/sh\nfor a; do last="$prev"; prev="$a"; done\necho {output} > "$prev"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("NVCC", str(fake))


def test_cached_object_is_reused_without_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvcc(tmp_path, monkeypatch, "built")
    so = rdc.build("90a", 4, out_dir=tmp_path / "cache")
    assert so.read_text() == "built\n"
    monkeypatch.setenv("NVCC", str(tmp_path / "gone"))
    assert rdc.build("90a", 4, out_dir=tmp_path / "cache") == so  # cached: nvcc not needed
    with pytest.raises(rdc.CudaReadUnsupported):  # another register budget is another object
        rdc.build("90a", 3, out_dir=tmp_path / "cache")


def test_switch_off_and_no_cuda_mean_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_REPLAYSSM_CUDA_KERNELS", "0")
    assert not rdc.available()
    if not torch.cuda.is_available():
        monkeypatch.delenv("SGLANG_REPLAYSSM_CUDA_KERNELS")
        assert not rdc.available()


def test_supports_names_what_does_not_fit() -> None:
    f32 = torch.zeros(1)
    args = [f32] * 10 + [torch.zeros(1, dtype=torch.int32)]
    assert "CUDA device" in (rdc.supports(*args, 128, 128, 16) or "")


def test_info_names_the_ring_decode_path(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang_replayssm import info

    monkeypatch.setenv("SGLANG_REPLAYSSM_CUDA_KERNELS", "0")
    assert info.main([]) == 0
    assert "ring decode on CUDA: Triton (CUDA passes switched off" in capsys.readouterr().out
    monkeypatch.delenv("SGLANG_REPLAYSSM_CUDA_KERNELS")
    assert info.main([]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ring decode on CUDA:")]
    assert line and ("CUDA, one launch" in line[0] if torch.cuda.is_available() else "no CUDA device" in line[0])


def test_fused_build_is_another_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-launch option is part of the cache key and of nvcc's flags (default: off)."""
    _fake_nvcc(tmp_path, monkeypatch, '"$@"')
    plain = rdc.build("90a", 4, out_dir=tmp_path / "cache")
    fused = rdc.build("90a", 4, out_dir=tmp_path / "cache", fused=3)
    assert plain != fused and rdc.build("90a", 4, out_dir=tmp_path / "cache", fused=4) not in (plain, fused)
    assert "-DRR_FUSED" not in plain.read_text()
    assert "-DRR_FUSED=1" in fused.read_text() and "-DRR_FUSED_MIN_BLOCKS=3" in fused.read_text()
    with pytest.raises(ValueError, match="cuda_fused"):
        RingDecodeConfig(8, 1, 1, 1, True, engine="cuda", cuda_fused=-1)


@pytest.mark.skipif(not CUDA, reason="the one-launch build runs on the GPU only")
@pytest.mark.parametrize("io", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("fused", FUSED, ids=[f"fused{n}" for n in FUSED])
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_fused_matches_recurrence(is_kda: bool, fused: int, io: torch.dtype) -> None:
    """pick_config's serving launch in one launch: the two-pass tests' steps (natural and forced flushes, padded rows,
    rows outside the batch untouched) against the fp64 recurrence, at the two-pass tolerances."""
    tol = 1e-5 if io == torch.float32 else 5e-3
    _run(KDA if is_kda else GDN, is_kda, {**SERVING_CUDA, "cuda_fused": fused}, io, tol, seed=23)


@pytest.mark.skipif(not CUDA, reason="the one-launch build runs on the GPU only")
@pytest.mark.parametrize("kw", FUSED_VARIANTS, ids=FUSED_IDS)
@pytest.mark.parametrize("fused", FUSED, ids=[f"fused{n}" for n in FUSED])
@pytest.mark.parametrize("is_kda", [False, True], ids=["gdn", "kda"])
def test_fused_equals_two_passes(is_kda: bool, fused: int, kw: dict) -> None:
    """One step at B=80 with pick_config's launch (and variants; several items per warp under ``cuda_waves``),
    every cursor (natural flushes), some
    forced flushes and padded rows: the one launch writes exactly the two passes' out, checkpoint and ring."""
    s = dataclasses.replace(KDA if is_kda else GDN, B=80, slots=84)
    g = torch.Generator().manual_seed(29 + fused)
    dev = "cuda"
    state = (torch.randn(s.slots, s.HV, s.V, s.K, generator=g) * 0.05).to(dev)
    d = (torch.randn(s.slots, s.HV, s.L, s.V, generator=g) * 0.1).to(dev)
    k = naive.l2norm_fp64(torch.randn(s.slots, s.H, s.L, s.K, generator=g)).float().to(dev)
    gg = (-torch.rand((s.slots, s.HV, s.L, s.K) if is_kda else (s.slots, s.HV, s.L), generator=g) * 0.3).to(dev)
    rows = torch.randperm(s.slots, generator=g)[: s.B].to(torch.int32)
    rows[3] = rows[40] = -1
    wp = (torch.arange(s.B, dtype=torch.int32) % s.L).to(dev)  # 1 / L of the rows flush naturally
    ff = (torch.rand(s.B, generator=g) < 0.1).to(torch.int32).to(dev)
    qkv = torch.randn(s.B, 2 * s.H * s.K + s.HV * s.V, generator=g).to(dev)
    a = torch.randn((s.B, s.HV, s.K) if is_kda else (s.B, s.HV), generator=g).to(dev)
    b = torch.randn(s.B, s.HV, generator=g).to(dev)
    A_log = (torch.rand(s.HV, generator=g) * 0.5 - 0.5).to(dev)
    dt_bias = (torch.randn((s.HV, s.K) if is_kda else (s.HV,), generator=g) * 0.3).to(dev)
    got = []
    for n in (0, fused):
        bufs = [t.clone() for t in (state, d, k, gg)] + [torch.full((s.B, 1, s.HV, s.V), float("nan"), device=dev)]
        tuning = {"engine": "cuda", **kw, "cuda_fused": n}
        st_, d_, k_, g_, out_ = bufs
        ring_decode_research(qkv, a, b, A_log, dt_bias, s.K**-0.5, st_, d_, k_, g_, out_, rows.to(dev), wp, ff,
                             use_qk_l2norm_in_kernel=True, is_kda=is_kda, tuning=tuning)  # fmt: skip
        got.append(bufs)
    torch.cuda.synchronize()
    assert not got[1][4].isnan().any()
    for name, two, one in zip(["state", "d", "k", "g", "out"], got[0], got[1]):
        assert torch.equal(two, one), f"{name} differs between the two passes and the one launch"
    assert not torch.equal(got[1][0], state)  # some checkpoint was rewritten (a flush ran)
