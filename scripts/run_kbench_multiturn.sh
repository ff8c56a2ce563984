#!/usr/bin/env bash
# The main multi-turn GRPO run: one tmux session with these windows, each teeing to a log under
# the run directory, started in order once the previous one answers /health:
#   engine   (only with ENGINE=tiny or ENGINE_CMD) the embedded /generate engine
#   eval     kernel eval server on the EVAL_GPUS (python -m eval_server)
#   buffer   (MODE=buffer only) rollout buffer server + agent runner (python -m buffer_server)
#   trainer  Ray head + `ray job submit ... python3 train.py` of slime with this project's plug-ins
#   status   the run on one screen, refreshed (python -m tools.status RUN_DIR); with ON_EXIT=stop
#            (default) it stops the run when any window's command ends; ON_EXIT=wait only shows it
#
# Usage: scripts/run_kbench_multiturn.sh            (settings from env vars, see docs/LAUNCH.md)
#        PRINT_ONLY=1 scripts/run_kbench_multiturn.sh   (write and print the window commands only)
#        PRESET=single_gpu_tiny TRAIN_ONLY=1 scripts/run_kbench_multiturn.sh   (one GPU, tiny model)
#        scripts/stop.sh RUN_DIR                       (end the run: windows, servers, Ray)
#
# Settings: configs/run/common.sh (paths, GPU split, ports, PRESET), configs/run/kbench_multiturn.sh
# (slime argument groups), configs/servers/*.sh (server flags), configs/models/${MODEL}.sh
# (MODEL_ARGS), the recipe YAML (multi-turn, runner, rollout temperature).
# BACKEND=triton|cuda: the kernel language the model writes (the run recipe's episode.backend:
# prompts and eval requests); empty keeps the recipe's (default triton).
# MODE=buffer (default: the buffer server's agent runner plays the episodes, slime reads whole
# groups) or MODE=in_slime (slime's own rollout loop calls our generate plug-in; no buffer window).
# TRAIN_ONLY=1: slime's --debug-train-only (no SGLang engine, no weight push; MODE=buffer, with
# ENGINE=tiny or SGLANG_URL giving the runner an engine).
# Window command overrides (tests, the CPU dry run): EVAL_CMD, BUFFER_CMD, TRAINER_CMD (shell
# strings run in place of the defaults), ENGINE_CMD + ENGINE_HEALTH_URL (an extra `engine`
# window started first, e.g. the embedded CPU engine), EVAL_DEVICES=cpu.
# EVAL_FLEET=N: multi-node evaluation (docs/MULTI_NODE.md): the eval window keeps N eval servers
# that Ray places on the nodes offering eval GPUs (this node's EVAL_DEVICES, and nodes that join
# with scripts/join_node.sh), and the buffer's runner finds them through Ray; scripts/stop.sh then
# stops the run on every node.
# Resume: SAVE_DIR/LOAD_DIR default to RUN_DIR/checkpoints; re-running with the same RUN_NAME
# after scripts/stop.sh resumes from the latest checkpoint there (slime --load reads
# latest_checkpointed_iteration.txt); the launcher reports which iteration it resumes from.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
krl_no_arguments "${BASH_SOURCE[0]}" "$@"
# shellcheck source=../configs/run/common.sh
source "${KRL_REPO_ROOT}/configs/run/common.sh"

: "${PRINT_ONLY:=0}"
: "${EVAL_CMD:=}"
: "${BUFFER_CMD:=}"
: "${TRAINER_CMD:=}"
: "${ENGINE_CMD:=}"
: "${ENGINE_HEALTH_URL:=}"
: "${ENGINE:=}"                 # tiny: an `engine` window serving HF_CKPT (python -m slime_ext.dev_engine.engine)
: "${ENGINE_ARGS:=}"            # extra flags of that engine (words, e.g. "--torch-threads 4")
: "${TRAIN_ENTRY:=train.py}"   # train_async.py overlaps rollout and training (not with COLOCATE=1)
: "${MODE:=buffer}"            # buffer | in_slime (docs/SLIME_PLUGINS.md)
: "${TRAIN_ONLY:=0}"           # 1: slime --debug-train-only
: "${CREDIT:=}"                # trajectory | per_turn | trloo: the run recipe's episode.reward.credit
: "${RECIPE_SET:=}"            # more KEY=VALUE words for the run recipe (tools.run_recipe --set)
: "${SEED:=}"                  # one integer for slime's --seed/--rollout-seed and the runner's shuffle_seed; empty: their defaults
[[ -z "${SEED}" || "${SEED}" =~ ^[0-9]+$ ]] || krl_die "SEED=${SEED}: use a non-negative integer (or leave it empty)"
: "${MISMATCH:=off}"            # off | mrs: slime's mismatch rejection sampling (configs/run/kbench_multiturn.sh)
: "${EVAL_FLEET:=0}"           # N > 0: N eval servers placed by Ray across the run's nodes (docs/MULTI_NODE.md)
[[ "${EVAL_FLEET}" =~ ^[0-9]+$ ]] || krl_die "EVAL_FLEET=${EVAL_FLEET}: use the number of eval servers (0: one local eval server)"
if ((EVAL_FLEET > 0)); then
  [[ "${MODE}" == buffer ]] || krl_die "EVAL_FLEET needs MODE=buffer: the buffer's agent runner finds the Ray-placed eval servers"
  [[ -z "${TRAINER_CMD}" ]] || krl_die "EVAL_FLEET needs the Ray head of the trainer window: unset TRAINER_CMD"
fi
: "${ON_EXIT:=stop}"           # stop | wait: what the status window does when a window's command ends
[[ "${ON_EXIT}" == stop || "${ON_EXIT}" == wait ]] || krl_die "ON_EXIT=${ON_EXIT}: use ON_EXIT=stop or ON_EXIT=wait"
# Weights that sampled rollout N: N with train.py, N-1 with train_async.py (one step behind).
if [[ "${TRAIN_ENTRY}" == train_async.py ]]; then POLICY_VERSION_LAG=1; else POLICY_VERSION_LAG=0; fi
[[ "${TRAIN_ENTRY}" == train_async.py && "${COLOCATE}" == 1 ]] && krl_die "train_async.py cannot run with COLOCATE=1 (slime forbids it)"
[[ "${MODE}" == buffer || "${MODE}" == in_slime ]] || krl_die "MODE=${MODE}: use MODE=buffer or MODE=in_slime"
[[ -z "${ENGINE}" || "${ENGINE}" == tiny ]] || krl_die "ENGINE=${ENGINE}: use ENGINE=tiny, or ENGINE_CMD for another engine"
if [[ "${TRAIN_ONLY}" == 1 ]]; then
  # slime's default rollout function needs its own engines and router, which --debug-train-only
  # does not start (nor its HTTP client): only the buffer's agent runner can generate then.
  [[ "${MODE}" == buffer ]] || krl_die "TRAIN_ONLY=1 needs MODE=buffer: slime's own rollout (MODE=in_slime) needs the SGLang engines that --debug-train-only does not start"
  [[ "${COLOCATE}" == 1 ]] && krl_die "TRAIN_ONLY=1 starts no SGLang engine, so there is nothing to colocate: unset COLOCATE"
fi

# --- the recipe: one source for the multi-turn settings and the rollout temperature ----------
[[ -f "${RECIPE}" ]] || krl_die "recipe not found: ${RECIPE} (set RECIPE=...)"
if [[ -z "${ROLLOUT_TEMPERATURE:-}" ]]; then
  ROLLOUT_TEMPERATURE="$(krl_py -m tools.run_recipe get "${RECIPE}" runner.temperature --default '')" ||
    krl_die "${RECIPE} cannot be used (the line above says why)"
  [[ -n "${ROLLOUT_TEMPERATURE}" ]] ||
    krl_die "set kernel_rl.runner.temperature in ${RECIPE} (or ROLLOUT_TEMPERATURE): slime's --rollout-temperature must equal it"
fi
: "${N_SAMPLES_PER_PROMPT:=8}"  # episodes per prompt: the GRPO group (buffer --group-size, slime n)

# --- the plan: GPU split, service URLs, ports (tools/run_plan.py) -----------------------------
krl_run_plan rl

# The run id marks every process of the run (set in the window scripts only: the tmux server,
# which may be shared with other sessions, must not carry it).
KRL_RUN_ID="${RUN_NAME}-$$-${RANDOM}"
RUN_RECIPE="${RUN_DIR}/recipe.yaml"
# In-slime mode: slime's data source reads every record of its --prompt-data, so it gets the
# train split of PROMPT_DATA, written into the run directory below (unless given).
write_train_prompts=0
if [[ "${MODE}" == in_slime && -z "${TRAIN_PROMPT_DATA:-}" ]]; then
  TRAIN_PROMPT_DATA="${RUN_DIR}/prompts_train.jsonl"
  write_train_prompts=1
fi
: "${TRAIN_PROMPT_DATA:=}"

# SGLANG_URL, the service URLs, SLIME_HOST_IP (exported to the trainer and its Ray job: slime
# binds its router at ROUTER_HOST:ROUTER_PORT) and the ports came with the plan above.
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
  "${GRPO_ARGS[@]}" "${MISMATCH_ARGS[@]}" "${OPTIMIZER_ARGS[@]}" "${SGLANG_ARGS[@]}" "${WANDB_ARGS[@]}" "${MISC_ARGS[@]}"
  "${PLACEMENT_ARGS[@]}")

# --- checks before anything starts ------------------------------------------------------------
read -ra ports <<<"${KRL_PORTS}"
krl_preflight_session "${ports[@]}"
# What slime would otherwise find wrong only after Ray and Megatron started: checkpoints,
# tokenizer, model args against config.json, prompt data (one line naming the fix).
if [[ -z "${TRAINER_CMD}" && "${PRINT_ONLY}" != 1 ]]; then
  krl_check_inputs
fi
krl_report_resume "${LOAD_DIR}" "${REF_LOAD}"

# --- run directory and window commands --------------------------------------------------------
krl_print_only_scratch
krl_init_run_dir EVAL_PORT BUFFER_PORT ENGINE_PORT ROUTER_HOST ROUTER_PORT "${KRL_RAY_PORT_VARS[@]}" \
  EVAL_DEVICES RAY_VISIBLE_DEVICES TRAIN_GPUS ROLLOUT_GPUS EVAL_GPUS EVAL_FLEET COLOCATE MODE TRAIN_ONLY \
  ROLLOUT_TEMPERATURE N_SAMPLES_PER_PROMPT RECIPE RUN_RECIPE PROMPT_DATA TRAIN_PROMPT_DATA SGLANG_URL

# The run's recipe: the user's plus this run's services (URLs, data, tokenizer: its `services`
# section, read by the buffer's agent runner (--recipe) and by slime's plug-ins
# (--custom-config-path) alike) and temperature.
eval_urls="[${EVAL_URL}]"
((EVAL_FLEET > 0)) && eval_urls="[]"  # found through Ray (runner.eval_fleet below)
recipe_sets=(
  --set "services.sglang_url=${SGLANG_URL}" --set "services.eval_urls=${eval_urls}"
  --set "services.buffer_url=${BUFFER_URL}" --set "services.prompt_data=${PROMPT_DATA}"
  --set "services.tokenizer=${TOKENIZER}"
  --set "runner.temperature=${ROLLOUT_TEMPERATURE}" --set "plugins.policy_version_lag=${POLICY_VERSION_LAG}"
)
if ((EVAL_FLEET > 0)); then
  recipe_sets+=(--set "runner.eval_fleet=${KRL_RUN_ID}" --set "runner.ray_address=127.0.0.1:${RAY_PORT}")
fi
[[ -n "${CREDIT}" ]] && recipe_sets+=(--set "episode.reward.credit=${CREDIT}")
[[ -n "${SEED}" ]] && recipe_sets+=(--set "runner.shuffle_seed=${SEED}")
[[ -n "${BACKEND}" ]] && recipe_sets+=(--set "episode.backend=${BACKEND}")
for item in "${MISMATCH_SETTINGS[@]}"; do
  recipe_sets+=(--slime-default "${item}")
done
read -ra extra_sets <<<"${RECIPE_SET}"
for item in "${extra_sets[@]}"; do
  recipe_sets+=(--set "${item}")
done
krl_py -m tools.run_recipe write "${RECIPE}" "${RUN_RECIPE}" "${recipe_sets[@]}" ||
  krl_die "could not write the run's recipe from ${RECIPE} (see the message above)"
krl_info "kernel backend: $(krl_py -m tools.run_recipe get "${RUN_RECIPE}" episode.backend --default triton)" \
  "(episode.backend of ${RUN_RECIPE}; BACKEND=triton|cuda sets it)"
if ((write_train_prompts)); then
  if [[ "${PRINT_ONLY}" == 1 && ! -f "${PROMPT_DATA}" ]]; then
    krl_info "PROMPT_DATA ${PROMPT_DATA} not found: ${TRAIN_PROMPT_DATA} not written (PRINT_ONLY)"
  else
    krl_py -m tools.split_prompts "${PROMPT_DATA}" "${TRAIN_PROMPT_DATA}" --split train >&2 ||
      krl_die "could not write the train split of ${PROMPT_DATA} (see the message above; or set TRAIN_PROMPT_DATA)"
  fi
fi

windows=()
if [[ -n "${ENGINE_CMD}" || "${ENGINE}" == tiny ]]; then
  read -ra engine_args <<<"${ENGINE_ARGS}"
  krl_write_window engine "${ENGINE_CMD}" "${PYTHON}" -m slime_ext.dev_engine.engine --model "${HF_CKPT}" \
    --host 127.0.0.1 --port "${ENGINE_PORT}" "${engine_args[@]}"
  windows+=(engine)
fi
if ((EVAL_FLEET > 0)); then
  # This node offers its EVAL_DEVICES to the fleet through the Ray head the trainer window starts
  # (ray_train.sh: KRL_RAY_EVAL_RESOURCES; KRL_EVAL_GPU_IDS reaches the fleet's actors here).
  # shellcheck disable=SC2034  # KRL_RAY_EVAL_RESOURCES and KRL_EVAL_GPU_IDS are read by krl_env_line
  if [[ "${EVAL_DEVICES}" == cpu ]]; then
    fleet_devices=cpu
    KRL_RAY_EVAL_RESOURCES="{\"krl_eval\": ${EVAL_FLEET}}"
  elif [[ -z "${EVAL_DEVICES}" ]]; then  # EVAL_GPUS=0: every eval server on another node
    fleet_devices=gpu
    KRL_RAY_EVAL_RESOURCES=""
  else
    fleet_devices=gpu
    IFS=, read -ra eval_ids <<<"${EVAL_DEVICES}"
    KRL_RAY_EVAL_RESOURCES="{\"krl_eval\": ${#eval_ids[@]}}"
  fi
  # shellcheck disable=SC2034  # read by krl_env_line
  KRL_EVAL_GPU_IDS="${EVAL_DEVICES}"
  KRL_CMD_ENV+=("$(krl_env_line KRL_RAY_EVAL_RESOURCES)" "$(krl_env_line KRL_EVAL_GPU_IDS)")
  # each Ray-placed server takes the run's eval settings (its devices, work dir and reference cache
  # are its node's own)
  fleet_server_args=(--workers-per-device "${EVAL_WORKERS_PER_DEVICE}" --timeout-s "${EVAL_TIMEOUT_S}"
    --precision-policy "${EVAL_PRECISION_POLICY}" "${_eval_extra[@]}")
  krl_write_window eval "${EVAL_CMD}" "${PYTHON}" -m slime_ext.cluster.eval_fleet start --run-id "${KRL_RUN_ID}" \
    --servers "${EVAL_FLEET}" --devices "${fleet_devices}" --address "127.0.0.1:${RAY_PORT}" --status-file "${RUN_DIR}/fleet.json" \
    --server-args="${fleet_server_args[*]}"
  krl_info "multi-node: other nodes join with: scripts/join_node.sh ${MASTER_ADDR}:${RAY_PORT} ${KRL_RUN_ID} --eval-gpus IDS (or --gpus N)"
else
  krl_write_window eval "${EVAL_CMD}" "${PYTHON}" -m eval_server "${EVAL_SERVER_ARGS[@]}"
fi
windows+=(eval)
if [[ "${MODE}" == buffer ]]; then
  krl_write_window buffer "${BUFFER_CMD}" "${PYTHON}" -m buffer_server "${BUFFER_SERVER_ARGS[@]}"
  windows+=(buffer)
fi
krl_write_trainer_cmd "${TRAIN_ENTRY}" "${TRAIN_ARGS[@]}"
windows+=(trainer)
krl_write_window status "" "${PYTHON}" -m tools.status "${RUN_DIR}" --on-exit "${ON_EXIT}"
windows+=(status)

if [[ "${PRINT_ONLY}" == 1 ]]; then
  krl_print_windows "${windows[@]}"
  exit 0
fi

# --- start, each window gated on the previous one's health ------------------------------------
krl_health_url() {
  case "$1" in
    engine) printf '%s' "${ENGINE_HEALTH_URL}" ;;
    eval) ((EVAL_FLEET > 0)) || printf 'http://127.0.0.1:%s/health' "${EVAL_PORT}" ;;
    buffer) printf 'http://127.0.0.1:%s/health' "${BUFFER_PORT}" ;;
    *) printf '' ;;
  esac
}
krl_start_windows "${windows[@]}"
exit
}
