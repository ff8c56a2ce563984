# shellcheck shell=bash
# Flags of the kernel eval server window (python -m eval_server --help lists them all).
# EVAL_DEVICES is filled by the launcher from the GPU split (or "cpu").
# shellcheck disable=SC2034  # used by the script that sources this file
: "${EVAL_WORKERS_PER_DEVICE:=1}"  # with the prepared child (worker.py) 1 per GPU matches 2 in throughput at 1/3 of the latency
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
