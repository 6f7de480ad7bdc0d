# The two commands: `make bench` (the main job) and `make test`.
# Each first makes sure the cached environment exists (scripts/ensure_env.sh).
PY := .venv/bin/python
MODELS ?= $(HOME)/.cache/sglang-replayssm/models
BENCH_ARGS ?= --json out/bench.json --plot-dir out
# The second workload: RAG whose shared depths (200-token system prompt, documents of 384-768
# tokens) fall off SGLang's 64-token state grid.
RAG_ARGS ?= --dataset-name rag --gsp-range-ratio 0.5 --rag-system-prompt-len 200 \
	--rag-num-conversations 16 --rag-num-turns 2 --json out/bench-rag.json --plot-dir out/rag

.PHONY: env test test-matrix bench bench-mem lint models lock soak

env:
	@scripts/ensure_env.sh

models: env
	@$(PY) -m sglang_replayssm.cli make-models --out $(MODELS)

test: env lint
	@$(PY) -m pytest -q -ra --durations=40 $(PYTEST_ARGS)

# The whole user-launch matrix (GDN, KDA x dtype x mamba strategy x ReplaySSM off/on, prompts up to
# 2,048 tokens): opt-in, about 2 hours on a quiet 2-core machine.
test-matrix: env
	@SGLANG_REPLAYSSM_MATRIX=1 $(PY) -m pytest -q -ra tests/test_launch_matrix.py

# The soak (opt-in): SOAK_MINUTES of mixed traffic on one CPU-runtime server (RAG, sessions, client
# disconnects, retraction, HiCache and the L3 file store, records), probes against HF, then the drain checks
# (tests/support/soak.py; a 3-minute version runs in `make test`). Report: out/soak/soak.json.
SOAK_MINUTES ?= 30
SOAK_ARM ?= records
soak: env
	@$(PY) -m tests.support.soak --minutes $(SOAK_MINUTES) --arm $(SOAK_ARM)

bench: env
	@$(PY) -m sglang_replayssm.cli bench $(BENCH_ARGS)
	@$(PY) -m sglang_replayssm.cli bench $(RAG_ARGS)

# The memory-bound workload (rag-mem) at equal memory, 36 MiB of cache per arm, the arms paired: docs/BENCHMARKS.md.
bench-mem: env
	@$(PY) -m sglang_replayssm.cli bench --dataset-name rag-mem --paired --arms baseline,upstream,plugin,baseline-aa --json out/bench-mem.json --plot-dir out/mem

lint: env
	@$(PY) -m ruff check sglang_replayssm tests scripts lab
	@$(PY) -m mypy

# Regenerate requirements.lock from requirements.in (then commit it; the environment key changes).
lock:
	@scripts/lock.sh
