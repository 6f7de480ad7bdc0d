"""The lab GPU serving check's CPU-side parts: its scripts parse, its tables render what the JSON holds,
its profile summary sorts kernels into families, and its shim stays out of the way without the lab switch."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab" / "gpu_serve"
sys.path.insert(0, str(LAB))

from lab_tables import tables  # noqa: E402
from profile_step import family, gpu_busy, host_frames, summarize_trace  # noqa: E402


@pytest.mark.parametrize("script", [ROOT / "scripts" / "gpu_serve.sh", LAB / "carry.sh"])
def test_scripts_parse(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_tables_show_each_stage() -> None:
    main = {"hit_rate": 0.5, "ceiling_hit_rate": 0.5, "ttft_p50_s": 0.04, "ttft_p90_s": 0.05, "e2e_p50_s": 0.1,
            "requests_failed": 0}
    kl = {"tokens": 8, "kl": 1e-3, "dlp_p50": 0.01, "dlp_p95": 0.1, "dlp_max": 0.2, "hit_at_expected": 2, "probes": 2,
          "replayssm_record_rebuilt_hits_total": 2.0}
    dec = {"concurrency": 64, "output_tok_s": 1000.0, "step_ms_p50": 3.0, "step_ms_p90": 4.0, "step_lines": 5}
    doc = {"model_path": "/m", "skipped": ["bf16-state"], "arms": {
        "baseline": {"stages": {"main": {"gsp": {**main, "ttft_p50_s": 0.08}, "ttft_floor": {"ttft_p50_s": 0.03}},
                                "decode": [dec]}},
        "plugin": {"stages": {"main": {"gsp": main, "ttft_floor": {"ttft_p50_s": 0.02}}, "kl": {"rebuilt": kl},
                              "decode": [{**dec, "output_tok_s": 1500.0}]}},
        "plugin-fp8": {"stages": {}, "error": "Capture cuda graph failed\nmore"}}}
    text = tables(doc)
    # TTFT above each arm's own floor: (40 - 20) / (80 - 30) = 0.40x
    assert "| plugin | 0.5000 | 0.5000 | 40.0 | 50.0 | 100.0 | 0.50x | 20.0 | 0.40x | 0 |" in text
    assert "| plugin | rebuilt | 8 | 0.001 |" in text and text.count("| 2 |") >= 1
    assert "| plugin | 64 | 1500 | 1.50x |" in text
    assert "- plugin-fp8 failed: Capture cuda graph failed" in text and "skipped (budget): bf16-state" in text


def test_profile_families_and_trace_summary(tmp_path: Path) -> None:
    assert family("void ring_step_kernel<4>(...)") == "plugin CUDA passes"
    assert family("ring_decode_kernel") == "plugin Triton"
    assert family("fused_recurrent_gated_delta_rule_fwd_kernel") == "SGLang linear attention"
    assert family("nvjet_sm90_tst_64x64") == "GEMM" and family("rmsnorm_something") == "other"
    events = [{"cat": "kernel", "name": "ring_step_kernel", "dur": 30.0, "ts": 0},
              {"cat": "kernel", "name": "nvjet_sm90_x", "dur": 10.0, "ts": 0},
              {"cat": "python_function", "name": "sglang_replayssm/radix/a.py(1): f", "ts": 0, "dur": 5, "tid": 1},
              {"cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 2, "tid": 1}]
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = summarize_trace(path, steps=2)
    assert s["kernel_us_per_step"] == 20.0 and s["linear_share"] == 0.75
    assert s["host_sync_sites_per_step"] == {"sglang_replayssm/radix/a.py(1): f": 0.5}


def test_host_frames_count_our_outermost_frames_once() -> None:
    def fr(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, object]:
        return {"cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}

    frames = {1: [fr("sglang/srt/managers/scheduler.py(1): run_batch", 0, 100),
                  fr("sglang_replayssm/radix/hooks.py(5): around", 10, 40),
                  fr("sglang_replayssm/radix/records.py(9): invalidate", 20, 10),  # nested in ours: not again
                  fr("sglang/srt/mem_cache/x.py(2): alloc", 25, 3),  # inside ours: not SGLang's
                  fr("sglang_replayssm/radix/records.py(9): invalidate", 60, 6)],
              2: [fr("sglang_replayssm/kernels/cursor.py(3): step", 0, 4, tid=2)]}
    h = host_frames(frames, steps=2)
    assert h["plugin_host_us_per_step"] == (40 + 6 + 4) / 2
    assert dict(h["plugin_host_frames"])["sglang_replayssm/radix/records.py(9): invalidate"] == 3.0
    assert dict(h["sglang_host_frames"]) == {"sglang/srt/managers/scheduler.py(1): run_batch": 50.0}


def test_gpu_busy_merges_overlapping_kernels() -> None:
    assert gpu_busy([(0, 10), (5, 12), (20, 25), (21, 22)]) == (17.0, 25.0)
    assert gpu_busy([]) == (0.0, 0.0)


def test_decode_ab_pairs_rounds_against_the_first_arm() -> None:
    from decode_ab import summarize, table

    s = summarize({"baseline": [4.0, 6.0, 5.0], "plugin": [2.0, 5.0, 4.0]}, concurrency=256)
    assert s["baseline"]["speedup_vs_first_median"] == 1.0
    assert s["plugin"]["step_ms_median"] == 4.0 and s["plugin"]["tok_s_median"] == 64000.0
    assert s["plugin"]["speedup_vs_first_median"] == 1.25 and s["plugin"]["speedup_vs_first_range"] == [1.2, 2.0]
    assert "| plugin | 64000 | 4.00 | 2.00 5.00 4.00 | 1.25x (1.20-2.00) |" in table(s, 256)


def test_shim_is_inert_without_the_lab_switch() -> None:
    code = "import sys, sitecustomize; print(any('Standin' in type(f).__name__ for f in sys.meta_path))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(LAB / "shim")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_main_ab_sends_turn_by_turn_and_pairs_requests_by_their_hits() -> None:
    from main_ab import compare, hits_allow, table

    from sglang_replayssm.bench.paired import send_order
    from sglang_replayssm.bench.records import RequestRecord
    from sglang_replayssm.bench.workload import Conversation, Turn

    convs = [Conversation(c, c, 0, tuple(Turn((100 * c + t + 1, 7, 8), 2) for t in range(turns)))
             for c, turns in ((0, 2), (1, 1), (2, 2))]
    assert [(c.cid, t) for c, t in send_order(convs)] == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]

    def rec(conv: Conversation, t: int, start: float, ttft: float, cached: int) -> RequestRecord:
        r = RequestRecord(conv.rid(t), conv.cid, t, conv.group, prompt_tokens=10, cached_tokens=cached)
        r.start_s, r.ttft_s, r.e2e_s, r.output_ids = start, ttft, ttft + 0.01, [5, 6]
        return r

    order = send_order(convs)
    base = [rec(c, t, i, 0.050, 0) for i, (c, t) in enumerate(order)]
    plug = [rec(c, t, i + 0.5, ttft, cached) for i, ((c, t), ttft, cached) in
            enumerate(zip(order, (0.9, 0.055, 0.052, 0.051, 0.060), (0, 0, 0, 8, 8)))]
    res = compare(convs, {"baseline": base, "plugin": plug})
    d = res["plugin"]["ttft_minus_first_arm"]
    assert res["plugin"]["first_ttft_ms"] == 900.0  # the first request is apart, not in the pairs
    assert d["all"]["n"] == 4 and d["same_hit"]["n"] == 2 and d["deeper_hit"]["n"] == 2
    assert d["same_hit"]["p50_ms"] == 3.5 and d["deeper_hit"]["p50_ms"] == 5.5
    assert res["baseline"]["ttft_minus_first_arm"]["all"]["p50_ms"] == 0.0
    assert res["plugin"]["hit_rate"] == 16 / 50
    assert (res["plugin"]["prefill_tokens"], res["plugin"]["prefill_tokens_p50"]) == (34, 10)  # 10+10+10+2+2
    assert res["baseline"]["prefill_tokens"] == 50
    assert "| plugin | 32.00% |" in table({"rag": {"arms": res}})
    allowed = hits_allow({"baseline": base, "plugin": plug})  # baseline's TTFT is flat: its hits allow 1.0x
    assert set(allowed) == {"plugin"} and allowed["plugin"]["bound_ratio"] == pytest.approx(1.0)
    assert allowed["plugin"]["measured_ratio"] == pytest.approx((0.9 + 0.055 + 0.052 + 0.051 + 0.060) / 0.25)
    assert "plugin: its hits allow 1.000x" in table({"rag": {"arms": res, "ttft_bound": allowed}})


def _topology(root: Path, siblings: dict[int, str]) -> Path:
    """A sysfs CPU tree whose cores have these ``thread_siblings_list`` texts."""
    for cpu, text in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text + "\n")
    return root


def test_pinned_servers_get_disjoint_equal_core_blocks_beside_the_client(tmp_path: Path) -> None:
    from decode_ab import core_blocks, pinned

    client, blocks = core_blocks(list(range(16)), 3, tmp_path / "none")  # no topology: every core its own
    assert client == [0] and blocks == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    with pytest.raises(SystemExit):
        core_blocks([0, 1], 2, tmp_path / "none")
    out = subprocess.run(pinned([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], [0]),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[0]"


def test_pinned_blocks_keep_smt_siblings_together(tmp_path: Path) -> None:
    """8 physical cores with two threads each, numbered as Linux does (core c: threads c and c + 8): the client gets
    one whole core, each of 3 servers two whole cores, and no physical core is split between two of them."""
    from decode_ab import core_blocks, physical_cores

    topo = _topology(tmp_path, {c: f"{c % 8},{c % 8 + 8}" for c in range(16)})
    assert physical_cores(list(range(16)), topo)[:2] == [[0, 8], [1, 9]]
    client, blocks = core_blocks(list(range(16)), 3, topo)
    assert client == [0, 8] and blocks == [[1, 2, 9, 10], [3, 4, 11, 12], [5, 6, 13, 14]]
    topo2 = _topology(tmp_path / "ranges", {c: "0-1" if c < 2 else f"{c}" for c in range(4)})
    assert physical_cores([0, 1, 2, 3], topo2) == [[0, 1], [2], [3]]


def test_bursts_larger_than_the_running_cap_are_skipped_with_the_reason(tmp_path: Path) -> None:
    """SGLang caps ``max_running_requests`` by the mamba slots and says so in its startup log: a burst larger than
    the cap never fills the batch, so it is skipped in one line instead of timing nothing."""
    from decode_ab import full_batches, running_cap

    log = tmp_path / "server.log"
    assert running_cap(log) is None
    log.write_text("max_running_requests is capped to 100 by the mamba state cache (max_mamba_cache_size=500, 5 state "
                   "slots per request).\nmax_total_num_tokens=336932, max_running_requests=100, context_len=32768\n")
    assert running_cap(log) == 100
    kept, why = full_batches(100, [256, 64])
    assert kept == [64] and "256" in why and "at most 100" in why
    assert full_batches(None, [256]) == ([256], "") and full_batches(256, [256, 64]) == ([256, 64], "")


def test_the_compile_log_writes_a_line_per_compiled_variant(tmp_path, monkeypatch) -> None:
    """``LAB_COMPILE_LOG``: Triton's cache hook never skips a compile; its post-compile hook logs the kernel by
    module and name with the time it took; without the variable nothing is installed."""
    import types

    from triton import knobs

    sys.path.insert(0, str(LAB / "shim"))
    import lab_compile_log

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.delenv("LAB_COMPILE_LOG", raising=False)
    lab_compile_log.install()
    assert knobs.runtime.jit_post_compile_hook is None
    monkeypatch.setenv("LAB_COMPILE_LOG", str(tmp_path / "c"))
    lab_compile_log.install()
    key = ("spec", 1)
    fn = types.SimpleNamespace(module="sglang.kernels.ops.mamba.causal_conv1d_triton", name="_causal_conv1d_fwd_kernel")
    assert knobs.runtime.jit_cache_hook(key=key, fn=fn, repr="x[num_warps=4](...)") is False
    knobs.runtime.jit_post_compile_hook(key=key, fn=fn, repr="x[num_warps=4](...)")
    (log,) = tmp_path.glob("c.*.txt")
    started, took, name, wall = log.read_text().strip().split("\t")
    assert float(started) >= 0 and float(took) >= 0 and abs(float(wall) - time.time()) < 60
    assert name == "sglang.kernels.ops.mamba.causal_conv1d_triton._causal_conv1d_fwd_kernel"


def test_serving_compiles_keeps_the_window_s_slow_builds_and_splits_ours_from_sglang_s(tmp_path) -> None:
    """Only lines inside the wall-time window that took ``min_ms`` or more count; the plugin's kernels apart."""
    sys.path.insert(0, str(LAB / "shim"))
    from lab_compile_log import serving_compiles

    (tmp_path / "c.11.txt").write_text("30.00\t300.0\tsglang.k.conv\t100.0\n"  # before the window
                                       "40.00\t233.5\tsglang_replayssm.kernels.materialize_triton.m\t150.0\n"
                                       "41.00\t3.1\tsglang_replayssm.kernels.cursor.c\t151.0\n"  # a cache load
                                       "42.00\t488.7\tsglang.srt.copy\t152.0\n")
    (tmp_path / "c.12.txt").write_text("9.00\t127.3\tsglang_replayssm.kernels.cursor.c\t160.0\n"
                                       "9.50\t50.0\tsglang.k.late\t300.0\n"  # after it
                                       "7.00\t90.0\told.format\n")  # no wall column: skipped
    got = serving_compiles(str(tmp_path / "c"), 120.0, 200.0)
    assert got == {"ours": [[233.5, "sglang_replayssm.kernels.materialize_triton.m"],
                            [127.3, "sglang_replayssm.kernels.cursor.c"]],
                   "sglang": [[488.7, "sglang.srt.copy"]]}
    assert serving_compiles(str(tmp_path / "none"), 0.0, 1e12) == {"ours": [], "sglang": []}
