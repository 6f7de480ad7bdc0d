"""The benchmark's arms: which server flags and which plugin entry points each one runs with."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Arm:
    name: str
    description: str
    flags: tuple[str, ...]  # the arm's own server flags
    plugins: tuple[str, ...]  # SGLANG_PLUGINS whitelist (entry-point names)
    env: tuple[tuple[str, str], ...] = ()  # the arm's own environment variables (name, value)


# Flags every arm launches with: the hit-rate cross-check reads the server's Prometheus counters; on
# CPU every arm runs without the overlap scheduler (the CPU runtime's measured configuration).
COMMON_FLAGS: tuple[str, ...] = ("--disable-overlap-schedule", "--enable-metrics")
# On a GPU, SGLang's default overlap scheduler stays on, except where SGLang requires it off (no_buffer).
GPU_COMMON_FLAGS: tuple[str, ...] = ("--enable-metrics",)

# Speculative decoding with the model's MTP layer (``mtp.*``, NEXTN): chain drafts of 3 steps, 4 tokens
# per verify. Only for a model that has one (the embedded tiny-gdn; run with --dataset-name mtp-fit).
NEXTN_FLAGS: tuple[str, ...] = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
                                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")

ARMS: dict[str, Arm] = {
    arm.name: arm
    for arm in (
        Arm("baseline", "ReplaySSM off, extra_buffer",
            ("--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix")),
        Arm("upstream", "ReplaySSM on, no_buffer, adapter off (SGLang 0.5.23)",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "no_buffer"),
            ("replayssm_cpu",)),
        Arm("plugin", "ReplaySSM on, extra_buffer, adapter on",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix")),
        Arm("nextn", "NEXTN speculative decoding, ReplaySSM off, extra_buffer",
            ("--mamba-radix-cache-strategy", "extra_buffer", *NEXTN_FLAGS),
            ("replayssm_cpu", "replayssm_radix")),
        # NEXTN beside the decode ring (admitted; every target forward is a verify, so the ring stays empty):
        # the record pool lives with the decode ring, so this is the spec arm with record hits.
        Arm("nextn-ring", "NEXTN + ReplaySSM decode ring (records), extra_buffer, adapter on",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer", *NEXTN_FLAGS),
            ("replayssm_cpu", "replayssm_radix")),
        # SGLang refuses the decode ring beside the spec ring (attention_hook.py:499); records live with the
        # spec ring too (fix record_spec_ring), so this arm's hits are the records' like the plugin arm's.
        Arm("nextn-plugin", "NEXTN + ReplaySSM spec-verify ring, extra_buffer, adapter on",
            ("--enable-linear-replayssm-spec", "--mamba-radix-cache-strategy", "extra_buffer", *NEXTN_FLAGS),
            ("replayssm_cpu", "replayssm_radix")),
        # The read copy (SGLANG_REPLAYSSM_READ_COPY): non-flush decode steps read a bf16 / fp8 copy of the
        # fp32 checkpoint; flushes stay fp32-exact.
        Arm("plugin-bf16", "plugin arm + bf16 read copy",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix"), (("SGLANG_REPLAYSSM_READ_COPY", "bf16"),)),
        Arm("plugin-fp8", "plugin arm + fp8 read copy",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix"), (("SGLANG_REPLAYSSM_READ_COPY", "fp8"),)),
        # Decode rings per request row (SGLANG_REPLAYSSM_RING_ROWS, auto: the plugin arm's too): the slots' ring
        # bytes buy slots; plugin-slots keeps a ring per mamba slot.
        Arm("plugin-rows", "plugin arm + decode rings per request row",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix"), (("SGLANG_REPLAYSSM_RING_ROWS", "on"),)),
        Arm("plugin-slots", "plugin arm + a decode ring per mamba slot",
            ("--enable-linear-replayssm", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix"), (("SGLANG_REPLAYSSM_RING_ROWS", "off"),)),
        # SGLang's own way to halve the state's bytes: a bf16 SSM state, ReplaySSM off.
        Arm("bf16-state", "ReplaySSM off, bf16 SSM state, extra_buffer",
            ("--mamba-ssm-dtype", "bfloat16", "--mamba-radix-cache-strategy", "extra_buffer"),
            ("replayssm_cpu", "replayssm_radix")),
    )
}
# The A/A control of paired TTFT: baseline in a second server process. Identical CPU servers differ in prefill
# speed by up to ~14% a process, persistently: its ratio to baseline is what one pair of processes resolves.
ARMS["baseline-aa"] = replace(ARMS["baseline"], name="baseline-aa",
                              description="baseline again in a second server process (A/A control)")
DEFAULT_ARMS: tuple[str, ...] = ("baseline", "upstream", "plugin")


def parse_arms(text: str) -> list[str]:
    """Comma-separated arm names, in the given order, without repeats."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    if not names:
        raise ValueError("--arms names no arm")
    return list(dict.fromkeys(names))


def merge_flags(base: list[str], extra: list[str]) -> list[str]:
    """``base`` followed by the flags of ``extra`` whose option name ``base`` lacks; a flag takes every
    value up to the next ``--`` token (``--cuda-graph-bs-decode 64 256``)."""
    present = {tok.split("=", 1)[0] for tok in base if tok.startswith("--")}
    out = list(base)
    i = 0
    while i < len(extra):
        j = i + 1
        while "=" not in extra[i] and j < len(extra) and not extra[j].startswith("--"):
            j += 1
        if extra[i].split("=", 1)[0] not in present:
            out += extra[i:j]
        i = j
    return out


def common_flags(arm: Arm, device: str) -> tuple[str, ...]:
    """The flags every arm gets on ``device``: overlap off on CPU and wherever no_buffer needs it."""
    if device == "cpu" or "no_buffer" in arm.flags:
        return COMMON_FLAGS
    return GPU_COMMON_FLAGS


def server_command(arm: Arm, model_path: Path, port: int, *, device: str, tp: int,
                   extra_args: list[str], host: str = "127.0.0.1") -> list[str]:
    """The exact ``python -m sglang.launch_server`` command line of one arm.

    Precedence for a flag given twice: the user's extra args, then the arm, then the CPU runtime.
    """
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
           "--host", host, "--port", str(port)]
    user = list(extra_args)
    cmd = merge_flags(cmd, user)
    cmd = merge_flags(cmd, [*arm.flags, *common_flags(arm, device)])
    if tp > 1:
        cmd = merge_flags(cmd, ["--tp-size", str(tp)])
    if device == "cpu":
        from sglang_replayssm.cpu.launch import cpu_server_args

        cmd = merge_flags(cmd, cpu_server_args())
    elif device != "auto":
        cmd = merge_flags(cmd, ["--device", device])
    return cmd


def server_env(arm: Arm, device: str) -> dict[str, str]:
    """Environment of one arm's server: this process's plus the plugin whitelist (on CPU the package
    sets the CPU runtime's own variables in the server process, cpu/launch_env.py)."""
    env = dict(os.environ)
    env["SGLANG_PLUGINS"] = ",".join(arm.plugins)
    env.update(arm.env)
    return env


def command_line(cmd: list[str], env: dict[str, str]) -> str:
    """A shell line reproducing the launch: the variables ``env`` sets or changes, then the command."""
    changed = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()) if os.environ.get(k) != v]
    return " ".join([*changed, shlex.join(cmd)])
