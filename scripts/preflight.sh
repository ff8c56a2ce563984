#!/usr/bin/env bash
# Verify the setup before a run: checkpoints and their format, MODEL_ARGS vs the HF config, data,
# recipe, tokenizer, GPU count vs the requested split, free ports, slime/Megatron/SGLang/Ray
# versions, W&B settings. Prints a PASS/WARN/FAIL table with the fix for each failure; exit 1 if
# anything failed. Same environment variables as scripts/run_kbench_multiturn.sh.
#   scripts/preflight.sh [--json out.json]
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
cd "${KRL_REPO_ROOT}"
exec "${PYTHON:-python3}" -m tools.preflight "$@"
