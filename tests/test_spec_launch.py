"""CPU launch defaults for speculative decoding (cpu/launch_args.py): NEXTN gets SGLang's intel_amx
attention for target and draft and chain drafts; what the CPU runtime cannot serve is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_replayssm.cpu.launch_args import SPEC_ATTENTION, CPURuntimeArgsError, complete


def _model(tmp_path: Path, arch: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    return str(tmp_path)


def test_nextn_gets_intel_amx_attention_and_chain_drafts(tmp_path: Path) -> None:
    done = complete(["--model-path", _model(tmp_path, "Qwen3_5ForCausalLM"), "--speculative-algorithm", "NEXTN"])
    tail = done.argv[-len(SPEC_ATTENTION) - 2:]
    assert tail == [*SPEC_ATTENTION, "--speculative-eagle-topk", "1"]
    assert "--attention-backend" not in done.argv
    assert any("intel_amx" in note for note in done.notes)


def test_without_spec_the_defaults_are_unchanged(tmp_path: Path) -> None:
    done = complete(["--model-path", _model(tmp_path, "Qwen3_5ForCausalLM")])
    assert done.argv[-2:] == ["--attention-backend", "torch_native"]


@pytest.mark.parametrize(("extra", "arch", "match"), [
    (["--speculative-eagle-topk", "4"], "Qwen3_5ForCausalLM", "chain drafts only"),
    (["--attention-backend", "torch_native"], "Qwen3_5ForCausalLM", "intel_amx"),
    ([], "KimiLinearForCausalLM", "no draft source for Kimi-Linear"),
])
def test_refused_in_one_line(tmp_path: Path, extra: list[str], arch: str, match: str) -> None:
    with pytest.raises(CPURuntimeArgsError, match=match) as info:
        complete(["--model-path", _model(tmp_path, arch), "--speculative-algorithm", "NEXTN", *extra])
    assert "\n" not in str(info.value)
