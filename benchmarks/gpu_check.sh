#!/usr/bin/env bash
# The GPU check: rlvr's GPU paths on one CUDA machine without internet, in under 8 minutes.
#
#   here, where PyPI answers:  benchmarks/gpu_check.sh --fetch-wheels
#       fills benchmarks/gpu_wheels/ (git-ignored, ~20 MiB) with the wheels of rlvr's dependencies
#       that a stock CUDA image may lack (the versions installed here), for CPython 3.11-3.13;
#   on the GPU machine:        benchmarks/gpu_check.sh [OUT_DIR]     (default runs/gpu_check)
#       installs from those wheels only what is missing (pip --no-index), then runs
#       benchmarks/gpu_check.py under a 470 s limit: FSDP2 over NCCL (1 rank), packed attention
#       on CUDA, the NVFP4 trainer on a random Qwen2.5-0.5B-shaped model (its packed base through
#       this torch's FSDP2, its step against the plan's estimate at the GPU's nominal peak: achieved
#       TFLOP/s), RL steps with LoRA on the transformers engine (vLLM does not travel), and a
#       profile of one train step (the top kernels). It prints tokens/s and step times and
#       writes OUT_DIR/gpu_check.json (rewritten after each part, so a timeout keeps what ran).
#
# torch, transformers and peft are the image's own; nothing else is downloaded there.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=benchmarks/gpu_wheels
PYTHON=${PYTHON:-python3}
# import name = distribution name, for what rlvr imports on the paths the check runs
MODULES="pydantic:pydantic pydantic_core:pydantic-core annotated_types:annotated-types typing_inspection:typing-inspection
yaml:pyyaml rich:rich markdown_it:markdown-it-py mdurl:mdurl pygments:pygments safetensors:safetensors
accelerate:accelerate psutil:psutil typer:typer click:click shellingham:shellingham sympy:sympy mpmath:mpmath
math_verify:math-verify latex2sympy2_extended:latex2sympy2_extended antlr4:antlr4-python3-runtime"

if [ "${1:-}" = "--fetch-wheels" ]; then
    mkdir -p "$WHEELS"
    # the versions this checkout runs with here (its .venv), so that both machines agree
    dists=$(for m in $MODULES; do d=${m#*:}; echo "$d==$($PYTHON -c "import importlib.metadata as m; print(m.version('$d'))")"; done)
    for version in 3.11 3.12 3.13; do
        # --no-deps: their own dependencies are listed above, and torch must never come along
        $PYTHON -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$WHEELS" $dists
    done
    du -sh "$WHEELS"
    exit 0
fi

OUT=${1:-runs/gpu_check}
mkdir -p "$OUT"
missing=""
for m in $MODULES; do
    $PYTHON -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${m%%:*}') is None)" || missing="$missing ${m#*:}"
done
if [ -n "$missing" ]; then
    echo "[gpu_check] installing from $WHEELS:$missing"
    $PYTHON -m pip install -q --no-index --no-deps --find-links "$WHEELS" $missing
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
timeout 470 $PYTHON benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --work "$OUT/work"
