#!/usr/bin/env bash
# The prepared GPU check, one command: `bash benchmarks/gpu_check.sh [OUT_DIR]` (default $OUT).
# Where our Python dependencies are missing (the lent GPU machine reaches no registry), the wheels that
# benchmarks/prepare_gpu_check.sh put in .gpu/wheels are installed to a scratch folder first.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import pydantic" 2>/dev/null && compgen -G ".gpu/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/loracls-site .gpu/wheels/*.whl
  export PYTHONPATH="/tmp/loracls-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 benchmarks/gpu_check.py "${1:-${OUT:-gpu-check-out}}"
