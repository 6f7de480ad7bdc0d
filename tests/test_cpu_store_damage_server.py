"""A damaged L3 file store on the CPU runtime with real servers (slow, `server` marker): the tiny GDN (fp32) with
``--hicache-storage-backend file`` (the flags of ``tests/test_cpu_hicache_server.py``'s storage test).

A first server fills the store with eight 200-token prompts (page size 1: each token's KV page, its checksum
twin and its records; a mamba state and its twin at 192) and stops. An eighth of the store's files is then
damaged, every kind at least once: a KV page truncated, a KV page bit-flipped, a state's twin naming another
model, a KV page's twin deleted, a records file naming another layout, a records file truncated; the rest of
the quota truncates files past the damage of prompts already hit. A second server on the same directory serves every
prompt again: tokens equal to HF's greedy run (a clean ReplaySSM-off reference) and to the first server's,
nothing damaged served, each kind counted; the prompts whose KV and states are whole keep their storage hit
(192 tokens each: at least half of what the undamaged store gives, and more than a server without one: 0).
"""

from __future__ import annotations

import random
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_replayssm.bench.server_metrics import metric_sum
from tests.support.store_damage import flip as _flip
from tests.support.store_damage import truncate as _truncate
from tests.test_cpu_hicache_server import NEW_TOKENS, STORAGE_FLAGS

PROMPTS = 8
STORED = 192  # a 200-token prompt is stored page by page (page size 1), with a state at 192 (the 64-grid)
COUNTER = "sglang:replayssm_store_damaged_files_total"


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    from sglang_replayssm.models import make_models

    return make_models(names=("tiny-gdn",), log=lambda *a: None)


def _files_by_page(store: Path) -> dict[str, dict[str, Path]]:
    """Each page hash's files by tag: '' (KV), '.replayssm-sum' (its twin), '.mamba', '.replayssm-sum.mamba',
    '.replayssm-rec' (records)."""
    out: dict[str, dict[str, Path]] = {}
    for path in store.glob("*.bin"):
        head = path.name.split("_", 1)[0]
        page_hash, dot, tag = head.partition(".")
        tag = dot + tag
        out.setdefault(page_hash, {})[".replayssm-rec" if tag.startswith(".replayssm-rec") else tag] = path
    return out


def _damage(store: Path, hashes: list[list[str]]) -> dict[str, int]:
    """Damage an eighth of the store's files (each kind once, then files past the damage of prompts already hit);
    returns the damaged files per kind."""
    total = len(list(store.glob("*.bin")))
    by_page = _files_by_page(store)
    files = [[by_page[h] for h in prompt] for prompt in hashes]
    _truncate(files[0][100][""])  # prompt 0: KV page 101 short
    kv = files[1][150][""]
    _flip(kv, kv.stat().st_size // 2)  # prompt 1: KV page 151 flipped
    _flip(files[2][-1][".replayssm-sum.mamba"], 8)  # prompt 2: its state's twin names another model
    files[3][0][".replayssm-sum"].unlink()  # prompt 3: KV page 1 without its twin
    # two whole prompts with records (records are best effort: a page whose host records were not ready yet
    # at its backup has none): one names another layout, one is short
    rec = [i for i in range(4, PROMPTS) if ".replayssm-rec" in files[i][50] and ".replayssm-rec" in files[i][10]]
    _flip(files[rec[0]][50][".replayssm-rec"], 24)
    _truncate(files[rec[1]][10][".replayssm-rec"])
    done = {"truncated": 2, "corrupt": 1, "other_model": 1, "missing_twin": 1, "other_layout": 1}
    # the rest: files past the damage of prompts 0, 1 and 3 (their queries stop before them)
    spare = [p for i, first in ((0, 101), (1, 151), (3, 1)) for page in files[i][first:] for p in page.values()]
    for path in spare[: total // 8 - sum(done.values())]:
        _truncate(path)
        done["truncated"] += 1
    assert sum(done.values()) == total // 8, (done, total)
    return done


@pytest.mark.server
@pytest.mark.timeout(900)
def test_a_damaged_store_serves_its_whole_pages_and_nothing_damaged(models, tmp_path):
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    from tests.support.hf_reference import hf_greedy
    from tests.support.serve import cpu_server, generate

    store = tmp_path / "l3"
    env = {"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR": str(store)}
    rng = random.Random(7)
    prompts = [[rng.randrange(10, 2000) for _ in range(200)] for _ in range(PROMPTS)]
    model = models["tiny-gdn"]
    with cpu_server(model, STORAGE_FLAGS, tmp_path / "server1.log", env=env, timeout_s=600) as url:
        first = [generate(url, p, NEW_TOKENS) for p in prompts]
        hashes = [get_storage_hash_str(p[:STORED], None, page_size=1) for p in prompts]
        whole = {"", ".replayssm-sum", ".mamba", ".replayssm-sum.mamba"}
        deadline = time.monotonic() + 60
        while not all(set(_files_by_page(store).get(h[-1], ())) >= whole for h in hashes):  # backups are async
            assert time.monotonic() < deadline, "the store was not filled"
            time.sleep(1)
    damaged = _damage(store, hashes)

    with cpu_server(model, STORAGE_FLAGS, tmp_path / "server2.log", env=env, timeout_s=600) as url:
        generate(url, [rng.randrange(10, 2000) for _ in range(40)], 2)  # a first forward: record shapes
        second = [generate(url, p, NEW_TOKENS) for p in prompts]
        metrics = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()

    expected = hf_greedy(model, prompts, NEW_TOKENS, ignore_eos=True)
    assert [o["output_ids"] for o in first] == expected
    assert [o["output_ids"] for o in second] == expected  # nothing damaged was served
    cached = [o["cached_tokens"] for o in second]
    assert cached[:4] == [0] * 4 and cached[4:] == [STORED] * 4, cached  # a damaged prompt costs itself only
    assert sum(cached) >= PROMPTS * STORED // 2  # at least half of the undamaged store's
    counted = {kind: metric_sum(metrics, COUNTER, kind=kind) for kind in damaged}
    assert all(counted[kind] > 0 for kind in damaged), counted
