# Sourced by demo.sh and test.sh: make .venv with torch pinned to the 2.13.0 CPU build, install
# torchbert (editable) with the extra named in $1, and activate it.
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "torchbert needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
stamp=.venv/.installed-$1-$(cat pyproject.toml | cksum | cut -d' ' -f1)
if [ ! -f "$stamp" ]; then
    python -m pip install -q "torch==2.13.0"
    python -m pip install -q -e ".[$1]"
    touch "$stamp"
fi
