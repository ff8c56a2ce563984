#!/usr/bin/env bash
# The main multi-turn GRPO run: one tmux session with three windows, each teeing to a log under
# the run directory, started in order once the previous one answers /health:
#   eval     kernel eval server on the EVAL_GPUS (python -m eval_server)
#   buffer   rollout buffer server + agent runner (python -m buffer_server --recipe ...)
#   trainer  Ray head + `ray job submit ... python3 train.py` of slime with this project's plug-ins
#
# Usage: scripts/run_kbench_multiturn.sh            (settings from env vars, see docs/LAUNCH.md)
#        PRINT_ONLY=1 scripts/run_kbench_multiturn.sh   (write and print the window commands only)
#        scripts/stop.sh RUN_DIR                       (end the run: windows, servers, Ray)
#
# Settings: configs/run/common.sh (paths, GPU split, ports), configs/run/kbench_multiturn.sh
# (slime argument groups), configs/servers/*.sh (server flags), configs/models/${MODEL}.sh
# (MODEL_ARGS), the recipe YAML (multi-turn, runner, rollout temperature).
# Window command overrides (tests, the CPU dry run): EVAL_CMD, BUFFER_CMD, TRAINER_CMD (shell
# strings run in place of the defaults), ENGINE_CMD + ENGINE_HEALTH_URL (an extra `engine`
# window started first, e.g. the embedded CPU engine), EVAL_DEVICES=cpu.
# Resume: SAVE_DIR/LOAD_DIR default to RUN_DIR/checkpoints; re-running with the same RUN_NAME
# after scripts/stop.sh resumes from the latest checkpoint there (slime --load reads
# latest_checkpointed_iteration.txt); the launcher reports which iteration it resumes from.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=../configs/run/common.sh
source "${KRL_REPO_ROOT}/configs/run/common.sh"

: "${PRINT_ONLY:=0}"
: "${EVAL_CMD:=}"
: "${BUFFER_CMD:=}"
: "${TRAINER_CMD:=}"
: "${ENGINE_CMD:=}"
: "${ENGINE_HEALTH_URL:=}"
: "${TRAIN_ENTRY:=train.py}"   # train_async.py overlaps rollout and training (not with COLOCATE=1)
# Weights that sampled rollout N: N with train.py, N-1 with train_async.py (one step behind).
if [[ "${TRAIN_ENTRY}" == train_async.py ]]; then POLICY_VERSION_LAG=1; else POLICY_VERSION_LAG=0; fi
[[ "${TRAIN_ENTRY}" == train_async.py && "${COLOCATE}" == 1 ]] && krl_die "train_async.py cannot run with COLOCATE=1 (slime forbids it)"

# --- the recipe: one source for the multi-turn settings and the rollout temperature ----------
[[ -f "${RECIPE}" ]] || krl_die "recipe not found: ${RECIPE} (set RECIPE=...)"
if [[ -z "${ROLLOUT_TEMPERATURE:-}" ]]; then
  ROLLOUT_TEMPERATURE="$("${PYTHON}" -m tools.run_recipe get "${RECIPE}" runner.temperature)" ||
    krl_die "set kernel_rl.runner.temperature in ${RECIPE} (or ROLLOUT_TEMPERATURE): slime's --rollout-temperature must equal it"
fi
: "${N_SAMPLES_PER_PROMPT:=8}"  # episodes per prompt: the GRPO group (buffer --group-size, slime n)

# --- GPU split --------------------------------------------------------------------------------
krl_gpu_split() {
  local total need
  [[ "${TRAIN_GPUS}" =~ ^[0-9]+$ && "${ROLLOUT_GPUS}" =~ ^[0-9]+$ && "${EVAL_GPUS}" =~ ^[0-9]+$ ]] ||
    krl_die "TRAIN_GPUS, ROLLOUT_GPUS and EVAL_GPUS must be non-negative integers"
  if ((TRAIN_GPUS % (TP * CP * PP) != 0)); then
    krl_die "TRAIN_GPUS=${TRAIN_GPUS} is not a multiple of TP*CP*PP=$((TP * CP * PP))"
  fi
  if [[ "${COLOCATE}" == 1 ]]; then
    RAY_NUM_GPUS="${TRAIN_GPUS}"
    ROLLOUT_GPUS="${TRAIN_GPUS}"
  else
    ((ROLLOUT_GPUS % ROLLOUT_GPUS_PER_ENGINE == 0)) ||
      krl_die "ROLLOUT_GPUS=${ROLLOUT_GPUS} is not a multiple of ROLLOUT_GPUS_PER_ENGINE=${ROLLOUT_GPUS_PER_ENGINE}"
    RAY_NUM_GPUS=$((TRAIN_GPUS + ROLLOUT_GPUS))
  fi
  # GPUs needed: Ray's, plus the eval server's unless EVAL_DEVICES names them (e.g. cpu); none
  # when TRAINER_CMD replaces the trainer and the eval server runs on EVAL_DEVICES (tests, dry run).
  need=0
  [[ -z "${TRAINER_CMD}" ]] && need=${RAY_NUM_GPUS}
  [[ -z "${EVAL_DEVICES:-}" ]] && need=$((RAY_NUM_GPUS + EVAL_GPUS))
  total="${NUM_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}"
  ((total >= need)) || krl_die "the split needs ${need} GPUs (train ${TRAIN_GPUS}, rollout ${ROLLOUT_GPUS}," \
    "eval ${EVAL_GPUS}, colocate=${COLOCATE}) but ${total} are visible; set TRAIN_GPUS/ROLLOUT_GPUS/EVAL_GPUS or COLOCATE=1"
  if [[ -z "${EVAL_DEVICES:-}" ]]; then
    EVAL_DEVICES="$(seq -s, "${RAY_NUM_GPUS}" $((need - 1)))"
    [[ -n "${EVAL_DEVICES}" ]] || krl_die "EVAL_GPUS=0: set EVAL_DEVICES (e.g. cpu, or GPU ids shared with training)"
  fi
  RAY_VISIBLE_DEVICES="$(seq -s, 0 $((RAY_NUM_GPUS - 1)))"
}
krl_gpu_split

# The run id marks every process of the run (set in the window scripts only: the tmux server,
# which may be shared with other sessions, must not carry it).
KRL_RUN_ID="${RUN_NAME}-$$-${RANDOM}"
RUN_RECIPE="${RUN_DIR}/recipe.yaml"
# slime starts its router at ROUTER_HOST:ROUTER_PORT (SLIME_HOST_IP=ROUTER_HOST below); the agent
# runner and the plug-ins generate with SGLANG_URL.
if [[ -z "${SGLANG_URL:-}" ]]; then
  if [[ "${ROUTER_HOST}" == *:* ]]; then
    SGLANG_URL="http://[${ROUTER_HOST}]:${ROUTER_PORT}" # IPv6, bracketed as slime does
  else
    SGLANG_URL="http://${ROUTER_HOST}:${ROUTER_PORT}"
  fi
fi
if [[ -n "${SLIME_HOST_IP:-}" && "${SLIME_HOST_IP}" != "${ROUTER_HOST}" ]]; then
  krl_die "SLIME_HOST_IP=${SLIME_HOST_IP} differs from ROUTER_HOST=${ROUTER_HOST}: slime binds its router to SLIME_HOST_IP; set only ROUTER_HOST"
fi
SLIME_HOST_IP="${ROUTER_HOST}" # exported to the trainer and its Ray job (krl_write_trainer_cmd)
: "${TOKENIZER:=${HF_CKPT}}"
export RUN_DIR TMUX_SESSION
RAY_TMPDIR="${RAY_TMPDIR:-${TMPDIR:-/tmp}/ray-${RUN_NAME}}"

# --- model args and argument groups -----------------------------------------------------------
krl_load_model_args
# shellcheck source=../configs/run/kbench_multiturn.sh
source "${KRL_REPO_ROOT}/configs/run/kbench_multiturn.sh"
# shellcheck source=../configs/servers/eval_server.sh
source "${KRL_REPO_ROOT}/configs/servers/eval_server.sh"
# shellcheck source=../configs/servers/buffer_server.sh
source "${KRL_REPO_ROOT}/configs/servers/buffer_server.sh"
PLACEMENT_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node "${TRAIN_GPUS}" --rollout-num-gpus "${ROLLOUT_GPUS}")
[[ "${COLOCATE}" == 1 ]] && PLACEMENT_ARGS+=(--colocate)
TRAIN_ARGS=("${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${EVAL_ARGS[@]}" "${PERF_ARGS[@]}"
  "${GRPO_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${SGLANG_ARGS[@]}" "${WANDB_ARGS[@]}" "${MISC_ARGS[@]}"
  "${PLACEMENT_ARGS[@]}")

# --- checks before anything starts ------------------------------------------------------------
ports=("${EVAL_PORT}" "${BUFFER_PORT}")
[[ -z "${TRAINER_CMD}" ]] && ports+=("${RAY_PORT}" "${RAY_DASHBOARD_PORT}" "${ROUTER_PORT}")
krl_preflight_session "${ports[@]}"
krl_report_resume "${LOAD_DIR}" "${REF_LOAD}"

# --- run directory and window commands --------------------------------------------------------
krl_init_run_dir EVAL_PORT BUFFER_PORT ROUTER_HOST ROUTER_PORT RAY_PORT RAY_DASHBOARD_PORT EVAL_DEVICES \
  RAY_VISIBLE_DEVICES TRAIN_GPUS ROLLOUT_GPUS EVAL_GPUS COLOCATE ROLLOUT_TEMPERATURE N_SAMPLES_PER_PROMPT \
  RECIPE RUN_RECIPE PROMPT_DATA SGLANG_URL

# The run's recipe: the user's plus this run's URLs, data, tokenizer and temperature; read by
# the buffer's agent runner (--recipe) and by slime's plug-ins (--custom-config-path: the
# `plugins` section gets this run's buffer, eval and generate URLs).
"${PYTHON}" -m tools.run_recipe write "${RECIPE}" "${RUN_RECIPE}" \
  --set "runner.sglang_url=${SGLANG_URL}" --set "runner.eval_urls=http://127.0.0.1:${EVAL_PORT}" \
  --set "runner.prompt_data=${PROMPT_DATA}" --set "runner.tokenizer=${TOKENIZER}" \
  --set "runner.temperature=${ROLLOUT_TEMPERATURE}" \
  --set "plugins.buffer_url=http://127.0.0.1:${BUFFER_PORT}" --set "plugins.eval_urls=[http://127.0.0.1:${EVAL_PORT}]" \
  --set "plugins.sglang_url=${SGLANG_URL}" --set "plugins.policy_version_lag=${POLICY_VERSION_LAG}" ||
  krl_die "could not write the run's recipe from ${RECIPE} (see the message above)"

windows=()
if [[ -n "${ENGINE_CMD}" ]]; then
  krl_write_shell_cmd "${RUN_DIR}/cmd/engine.sh" "${ENGINE_CMD}"
  windows+=(engine)
fi
krl_write_window eval "${EVAL_CMD}" "${PYTHON}" -m eval_server "${EVAL_SERVER_ARGS[@]}"
krl_write_window buffer "${BUFFER_CMD}" "${PYTHON}" -m buffer_server "${BUFFER_SERVER_ARGS[@]}"
krl_write_trainer_cmd "${TRAIN_ENTRY}" "${TRAIN_ARGS[@]}"
windows+=(eval buffer trainer)

if [[ "${PRINT_ONLY}" == 1 ]]; then
  krl_print_windows "${windows[@]}"
  exit 0
fi

# --- start, each window gated on the previous one's health ------------------------------------
krl_health_url() {
  case "$1" in
    engine) printf '%s' "${ENGINE_HEALTH_URL}" ;;
    eval) printf 'http://127.0.0.1:%s/health' "${EVAL_PORT}" ;;
    buffer) printf 'http://127.0.0.1:%s/health' "${BUFFER_PORT}" ;;
    *) printf '' ;;
  esac
}
krl_start_windows "${windows[@]}"
exit
}
