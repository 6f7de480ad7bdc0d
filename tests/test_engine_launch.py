"""`sglang.Engine(**kwargs)` on the CPU runtime, as a user's script calls it: no command line, so the
launch defaults come from the BEFORE hook on ``ServerArgs.resolve_once`` (cpu/launch_args.py).

Before it, ``Engine(model_path=<tiny-gdn>)`` on a machine without CUDA died in SGLang's resolution
(``RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available``).
Each Engine runs in its own script (spawned schedulers need a ``__main__`` guard) with the user's
environment (no CPU-runtime variables).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from tests.launch_cases import prompts
from tests.support.hf_reference import hf_greedy
from tests.support.serve import user_env

SCRIPT = '''
import json, sys

def main():
    import sglang
    model, ids, kwargs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    engine = sglang.Engine(model_path=model, **kwargs)
    try:
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 8, "temperature": 0.0,
                                                               "ignore_eos": True})
        print("RESULT " + json.dumps([o["output_ids"] for o in out]), flush=True)
    finally:
        engine.shutdown()

if __name__ == "__main__":
    main()
'''


def _engine(tmp_path: Path, model: Path, ids: list[list[int]], kwargs: dict) -> subprocess.CompletedProcess:
    script = tmp_path / "engine_script.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, str(script), str(model), json.dumps(ids), json.dumps(kwargs)],
                          env=user_env(), capture_output=True, text=True, timeout=900)


@pytest.mark.server
def test_engine_kwargs_get_the_cpu_defaults_and_serve_exactly(tmp_path):
    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    ids = prompts([100, 150])
    kwargs = {"dtype": "float32", "mamba_radix_cache_strategy": "no_buffer", "enable_linear_replayssm": True,
              "max_total_tokens": 16384, "max_mamba_cache_size": 64, "log_level": "warning"}
    proc = _engine(tmp_path, model, ids, kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result == hf_greedy(model, ids, 8, ignore_eos=True)
    for default in ("--device cpu (not given", "--attention-backend torch_native (not given",
                    "--disable-overlap-schedule (not given", "TRITON_INTERPRET=1 (not set"):
        assert default in proc.stderr, default


@pytest.mark.server
def test_engine_kwarg_the_cpu_runtime_cannot_serve_is_refused_in_one_line(tmp_path):
    model = make_models(names=["tiny-kda"], log=lambda *a: None)["tiny-kda"]
    proc = _engine(tmp_path, model, [[1, 2, 3]], {"attention_backend": "torch_native"})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-replayssm CPU runtime:") and "--attention-backend triton" in last, last
    assert "Traceback" not in proc.stderr
