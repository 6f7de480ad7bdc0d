#!/usr/bin/env bash
# Make sure the cached environment exists and the checkout reaches it as .venv.
# The environment lives outside the clone, keyed by the hash of requirements.lock (every package at an
# exact version; scripts/lock.sh regenerates it from requirements.in), so a rerun or a fresh clone on
# the same machine reuses it; a fresh machine builds it (measured: docs/BENCHMARKS.md, "Environment").
set -euo pipefail
cd "$(dirname "$0")/.."
root="${SGLANG_REPLAYSSM_CACHE:-$HOME/.cache/sglang-replayssm}"
key=$(sha256sum requirements.lock | cut -c1-12)
venv="$root/venv-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "[ensure_env] building $venv from requirements.lock (first time on this machine: a few minutes)"
  start=$(date +%s)
  rm -rf "$venv"
  mkdir -p "$root"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # The lock is complete: no resolution, nothing newer than the lock can slip in.
  "$venv/bin/pip" install --progress-bar off --no-deps -r requirements.lock
  touch "$venv/.complete"
  echo "[ensure_env] built in $(( $(date +%s) - start )) s"
fi
ln -sfn "$venv" .venv
# Our own package: editable, no dependency resolution (the lock already holds them).
stamp="$venv/.editable-$(sha256sum pyproject.toml | cut -c1-12)-$(pwd | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ] || ! .venv/bin/python -c "import sglang_replayssm" 2>/dev/null; then
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  rm -f "$venv"/.editable-*
  touch "$stamp"
fi
