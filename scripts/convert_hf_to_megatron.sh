#!/usr/bin/env bash
# Thin wrapper: python -m tools.convert_hf_to_megatron from the repository root, all arguments passed on.
# PYTHON (default python3) picks the interpreter. See docs/CONVERT.md and --help.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m tools.convert_hf_to_megatron "$@"
