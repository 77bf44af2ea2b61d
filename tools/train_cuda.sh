#!/usr/bin/env bash
# Rebuild the SmolLM2 EAGLE-3 head on one CUDA GPU in one go: corpora, prompts, self-distillation
# (the target answers on the GPU) and training, with the shipped recipes. Sized to fit about ten
# minutes on an H100/H200-class GPU; the CPU path (`specc train all smollm2_135m_eagle3`) runs the
# same stages with the same recipes. Usage: bash tools/train_cuda.sh [OUT_DIR]
# (default out/smollm2_135m_eagle3_cuda; the shipped head is not overwritten).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/specc ] || bash tools/install
. .venv/bin/activate
OUT=${1:-out/smollm2_135m_eagle3_cuda}
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use the CPU path')"
specc train corpora smollm2_specbench
specc train prompts smollm2_specbench                       # round 1 + teacher-forcing prompts (committed)
specc train distill smollm2_specbench --part round1 --device cuda --gen-batch 256
specc train prompts smollm2_specbench --round 2             # follow-ups over the target's round-1 answers
specc train distill smollm2_specbench --part round2 --device cuda --gen-batch 256
specc train fit smollm2_135m_eagle3 --device cuda --out "$OUT"
specc train vocab smollm2_135m_eagle3 --device cuda --out "$OUT"
specc train render smollm2_135m_eagle3 --out "$OUT"
echo "wrote $OUT (measure it on the CPU: python tools/bench_eagle.py --methods eagle3 --head eagle3=$OUT)"
