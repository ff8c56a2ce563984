# shellcheck shell=bash
# Flags of the kernel eval server window (python -m eval_server --help lists them all).
# EVAL_DEVICES is filled by the launcher from the GPU split (or "cpu").
# shellcheck disable=SC2034  # used by the script that sources this file
: "${EVAL_WORKERS_PER_DEVICE:=1}"  # 1: every timing free of other evaluations' kernels; 2: +42 % on small problems (docs/LAUNCH.md)
: "${EVAL_TIMEOUT_S:=180}"
: "${EVAL_PRECISION_POLICY:=fp32}"
: "${EVAL_CPU_WORKERS:=2}"          # workers when EVAL_DEVICES=cpu (Triton interpreter, no timing)
EVAL_SERVER_ARGS=(
  --host 127.0.0.1
  --port "${EVAL_PORT}"
  --devices "${EVAL_DEVICES}"
  --workers-per-device "${EVAL_WORKERS_PER_DEVICE}"
  --cpu-workers "${EVAL_CPU_WORKERS}"
  --timeout-s "${EVAL_TIMEOUT_S}"
  --precision-policy "${EVAL_PRECISION_POLICY}"
  --ref-cache "${RUN_DIR}/ref_cache.sqlite"
  --workdir "${RUN_DIR}/eval_work"
)
# Any other eval server flags, as words (e.g. "--runner-read-only on" or "--reference-max-age 300").
read -ra _eval_extra <<<"${EVAL_EXTRA_ARGS:-}"
EVAL_SERVER_ARGS+=("${_eval_extra[@]}")
