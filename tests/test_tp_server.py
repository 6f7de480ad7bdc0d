"""Tensor parallel on the CPU runtime (cpu/launch_tp.py): the pieces, without servers.

Before cpu/launch_tp.py a `--tp 2` server died in PyNccl (`ValueError: Expected a cuda device, but got:
cpu`) and, on a 1-NUMA machine, on SGLang's thread-binding assert, unless the user knew to set
SGLANG_NCCL_SO_PATH and SGLANG_CPU_OMP_THREADS_BIND; DP attention died on a method only SGLang's AMX
attention backend has. The TP=2 server test shares its TP=1 server with the user-launch tests:
tests/test_user_launch.py::test_gdn_tp2_serves_the_tp1_tokens_and_prefix_hits.
"""

from __future__ import annotations

from pathlib import Path

from sglang_replayssm.cpu import launch_env, launch_tp


def test_rank_count_and_thread_groups():
    assert launch_tp.world_size(["--tp", "2"], launch_env.flag_value) == 2
    assert launch_tp.world_size(["--tp-size=2", "--dp", "2"], launch_env.flag_value) == 4
    assert launch_tp.world_size(["--tp", "2", "--dp", "2", "--enable-dp-attention"], launch_env.flag_value) == 2
    assert launch_tp.threads_bind(2, [1, 0]) == "0|1"
    assert launch_tp.threads_bind(2, [0, 1, 2, 3, 4]) == "0,1,2|3,4"
    assert launch_tp.threads_bind(4, [0, 1]) == "0|1|0|1"
    assert launch_tp.wanted(["--model-path", "m"], launch_env.flag_value) == {}


def test_pynccl_is_turned_off_however_it_is_passed():
    args, kwargs = launch_tp.no_pynccl("self", [[0, 1]], 0, "gloo", use_pynccl=True, use_mscclpp=False)
    assert kwargs["use_pynccl"] is False and args == ("self", [[0, 1]], 0, "gloo")
    args, kwargs = launch_tp.no_pynccl("self", [[0, 1]], 0, "gloo", True, False)
    assert args == ("self", [[0, 1]], 0, "gloo", False, False) and kwargs == {}


def test_tp_flags_reach_the_environment_the_package_sets(monkeypatch):
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
