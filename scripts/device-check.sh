#!/usr/bin/env bash
# On a machine with a GPU: verify, generate and the benchmark's decode case there, in fp32 and bf16.
# Usage: scripts/device-check.sh [DEVICE]   (default cuda; mps on a Mac). Needs `make venv` first.
# Without such a device it says so and exits 0: there is nothing to check. (`cpu` runs the same steps here.)
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${1:-cuda}
PY=.venv/bin/python
if ! $PY -c "import sys, gptconv.devices as d; d.parse_device(sys.argv[1])" "$DEVICE" 2>/dev/null; then
  echo "no $DEVICE device here: nothing to check"; exit 0
fi
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
# a random-init GPT-2 124M and Llama-family checkpoint, made offline (the benchmark's own)
MODELS=$($PY -c "
from pathlib import Path; from gptconv.bench.checkpoints import ensure
print(' '.join(str(ensure(n, Path('$WORK'))) for n in ('gpt2-124m', 'smollm2-135m')))")
for M in $MODELS; do
  for DT in f32 bf16; do
    TORCH_DT=$([ "$DT" = bf16 ] && echo bfloat16 || echo float32)
    echo "== $M on $DEVICE, $DT"
    .venv/bin/gptconv verify "$M" --device "$DEVICE" --dtype "$DT" --length 256 | tail -3
    .venv/bin/gptconv generate "$M" "The capital of France is" -n 16 --device "$DEVICE" --dtype "$DT"
    for PEER in gptconv transformers; do
      $PY -m gptconv.bench.worker decode "$PEER" "$M" "{\"device\": \"$DEVICE\", \"dtype\": \"$TORCH_DT\"}" \
        | $PY -c "import json, sys; r = json.loads(sys.stdin.read().strip().splitlines()[-1]); print('decode $PEER:', round(r['tokens_per_s'], 1), 'tok/s')"
    done
  done
done
