"""Tensor parallel (``--tp N``, ``--dp N``) on the CPU runtime: what SGLang 0.5.23's CPU engine needs that a
user cannot guess, applied by the package.

* PyNccl: SGLang turns it on for every process group (``parallel_state.py:2185``) and, torch being a
  CUDA build, ``libnccl.so.2`` loads; then ``PyNcclCommunicator`` asks for a CUDA device (``ValueError:
  Expected a cuda device, but got: cpu``, pynccl.py:116). On the CPU runtime the collectives are
  torch.distributed over gloo (SGLang's own CPU path, used when PyNccl is off), so a BEFORE hook on
  ``GroupCoordinator.__init__`` turns PyNccl off there.
* Thread binding: with more ranks than NUMA nodes, SGLang asserts unless ``SGLANG_CPU_OMP_THREADS_BIND``
  names one CPU group per rank (numa_utils.py:456-470). Unless the user set it, the package splits the
  CPUs this process may run on into one contiguous group per rank (``0|1`` on two cores; ranks share
  CPUs round-robin when there are fewer CPUs than ranks). SGLang's CPU engine only pins OpenMP threads
  with its AMX kernels, which the CPU runtime does not report, so the groups only satisfy the check.
* DP attention pads each rank's batch (``prepare_mlp_sync_batch``) with a seq-len fill value that on CPU
  only SGLang's AMX attention backend defines (``get_cpu_graph_seq_len_fill_value``); the torch backend
  gets the same value (1).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

#: ``flag_value(argv, flag)``: the value of a flag in a command line (cpu/launch_env.py's).
FlagValue = Callable[[Sequence[str], str], "str | None"]


def _int_flag(argv: Sequence[str], flags: tuple[str, ...], flag_value: FlagValue) -> int:
    for flag in flags:
        value = flag_value(argv, flag)
        if value is not None:
            return int(value)
    return 1


def world_size(argv: Sequence[str], flag_value: FlagValue) -> int:
    """Scheduler ranks of one server: tp * pp, times dp unless DP attention runs inside the TP group."""
    tp = _int_flag(argv, ("--tp-size", "--tp", "--tensor-parallel-size"), flag_value)
    pp = _int_flag(argv, ("--pp-size", "--pp", "--pipeline-parallel-size"), flag_value)
    dp = _int_flag(argv, ("--dp-size", "--dp", "--data-parallel-size"), flag_value)
    dp_attention = "--enable-dp-attention" in argv or _int_flag(argv, ("--attn-dp-size",), flag_value) > 1
    return tp * pp * (1 if dp_attention else dp)


def numa_nodes() -> int:
    """NUMA nodes with CPUs (1 where sysfs does not say)."""
    nodes = [p for p in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist") if open(p).read().strip()]
    return max(1, len(nodes))


def threads_bind(ranks: int, cpus: Sequence[int]) -> str:
    """One '|'-separated CPU group per rank: contiguous slices of ``cpus``, round-robin when too few."""
    cpus = sorted(cpus)
    if len(cpus) < ranks:
        return "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))
    per, extra = divmod(len(cpus), ranks)
    groups, start = [], 0
    for r in range(ranks):
        size = per + (1 if r < extra else 0)
        groups.append(",".join(map(str, cpus[start:start + size])))
        start += size
    return "|".join(groups)


def wanted(argv: Sequence[str], flag_value: FlagValue) -> dict[str, str]:
    """SGLANG_CPU_OMP_THREADS_BIND for a multi-rank server on fewer NUMA nodes than ranks, else nothing."""
    ranks = world_size(argv, flag_value)
    if ranks <= numa_nodes():
        return {}
    return {"SGLANG_CPU_OMP_THREADS_BIND": threads_bind(ranks, sorted(os.sched_getaffinity(0)))}


def cpu_graph_seq_len_fill_value(self: Any) -> int:
    """The seq-len SGLang pads DP-attention batches with on CPU (IntelAMXAttnBackend's value, 1): the
    torch attention backends the CPU runtime uses lack the method (forward_batch_info.py:2014)."""
    return 1


def no_pynccl(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    """BEFORE hook body for ``GroupCoordinator.__init__(self, group_ranks, local_rank, backend, use_pynccl,
    ...)``: PyNccl off (the CPU runtime's collectives are gloo's)."""
    if len(args) > 4:
        args = (*args[:4], False, *args[5:])
    else:
        kwargs["use_pynccl"] = False
    return args, kwargs
