#!/usr/bin/env bash
# slime SFT on the prepared KernelBook data (tools/prepare_kernelbook_sft.py writes the
# `messages` jsonl): one tmux session with a `trainer` window (Ray head + `ray job submit ...
# python3 train_async.py` with slime's SFT rollout and loss), teeing to RUN_DIR/logs/trainer.log.
#
# Usage: scripts/run_sft.sh                   (settings from env vars, see docs/LAUNCH.md)
#        PRINT_ONLY=1 scripts/run_sft.sh      (write and print the window command only)
#        scripts/stop.sh RUN_DIR              (end the run: window, Ray)
#
# Settings: configs/run/common.sh (paths, TRAIN_GPUS, TP/CP/PP, ports), configs/run/sft.sh
# (SFT_DATA, batch size, epochs, LR; slime argument groups), configs/models/${MODEL}.sh.
# Resume: re-running with the same RUN_NAME continues from the latest checkpoint in
# SAVE_DIR (= LOAD_DIR, RUN_DIR/checkpoints by default); the script says which iteration.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

KRL_RUN_NAMED=0
if [[ -n "${RUN_NAME:-}${RUN_DIR:-}" ]]; then KRL_RUN_NAMED=1; fi
: "${RUN_NAME:=sft-$(date +%Y%m%d-%H%M%S)}"
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
krl_no_arguments "${BASH_SOURCE[0]}" "$@"
# shellcheck source=../configs/run/common.sh
source "${KRL_REPO_ROOT}/configs/run/common.sh"
: "${PRINT_ONLY:=0}"
: "${TRAINER_CMD:=}"
: "${SFT_ENTRY:=train_async.py}"

krl_run_plan sft
KRL_RUN_ID="${RUN_NAME}-$$-${RANDOM}"
RAY_TMPDIR="${RAY_TMPDIR:-${TMPDIR:-/tmp}/ray-${RUN_NAME}}"
export RUN_DIR TMUX_SESSION

krl_load_model_args
# shellcheck source=../configs/run/sft.sh
source "${KRL_REPO_ROOT}/configs/run/sft.sh"
[[ -f "${SFT_DATA}" ]] || krl_die "SFT data not found: ${SFT_DATA} (python -m tools.prepare_kernelbook_sft, or set SFT_DATA)"
TRAIN_ARGS=("${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${SFT_ARGS[@]}" "${PERF_ARGS[@]}" "${OPTIMIZER_ARGS[@]}"
  "${WANDB_ARGS[@]}" "${MISC_ARGS[@]}" --actor-num-nodes 1 --actor-num-gpus-per-node "${TRAIN_GPUS}")

ports=()
if [[ -z "${TRAINER_CMD}" ]]; then
  for var in "${KRL_RAY_PORT_VARS[@]}"; do ports+=("${!var}"); done
fi
krl_preflight_session "${ports[@]}"
krl_report_resume "${LOAD_DIR}" "${REF_LOAD}"
krl_print_only_scratch
krl_init_run_dir "${KRL_RAY_PORT_VARS[@]}" RAY_VISIBLE_DEVICES TRAIN_GPUS SFT_DATA
krl_write_trainer_cmd "${SFT_ENTRY}" "${TRAIN_ARGS[@]}"

if [[ "${PRINT_ONLY}" == 1 ]]; then
  krl_print_windows trainer
  exit 0
fi
krl_health_url() { printf ''; }
krl_start_windows trainer
exit
}
