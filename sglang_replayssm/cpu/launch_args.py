"""Server flags on the CPU runtime: defaults for what the user did not pass, one-line refusals otherwise.

Applied in the server's main process to the command line SGLang is about to parse (a BEFORE hook on
`sglang.srt.server_args.prepare_server_args`, registered by cpu/hooks_launch.py), so a plain
`python -m sglang.launch_server --model-path <dir>` on a machine without CUDA gets:

* ``--device cpu`` (the only device there; another one is refused);
* ``--disable-cuda-graph`` (no CUDA graphs without CUDA);
* attention backends the CPU runtime runs: ``torch_native`` for GQA/MHA models; for MLA models
  (Kimi-Linear) SGLang's Triton extend attention for prefill (interpreted) and ``torch_native``
  for decode, since SGLang's torch_native MLA extend fails on these head shapes (``Expected size for
  first two dimensions of batch2 tensor to be: [4, 64] but got: [4, 288]``) and its Triton MLA decode
  cannot be interpreted. A backend the CPU runtime cannot run is refused naming the flag;
* ``--disable-overlap-schedule`` with ``--mamba-radix-cache-strategy no_buffer`` (SGLang asserts
  otherwise);

Every default is logged once, in one line each. Flags inside a ``--config`` YAML count as passed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from sglang_replayssm.cpu.launch_env import flag_value

logger = logging.getLogger("sglang_replayssm")

PREFIX = "sglang-replayssm CPU runtime:"
#: Attention backends the CPU runtime can run (torch_native in torch, triton under TRITON_INTERPRET).
CPU_ATTENTION = ("torch_native", "triton", "intel_amx")


class CPURuntimeArgsError(SystemExit):
    """A flag the CPU runtime cannot serve: a SystemExit, so the launcher prints exactly this one line
    (no traceback) and exits 1, like argparse's own errors."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{PREFIX} {message}")

    def __str__(self) -> str:
        return str(self.code)


@dataclass
class Completed:
    """The command line SGLang will parse and the defaults added to it (one note per default)."""

    argv: list[str]
    notes: list[str] = field(default_factory=list)

    def add(self, flags: list[str], why: str) -> None:
        self.argv += flags
        self.notes.append(f"{' '.join(flags)} (not given; {why})")


def passed(argv: Sequence[str], flag: str) -> bool:
    return any(tok == flag or tok.startswith(flag + "=") for tok in argv)


def _config(model_dir: str | None) -> dict:
    """The model's config.json with its text config (multimodal wrappers) merged over it; {} if unreadable."""
    if model_dir is None:
        return {}
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    return {**cfg, **cfg.get("text_config", {})}


def model_uses_mla(model_dir: str | None) -> bool:
    """Whether the model's config.json declares MLA attention (Kimi-Linear / DeepSeek style)."""
    cfg = _config(model_dir)
    return bool(cfg.get("kv_lora_rank")) or any("KimiLinear" in a for a in cfg.get("architectures", []))


def _attention(done: Completed, mla: bool) -> None:
    argv = done.argv
    attn = flag_value(argv, "--attention-backend")
    prefill = flag_value(argv, "--prefill-attention-backend") or attn
    decode_given = flag_value(argv, "--decode-attention-backend")
    for flag in ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend"):
        value = flag_value(argv, flag)
        if value is not None and value not in CPU_ATTENTION:
            raise CPURuntimeArgsError(f"{flag} {value} has no CPU implementation (use {' or '.join(CPU_ATTENTION)}).")
    if not mla:
        if attn is None and prefill is None and decode_given is None:
            done.add(["--attention-backend", "torch_native"], "the CPU attention backend")
        return
    if prefill == "torch_native":
        raise CPURuntimeArgsError(
            "an MLA model (Kimi-Linear) cannot prefill on --attention-backend torch_native (SGLang's torch "
            "MLA extend fails on it); pass --attention-backend triton --decode-attention-backend torch_native.")
    if decode_given == "triton":
        raise CPURuntimeArgsError(
            "an MLA model (Kimi-Linear) cannot decode on triton under the Triton interpreter; pass "
            "--decode-attention-backend torch_native.")
    if prefill is None:
        done.add(["--attention-backend", "triton"], "MLA prefill runs SGLang's Triton extend attention, interpreted")
    if decode_given is None:
        done.add(["--decode-attention-backend", "torch_native"], "MLA decode in torch")


#: What the CPU runtime serves speculative decoding (EAGLE / NEXTN chain drafts) with: SGLang's intel_amx
#: attention backend over the stand-in's torch ops (it derives the verify extend lengths; torch_native
#: has no EAGLE draft backend), for the target and the draft.
SPEC_ATTENTION = ["--prefill-attention-backend", "intel_amx", "--decode-attention-backend", "intel_amx",
                  "--speculative-draft-attention-backend", "intel_amx"]


def _speculative(done: Completed, mla: bool) -> bool:
    """Defaults / refusals for ``--speculative-algorithm``; True when it applies (attention is then set)."""
    argv = done.argv
    algo = flag_value(argv, "--speculative-algorithm")
    if algo is None:
        return False
    if mla:
        raise CPURuntimeArgsError(
            f"--speculative-algorithm {algo}: SGLang 0.5.23 has no draft source for Kimi-Linear (no MTP layer, "
            "no EAGLE head) the CPU runtime can serve; run it without speculative decoding.")
    if algo.upper() not in ("NEXTN", "EAGLE"):
        raise CPURuntimeArgsError(f"--speculative-algorithm {algo} is not served by the CPU runtime (use NEXTN).")
    topk = flag_value(argv, "--speculative-eagle-topk")
    if topk is not None and int(topk) != 1:
        raise CPURuntimeArgsError(f"--speculative-eagle-topk {topk}: the CPU runtime serves chain drafts only "
                                  "(pass --speculative-eagle-topk 1).")
    for flag in ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend",
                 "--speculative-draft-attention-backend"):
        value = flag_value(argv, flag)
        if value is not None and value != "intel_amx":
            raise CPURuntimeArgsError(f"{flag} {value}: speculative decoding on the CPU runtime runs on intel_amx "
                                      f"attention (pass {' '.join(SPEC_ATTENTION)}, or no attention flag).")
    missing = [SPEC_ATTENTION[i:i + 2] for i in range(0, len(SPEC_ATTENTION), 2)
               if flag_value(argv, SPEC_ATTENTION[i]) is None]
    if missing:
        done.add([tok for pair in missing for tok in pair], "speculative decoding runs on intel_amx attention")
    if topk is None:
        done.add(["--speculative-eagle-topk", "1"], "the CPU runtime serves chain drafts")
    return True


def complete(argv: Sequence[str]) -> Completed:
    """``argv`` (flags only, as SGLang's parser takes them) with the CPU runtime's defaults appended;
    raises CPURuntimeArgsError for a flag the CPU runtime cannot serve."""
    done = Completed(list(argv))
    device = flag_value(argv, "--device")
    if device is None:
        done.add(["--device", "cpu"], "no CUDA driver on this machine")
    elif device != "cpu":
        raise CPURuntimeArgsError(f"--device {device} needs a driver this machine lacks (pass --device cpu).")
    model = flag_value(argv, "--model-path") or flag_value(argv, "--model")
    if not passed(argv, "--disable-cuda-graph"):
        done.add(["--disable-cuda-graph"], "no CUDA graphs without CUDA")
    if not _speculative(done, model_uses_mla(model)):
        _attention(done, model_uses_mla(model))
    strategy = flag_value(argv, "--mamba-radix-cache-strategy")
    if strategy == "no_buffer" and not passed(argv, "--disable-overlap-schedule"):
        done.add(["--disable-overlap-schedule"], "SGLang's no_buffer strategy requires it")
    return done


def _merged_config(argv: list[str]) -> list[str]:
    """``argv`` with a ``--config`` YAML merged in the way prepare_server_args does it."""
    import argparse

    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return list(ConfigArgumentMerger(parser).merge_config_with_args(argv))


#: The flags complete() reads or adds, as ServerArgs fields (what ``sglang.Engine(**kwargs)`` sets).
_VALUE_FIELDS = {"--model-path": "model_path", "--device": "device", "--dtype": "dtype",
                 "--attention-backend": "attention_backend",
                 "--prefill-attention-backend": "prefill_attention_backend",
                 "--decode-attention-backend": "decode_attention_backend",
                 "--mamba-radix-cache-strategy": "mamba_radix_cache_strategy"}
_SWITCH_FIELDS = {"--disable-cuda-graph": "disable_cuda_graph", "--disable-overlap-schedule": "disable_overlap_schedule"}


def fields_argv(server_args: object) -> list[str]:
    """The ServerArgs fields complete() looks at, written as the command line that would set them."""
    argv: list[str] = []
    for flag, name in _VALUE_FIELDS.items():
        value = getattr(server_args, name, None)
        if value is not None:
            argv += [flag, str(value)]
    return argv + [flag for flag, name in _SWITCH_FIELDS.items() if getattr(server_args, name, False)]


def complete_fields(server_args: object) -> list[str]:
    """complete() on a ServerArgs record: the defaults are set on its fields; returns the notes."""
    argv = fields_argv(server_args)
    done = complete(argv)
    added, i = done.argv[len(argv):], 0
    while i < len(added):
        if added[i] in _SWITCH_FIELDS:
            setattr(server_args, _SWITCH_FIELDS[added[i]], True)
            i += 1
        else:
            setattr(server_args, _VALUE_FIELDS[added[i]], added[i + 1])
            i += 2
    return done.notes


def before_resolve_once(server_args: object) -> None:
    """BEFORE hook body for ``ServerArgs.resolve_once``: the same defaults and refusals for a record
    built without a command line (``sglang.Engine(**kwargs)``), and the CPU runtime's environment for
    the processes it spawns (cpu/launch_env.py). A record from the command line already went through
    before_prepare_server_args and gets nothing more; a resolved one (a child's copy) is left alone."""
    from sglang_replayssm.cpu import launch_env

    if getattr(server_args, "_resolution_finished", False) or getattr(server_args, "_input_frozen", False):
        return None
    notes = complete_fields(server_args)
    model = getattr(server_args, "model_path", None)
    ranks = [f"--{name.replace('_', '-')}={getattr(server_args, name, 1) or 1}"
             for name in ("tp_size", "pp_size", "dp_size")]
    if getattr(server_args, "enable_dp_attention", False):
        ranks.append("--enable-dp-attention")
    for name, value in sorted(launch_env.wanted(["--model-path", str(model), *ranks]).items()):
        if name not in os.environ:
            os.environ[name] = value
            notes.append(f"{name}={value} (not set; set by the package for the processes it spawns)")
    for note in notes:
        logger.warning("%s %s", PREFIX, note)
    return None


def before_prepare_server_args(argv: list[str], *args: object, **kwargs: object) -> tuple[tuple, dict]:
    """BEFORE hook body for `prepare_server_args(argv)`: the completed argv, defaults logged once."""
    from sglang_replayssm.cpu import launch_env

    if any(h in argv for h in ("-h", "--help")):
        return (argv, *args), kwargs
    full = _merged_config(list(argv)) if "--config" in argv else list(argv)
    done = complete(full)
    for name, value in sorted(launch_env.APPLIED.items()):
        logger.warning("%s %s=%s (not set; set by the package at process start)", PREFIX, name, value)
    for note in done.notes:
        logger.warning("%s %s", PREFIX, note)
    return (done.argv, *args), kwargs
