# shellcheck shell=bash
# Settings shared by every launcher (sourced by scripts/*.sh after scripts/lib/common.sh). Every
# value is an environment variable with a default; set it before calling a script to override
# it. Paths default to where the slime Docker image puts things (slime at /root/slime,
# Megatron-LM at /root/Megatron-LM) and where slime's own run scripts keep checkpoints
# (/root/<model>...).
#
# PRESET=NAME sources configs/run/presets/NAME.sh first: a preset gives other defaults (its own
# `: "${X:=...}"` lines), which variables set by the caller still override.

if [[ -n "${PRESET:-}" ]]; then
  [[ -f "${KRL_REPO_ROOT}/configs/run/presets/${PRESET}.sh" ]] ||
    krl_die "unknown PRESET=${PRESET}: configs/run/presets/ has $(cd "${KRL_REPO_ROOT}/configs/run/presets" && ls -- *.sh)"
  # shellcheck source=/dev/null
  source "${KRL_REPO_ROOT}/configs/run/presets/${PRESET}.sh"
fi

# --- code -------------------------------------------------------------------------------------
: "${SLIME_DIR:=/root/slime}"            # slime checkout (train.py, train_async.py)
: "${MEGATRON_DIR:=/root/Megatron-LM}"   # Megatron-LM checkout (put on PYTHONPATH for Ray jobs)
: "${PYTHON:=python3}"                   # interpreter for this project's services
: "${TRAINER_PYTHONPATH:=}"               # put first on the Ray job's PYTHONPATH (e.g. a NumPy 1.x for Megatron)

# --- model and checkpoints --------------------------------------------------------------------
: "${MODEL:=qwen3-8B}"                                   # configs/models/${MODEL}.sh gives MODEL_ARGS
: "${MODEL_ARGS_FILE:=${KRL_REPO_ROOT}/configs/models/${MODEL}.sh}"
: "${CKPT_ROOT:=/root}"                                  # where the base checkpoints live
: "${HF_NAME:=Qwen3-8B}"
: "${HF_CKPT:=${CKPT_ROOT}/${HF_NAME}}"                  # HF weights + tokenizer (SGLang, tokenizer)
: "${REF_LOAD:=${CKPT_ROOT}/${HF_NAME}_torch_dist}"      # Megatron torch_dist of the base model

# --- data, recipe, run directory --------------------------------------------------------------
: "${DATA_DIR:=${KRL_REPO_ROOT}/data}"
: "${PROMPT_DATA:=${DATA_DIR}/kernelbench.jsonl}"  # prompt records (tools/prepare_kernelbench.py)
: "${RECIPE:=${KRL_REPO_ROOT}/configs/recipe/kernelbench_multiturn.yaml}"
: "${BACKEND:=}"                  # kernel language, triton | cuda: the run recipe's episode.backend (empty: RECIPE's)
: "${RUNS_ROOT:=${KRL_REPO_ROOT}/runs}"                  # one directory per run below it
# KRL_RUN_NAMED=1 when the caller named the run (otherwise RUN_NAME is invented from the clock;
# a launcher that invents its own sets KRL_RUN_NAMED before)
if [[ -z "${KRL_RUN_NAMED:-}" ]]; then
  KRL_RUN_NAMED=0
  if [[ -n "${RUN_NAME:-}${RUN_DIR:-}" ]]; then KRL_RUN_NAMED=1; fi
fi
: "${RUN_NAME:=kbench-mt-$(date +%Y%m%d-%H%M%S)}"
: "${RUN_DIR:=${RUNS_ROOT}/${RUN_NAME}}"
: "${TMUX_SESSION:=${RUN_NAME}}"
: "${SAVE_DIR:=${RUN_DIR}/checkpoints}"                  # --save; resumed from when it has a checkpoint
: "${LOAD_DIR:=${SAVE_DIR}}"                             # --load

# --- GPU split (one node) ---------------------------------------------------------------------
# TRAIN_GPUS for Megatron (TP x CP x PP x DP), ROLLOUT_GPUS for SGLang engines of
# ROLLOUT_GPUS_PER_ENGINE each, EVAL_GPUS for the kernel eval server (the last ones).
# COLOCATE=1: training and SGLang share the TRAIN_GPUS (slime --colocate), ROLLOUT_GPUS unused.
: "${TRAIN_GPUS:=4}"
: "${ROLLOUT_GPUS:=2}"
: "${ROLLOUT_GPUS_PER_ENGINE:=1}"
: "${EVAL_GPUS:=2}"
: "${COLOCATE:=0}"
: "${TP:=2}"
: "${CP:=2}"
: "${PP:=1}"

# --- ports (loopback) -------------------------------------------------------------------------
: "${EVAL_PORT:=18188}"
: "${BUFFER_PORT:=8889}"
: "${ROUTER_PORT:=30000}"        # slime starts its SGLang router on this port ...
# ... at the address slime's get_host_info() returns: $SLIME_HOST_IP when set, else an address it
# probes itself. The launcher chooses it once here (SLIME_HOST_IP if the caller set it, else the
# node's first IPv4 address, as slime prefers IPv4) and exports SLIME_HOST_IP=ROUTER_HOST to the
# trainer and its Ray job, so the router and SGLANG_URL agree by construction.
: "${ROUTER_HOST:=${SLIME_HOST_IP:-$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' || true)}}"
: "${ROUTER_HOST:=127.0.0.1}"
: "${ENGINE_PORT:=30010}"        # ENGINE=tiny: the embedded /generate engine (loopback)
: "${RAY_PORT:=6379}"
: "${RAY_DASHBOARD_PORT:=8265}"
# Ray's client server and dashboard agent: fixed ports by default, so two runs on one machine
# (CUDA_VISIBLE_DEVICES=0,1 and =2,3) need their own, as they need their own RAY_PORT; not in
# Ray's worker port range 10002-19999 (ray start refuses them there)
: "${RAY_CLIENT_PORT:=10001}"
: "${RAY_AGENT_PORT:=52365}"
: "${MASTER_ADDR:=127.0.0.1}"

# --- health gating ----------------------------------------------------------------------------
: "${HEALTH_TIMEOUT_S:=600}"     # per service
: "${STOP_TIMEOUT_S:=30}"        # SIGTERM -> SIGKILL grace per process group

# --- Weights & Biases (off unless WANDB_PROJECT is set; the key comes from the environment
# or `wandb login`, never from a file of this repository) ----------------------------------------
: "${WANDB_PROJECT:=}"
: "${WANDB_GROUP:=${RUN_NAME}}"
