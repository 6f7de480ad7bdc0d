"""Test-wide setup.

Without a CUDA device, Triton kernels can only run under the interpreter, so it is switched on
before anything imports triton. On a GPU machine the same tests run the compiled kernels. The hub is
off for the test process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# No test reads the Hugging Face hub (models are local directories): without this, SGLang's ServerArgs for a
# model named "dummy" waits on hub lookups, 46-80 s a test where the network answers slowly. Test servers do
# not inherit it (tests/support/serve.py: the CPU runtime sets it itself for a local model, as for a user).
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _ring_rows_as_given() -> Iterator[None]:
    """The admission publishes its resolution of ``SGLANG_REPLAYSSM_RING_ROWS=auto`` to the environment
    (for the scheduler processes it starts); each test starts from the environment the run was given."""
    from sglang_replayssm.settings import RING_ROWS

    given = os.environ.get(RING_ROWS.name)
    yield
    if given is None:
        os.environ.pop(RING_ROWS.name, None)
    else:
        os.environ[RING_ROWS.name] = given


@pytest.fixture(scope="module")
def radix_adapter() -> Iterator[list]:
    """The radix adapter's hooks installed on SGLang (idempotent), with torch single-threaded for the
    module (tiny tensors: thread hand-off dominates on a shared 2-core box); yields the applied hooks."""
    from sglang_replayssm.radix import hooks

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    applied = hooks.install()
    yield applied
    torch.set_num_threads(threads)


@pytest.fixture
def hicache_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's host KV pools on a machine without a CUDA driver: no pinned-memory registration."""
    from sglang.srt.mem_cache.pool_host import common

    monkeypatch.setattr(common, "_cuda_host_register", lambda *a, **k: None)
