"""Servers launched as a user would: plain `python -m sglang.launch_server --model-path <embedded model>`
with only user flags (no launcher environment, no --device, no attention backend), on the CPU runtime.

The covering CI subset of issue 17 (the whole matrix: tests/test_launch_matrix.py): each dtype, each
model, each crash of SGLang 0.5.23 + the plugin before the package applied the CPU runtime itself:

* tiny-gdn + extra_buffer at --dtype auto (float16) and float32: `Index put requires the source and
  destination dtypes match` at the first prompt past the 64-token chunk grid (conv pool bf16);
* tiny-kda at float16: `expected scalar type Float but found Half` (Kimi's fused_fg_b_proj at fp32);
* tiny-kda at float32: `Expected size for first two dimensions of batch2 tensor to be: [4, 64] but got:
  [4, 288]` (SGLang's torch_native MLA extend, the CPU default attention backend).

* tiny-gdn at bfloat16: served, ReplaySSM on vs off within bf16's tolerance (bf16 was refused before
  the Triton interpreter's bf16 dot was fixed, cpu/interpret_bf16.py; its unit tests are
  tests/test_interpret_bf16.py, the KDA bf16 servers are in the matrix);
* a user-set SGLANG_MAMBA_CONV_DTYPE that disagrees with the served dtype under extra_buffer: refused in
  one line (it crashed at the first tracked prefill).
Each server serves its prompts once (module-scoped fixture) and is stopped before the next starts.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm.cpu import hooks_dtype, hooks_launch, launch_args, launch_env
from sglang_replayssm.models import make_models
from tests.launch_cases import TOLERANCE, differences, serve, user_flags
from tests.support.hf_reference import hf_greedy
from tests.support.serve import user_env, user_server

LENGTHS = [280, 600]  # past the 64-token chunk grid and SGLang's 256-token track interval


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return make_models(names=["tiny-gdn", "tiny-kda"], log=lambda *a: None)


def _served(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, model: str, flags: list[str]) -> list[dict]:
    log = tmp_path_factory.mktemp(model) / "server.log"
    with user_server(models[model], flags, log, timeout_s=600) as url:
        return serve(url, LENGTHS)


@pytest.fixture(scope="module")
def gdn_fp16_extra_ring(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", True))


@pytest.fixture(scope="module")
def gdn_fp16_extra_plain(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", False))


@pytest.fixture(scope="module")
def gdn_fp32_extra_ring(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", True, "float32"))


@pytest.fixture(scope="module")
def gdn_fp32_extra_ring_tp2(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", True, "float32", ["--tp", "2"]))


@pytest.fixture(scope="module")
def gdn_bf16_extra_ring(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", True, "bfloat16"))


@pytest.fixture(scope="module")
def gdn_bf16_extra_plain(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-gdn", user_flags("extra_buffer", False, "bfloat16"))


@pytest.fixture(scope="module")
def kda_fp16_no_buffer_ring(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-kda", user_flags("no_buffer", True))


@pytest.fixture(scope="module")
def kda_fp32_extra_plain(models, tmp_path_factory):
    return _served(models, tmp_path_factory, "tiny-kda", user_flags("extra_buffer", False, "float32"))


def _hf(model_dir: Path) -> list[list[int]]:
    from tests.launch_cases import NEW_TOKENS, prompts

    return hf_greedy(model_dir, prompts(LENGTHS), NEW_TOKENS, ignore_eos=True)


@pytest.mark.server
def test_gdn_fp16_extra_buffer_serves_with_prefix_hits(gdn_fp16_extra_ring):
    """Crash 1 at --dtype auto: every request served; the 600-token prompt hits the 256-token track."""
    assert [len(r["output_ids"]) for r in gdn_fp16_extra_ring] == [12, 12]
    assert gdn_fp16_extra_ring[1]["cached_tokens"] >= 256


@pytest.mark.server
def test_gdn_fp16_replayssm_on_off_agree_within_fp16(gdn_fp16_extra_ring, gdn_fp16_extra_plain):
    assert differences(gdn_fp16_extra_ring, gdn_fp16_extra_plain, TOLERANCE["float16"]) == []


@pytest.mark.server
def test_gdn_fp32_extra_buffer_ring_equals_hf(models, gdn_fp32_extra_ring):
    """Crash 1 at float32 (`... and Float for the source`): served, and token-exact against HF."""
    assert [r["output_ids"] for r in gdn_fp32_extra_ring] == _hf(models["tiny-gdn"])
    assert gdn_fp32_extra_ring[1]["cached_tokens"] >= 256


@pytest.mark.server
def test_gdn_bf16_serves_and_replayssm_on_off_agree_within_bf16(gdn_bf16_extra_ring, gdn_bf16_extra_plain):
    """bfloat16 used to be refused at startup; now served, with prefix hits, on within bf16 of off."""
    assert [len(r["output_ids"]) for r in gdn_bf16_extra_ring] == [12, 12]
    assert gdn_bf16_extra_ring[1]["cached_tokens"] >= 256
    assert differences(gdn_bf16_extra_ring, gdn_bf16_extra_plain, TOLERANCE["bfloat16"]) == []


@pytest.mark.server
def test_gdn_tp2_serves_the_tp1_tokens_and_prefix_hits(gdn_fp32_extra_ring, gdn_fp32_extra_ring_tp2):
    """`--tp 2` as typed (cpu/launch_tp.py; before: PyNccl `Expected a cuda device, but got: cpu`, then
    SGLang's thread-binding assert on a 1-NUMA box): the TP=1 server's tokens and cached tokens."""
    assert [r["output_ids"] for r in gdn_fp32_extra_ring_tp2] == [r["output_ids"] for r in gdn_fp32_extra_ring]
    assert [r["cached_tokens"] for r in gdn_fp32_extra_ring_tp2] == [r["cached_tokens"] for r in gdn_fp32_extra_ring]


@pytest.mark.server
def test_kda_fp16_serves(kda_fp16_no_buffer_ring):
    """Crash 2 (`expected scalar type Float but found Half`): the server starts (warmup) and serves."""
    assert [len(r["output_ids"]) for r in kda_fp16_no_buffer_ring] == [12, 12]


@pytest.mark.server
def test_kda_fp32_extra_buffer_equals_hf(models, kda_fp32_extra_plain):
    """Crash 3 (torch_native MLA extend, `[4, 64] but got: [4, 288]`): served, exact against HF."""
    assert [r["output_ids"] for r in kda_fp32_extra_plain] == _hf(models["tiny-kda"])
    assert kda_fp32_extra_plain[1]["cached_tokens"] >= 256


REFUSED = [
    ("tiny-kda", ["--attention-backend", "torch_native"], {}, "an MLA model", "--attention-backend triton"),
    # Before the refusal this server started and crashed at the first prompt past the chunk grid
    # (`Index put requires the source and destination dtypes match`).
    ("tiny-gdn", ["--mamba-radix-cache-strategy", "extra_buffer"], {"SGLANG_MAMBA_CONV_DTYPE": "bfloat16"},
     "SGLANG_MAMBA_CONV_DTYPE=bfloat16 differs from the served dtype float16", "set it to float16"),
]


@pytest.mark.server
@pytest.mark.parametrize(("model", "flags", "env", "what", "fix"), REFUSED, ids=["kda-torch-native-mla", "gdn-conv-dtype"])
def test_unservable_flag_is_refused_in_one_line(models, model, flags, env, what, fix):
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(models[model]), *flags]
    proc = subprocess.run(cmd, env=user_env(env=env), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-replayssm") and what in last and fix in last, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_launch_env_only_in_a_server_main_process(monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    assert launch_env.is_server_launch(["python", "-m", "sglang.launch_server", "--model-path", "m"])
    assert launch_env.is_server_launch(["/v/bin/python", "/v/bin/sglang", "serve", "--model-path", "m"])
    assert not launch_env.is_server_launch(["python", "-m", "pytest"])
    assert not launch_env.is_server_launch(["python", "-c", "from multiprocessing.spawn import spawn_main"])
    want = launch_env.wanted(["python", "-m", "sglang.launch_server", "--model-path", str(tmp_path)])
    assert want == {"SGLANG_USE_CPU_ENGINE": "1", "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    assert "HF_HUB_OFFLINE" not in launch_env.wanted(["--model-path", "org/hub-model"])
    assert not launch_env.plugin_selected({"SGLANG_PLUGINS": "replayssm_radix"})


def test_flag_defaults_and_refusals(models):
    gdn, kda = str(models["tiny-gdn"]), str(models["tiny-kda"])
    done = launch_args.complete(["--model-path", gdn, "--mamba-radix-cache-strategy", "no_buffer"])
    assert done.argv[4:] == ["--device", "cpu", "--disable-cuda-graph", "--attention-backend", "torch_native",
                             "--disable-overlap-schedule"]
    assert len(done.notes) == 4
    done = launch_args.complete(["--model-path", kda, "--device", "cpu", "--attention-backend", "triton"])
    assert done.argv[6:] == ["--disable-cuda-graph", "--decode-attention-backend", "torch_native"]
    user = ["--model-path", gdn, "--device", "cpu", "--disable-cuda-graph", "--attention-backend=triton"]
    assert launch_args.complete(user).argv == user
    for bad, flag in ((["--device", "cuda"], "--device cuda"), (["--attention-backend", "fa3"], "--attention-backend fa3"),
                      (["--decode-attention-backend", "triton"], "--decode-attention-backend torch_native")):
        with pytest.raises(launch_args.CPURuntimeArgsError, match=flag):
            launch_args.complete(["--model-path", kda, *bad])


@pytest.mark.parametrize("hook", hooks_dtype.HOOKS + hooks_launch.HOOKS, ids=lambda h: h.name)
def test_launch_and_dtype_hooks_name_their_sglang_def_line(hook):
    """The records of cpu/hooks_dtype.py and cpu/hooks_launch.py, checked like tests/test_hook_table.py."""
    import inspect

    import sglang

    from sglang_replayssm import hook_table

    original = inspect.unwrap(hook_table.live_attr(hook.target))
    path, line = hook.at.rsplit(":", 1)
    assert inspect.getsourcefile(original) == str(Path(sglang.__file__).parent.parent / path)
    lines, first = inspect.getsourcelines(original)
    assert first + next(i for i, t in enumerate(lines) if t.lstrip().startswith("def ")) == int(line), hook.at


def test_decode_probe_exists_only_under_its_switch(tmp_path):
    code = "from sglang_replayssm.cpu import decode_probe as p; print(p.PROBE is None)"
    off = subprocess.run([sys.executable, "-c", code], env=user_env(), capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "True"
    prefix = tmp_path / "trace"
    code += "; p.PROBE.call('gdn', True, 2); print(p.PROBE.path.name)"
    on = subprocess.run([sys.executable, "-c", code], env=user_env(env={"SGLANG_REPLAYSSM_RING_TRACE": str(prefix)}),
                        capture_output=True, text=True, check=True)
    assert on.stdout.split()[0] == "False"
    from tests.support.decode_trace import trace_files

    assert [f.name for f in trace_files(prefix)] == [on.stdout.split()[1]]  # trace.<pid>.jsonl


def test_conv_pool_and_batched_linear_follow_the_serving_dtype(monkeypatch):
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2StateDType

    monkeypatch.delenv("SGLANG_MAMBA_CONV_DTYPE", raising=False)
    sglang_default = Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32)
    monkeypatch.setattr(hooks_dtype, "_serving_dtype", None)
    assert hooks_dtype.conv_dtype_follows_model(lambda c: sglang_default) == sglang_default
    hooks_dtype.record_serving_dtype(torch.float16, {}, "auto")
    assert hooks_dtype.conv_dtype_follows_model(lambda c: sglang_default).conv == torch.float16
    monkeypatch.setenv("SGLANG_MAMBA_CONV_DTYPE", "bfloat16")  # the user's choice wins
    assert hooks_dtype.conv_dtype_follows_model(lambda c: sglang_default).conv == torch.bfloat16

    class Batched:
        weight = torch.randn(2, 8, 4)

    x = torch.randn(2, 3, 4).half()
    with pytest.raises(RuntimeError):
        torch.bmm(x, Batched.weight.transpose(-1, -2))  # SGLang's forward at a mismatch
    y = hooks_dtype.batched_linear_forward(None, Batched(), x)
    assert y.dtype == torch.float16
    assert torch.allclose(y.float(), torch.bmm(x.float(), Batched.weight.transpose(-1, -2)), rtol=2e-3, atol=2e-3)


def test_conv_dtype_refusal_only_where_sglang_would_crash():
    import torch

    refuse = hooks_dtype.conv_dtype_refusal
    assert refuse(None, "extra_buffer", torch.float16) is None  # the package picks the serving dtype
    assert refuse("float16", "extra_buffer", torch.float16) is None
    assert refuse("bfloat16", "no_buffer", torch.float16) is None  # conv kernels cast on write
    message = refuse("bfloat16", "extra_buffer_lazy", torch.float32)
    assert message is not None and "set it to float32" in message and "\n" not in message


def test_engine_fields_get_the_same_defaults_as_the_command_line(models):
    class Record:  # the ServerArgs fields complete_fields reads, at SGLang's defaults
        model_path, device, dtype, mamba_radix_cache_strategy = str(models["tiny-kda"]), None, "auto", "no_buffer"
        attention_backend = prefill_attention_backend = decode_attention_backend = None
        disable_cuda_graph = disable_overlap_schedule = False

    record = Record()
    notes = launch_args.complete_fields(record)
    assert (record.device, record.attention_backend, record.decode_attention_backend) == ("cpu", "triton", "torch_native")
    assert record.disable_cuda_graph and record.disable_overlap_schedule and len(notes) == 5
    assert launch_args.complete_fields(record) == []  # a completed record gets nothing more
    record.decode_attention_backend = "triton"
    with pytest.raises(launch_args.CPURuntimeArgsError, match="--decode-attention-backend torch_native"):
        launch_args.complete_fields(record)
