"""Tensor parallel on the CPU runtime, launched as typed: `python -m sglang.launch_server ... --tp 2`.

Before cpu/launch_tp.py the TP=2 server died in PyNccl (`ValueError: Expected a cuda device, but got:
cpu`) and, on a 1-NUMA machine, on SGLang's thread-binding assert, unless the user knew to set
SGLANG_NCCL_SO_PATH and SGLANG_CPU_OMP_THREADS_BIND. One GDN server pair (TP=1, TP=2), ReplaySSM on,
extra_buffer, fp32: greedy tokens and per-request cached tokens must be equal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_cases import serve, user_flags

from sglang_replayssm.cpu import launch_tp
from sglang_replayssm.models import make_models
from sglang_replayssm.testing.serve import user_server

LENGTHS = [280, 600]  # the second hits the first's 256-token track


def _served(tmp_path_factory: pytest.TempPathFactory, tp: int) -> list[dict]:
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    log = tmp_path_factory.mktemp(f"tp{tp}") / "server.log"
    flags = user_flags("extra_buffer", True, "float32", ["--tp", str(tp)] if tp > 1 else [])
    with user_server(model, flags, log, timeout_s=900) as url:
        served = serve(url, LENGTHS)
    if tp > 1:
        text = log.read_text()
        assert "SGLANG_CPU_OMP_THREADS_BIND=" in text and "Traceback" not in text
    return served


@pytest.mark.server
def test_tp2_serves_the_tp1_tokens_and_prefix_hits(tmp_path_factory):
    tp1 = _served(tmp_path_factory, 1)
    tp2 = _served(tmp_path_factory, 2)
    assert [r["output_ids"] for r in tp2] == [r["output_ids"] for r in tp1]
    assert [r["cached_tokens"] for r in tp2] == [r["cached_tokens"] for r in tp1]
    assert tp2[1]["cached_tokens"] >= 256


def test_rank_count_and_thread_groups():
    assert launch_tp.world_size(["--tp", "2"]) == 2
    assert launch_tp.world_size(["--tp-size=2", "--dp", "2"]) == 4
    assert launch_tp.world_size(["--tp", "2", "--dp", "2", "--enable-dp-attention"]) == 2
    assert launch_tp.threads_bind(2, [1, 0]) == "0|1"
    assert launch_tp.threads_bind(2, [0, 1, 2, 3, 4]) == "0,1,2|3,4"
    assert launch_tp.threads_bind(4, [0, 1]) == "0|1|0|1"
    assert launch_tp.wanted(["--model-path", "m"]) == {}


def test_pynccl_is_turned_off_however_it_is_passed():
    args, kwargs = launch_tp.no_pynccl("self", [[0, 1]], 0, "gloo", use_pynccl=True, use_mscclpp=False)
    assert kwargs["use_pynccl"] is False and args == ("self", [[0, 1]], 0, "gloo")
    args, kwargs = launch_tp.no_pynccl("self", [[0, 1]], 0, "gloo", True, False)
    assert args == ("self", [[0, 1]], 0, "gloo", False, False) and kwargs == {}


def test_tp_flags_reach_the_environment_the_package_sets(monkeypatch):
    from sglang_replayssm.cpu import launch_env

    monkeypatch.setattr(launch_tp, "numa_nodes", lambda: 1)
    want = launch_env.wanted(["python", "-m", "sglang.launch_server", "--model-path", str(Path("/nonexistent")),
                              "--tp", "2"])
    assert want["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1


def test_dp_attention_patch_names_the_sglang_line_that_calls_it():
    import sglang

    from sglang_replayssm.cpu import hooks_launch

    (patch,) = hooks_launch.PATCHES
    attr = patch.target.rsplit(".", 1)[1]
    path, line = patch.at.rsplit(":", 1)
    source = (Path(sglang.__file__).parent.parent / path).read_text().splitlines()
    assert attr in source[int(line) - 1], patch.at
    assert launch_tp.cpu_graph_seq_len_fill_value(None) == 1
