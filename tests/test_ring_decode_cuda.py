"""The CUDA passes' build and selection rules (the kernels themselves are checked on the GPU in
tests/test_ring_decode_triton.py, engine="cuda", against the fp64 recurrence)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_replayssm.kernels import ring_decode_cuda as rdc


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


def test_cached_object_is_reused_without_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvcc"
    fake.write_text('#!/bin/sh\nfor a; do last="$prev"; prev="$a"; done\necho built > "$prev"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("NVCC", str(fake))
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
    assert line and ("CUDA passes" in line[0] if torch.cuda.is_available() else "no CUDA device" in line[0])
