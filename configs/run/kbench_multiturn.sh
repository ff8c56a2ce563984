# shellcheck shell=bash
# slime argument groups of the main run (scripts/run_kbench_multiturn.sh), in the order of
# slime's own run scripts. Sourced after configs/run/common.sh and configs/models/${MODEL}.sh, with
# MODE (buffer | in_slime), TRAIN_ONLY, RUN_RECIPE and TRAIN_PROMPT_DATA set by the launcher.
# Multi-turn settings (max_turns, gamma, credit mode, reward shaping, early stop) and the
# sampling temperature live in the recipe YAML (${RECIPE}); the launcher reads the temperature
# from it (ROLLOUT_TEMPERATURE) and writes the run's copy RUN_RECIPE that slime and the buffer read.
# shellcheck disable=SC2034  # the arrays are used by the script that sources this file

: "${ROLLOUT_BATCH_SIZE:=32}"      # prompts (GRPO groups) per rollout step
: "${NUM_ROLLOUT:=3000}"
: "${MAX_RESPONSE_LEN:=8192}"      # per generation call
: "${MAX_CONTEXT_LEN:=32768}"      # prompt + all turns
: "${LR:=1e-6}"
: "${SAVE_INTERVAL:=20}"
: "${EVAL_INTERVAL:=20}"           # 0: no evaluation
: "${KL_LOSS_COEF:=0.00}"          # 0: no KL loss, and no reference model in the trainers

# slime plug-ins of this project (dotted paths, importable in Ray workers: the project is
# pip-installed in the image and its root is on PYTHONPATH of the Ray job), docs/SLIME_PLUGINS.md.
# MODE=buffer: our rollout function reads whole groups from the buffer server's agent runner.
# MODE=in_slime: slime's own rollout function calls our generate (one episode per sample) and RM.
BUFFER_ROLLOUT_FUNCTION=slime_ext.slime_plugins.rollout.generate_rollout
if [[ "${MODE}" == in_slime ]]; then
  : "${ROLLOUT_FUNCTION_PATH:=slime.rollout.sglang_rollout.generate_rollout}"  # slime's default
else
  : "${ROLLOUT_FUNCTION_PATH:=${BUFFER_ROLLOUT_FUNCTION}}"
fi
: "${EVAL_PROMPT_DATA:=${PROMPT_DATA}}"   # the plug-ins evaluate its holdout records (docs/SLIME_PLUGINS.md)

CKPT_ARGS=(
  --hf-checkpoint "${HF_CKPT}"
  --ref-load "${REF_LOAD}"
  --load "${LOAD_DIR}"
  --save "${SAVE_DIR}"
  --save-interval "${SAVE_INTERVAL}"
)

ROLLOUT_ARGS=(
  --rollout-function-path "${ROLLOUT_FUNCTION_PATH}"
  --custom-config-path "${RUN_RECIPE}"
  --custom-reward-post-process-path slime_ext.slime_plugins.reward_post.post_process
  --custom-rollout-log-function-path slime_ext.slime_plugins.rollout_log.log_rollout
  --custom-eval-rollout-log-function-path slime_ext.slime_plugins.rollout_log.log_eval_rollout
)
if [[ "${MODE}" == in_slime ]]; then
  # slime's data source hands each sample the record's `reference` as prompt (no chat template:
  # the episode renders the chat) and `instance_id` as label; it reads every record of the file,
  # so it gets the train split only. Evaluation runs the buffer-mode function's evaluation path
  # (holdout records, straight against the router and the eval servers; no buffer involved).
  ROLLOUT_ARGS+=(
    --custom-generate-function-path slime_ext.slime_plugins.generate.generate
    --custom-rm-path slime_ext.slime_plugins.generate.reward
    --eval-function-path "${BUFFER_ROLLOUT_FUNCTION}"
    --prompt-data "${TRAIN_PROMPT_DATA}"
    --label-key instance_id
  )
else
  ROLLOUT_ARGS+=(--prompt-data "${PROMPT_DATA}")  # slime builds its data source; the buffer feeds training
fi
ROLLOUT_ARGS+=(
  --input-key reference
  --rollout-shuffle
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}"
  --rollout-max-response-len "${MAX_RESPONSE_LEN}"
  --rollout-max-context-len "${MAX_CONTEXT_LEN}"
  --rollout-temperature "${ROLLOUT_TEMPERATURE}"
  --global-batch-size "$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))"
  --balance-data
)
# SEED (scripts/run_kbench_multiturn.sh): one replicate of an A/B design (tools.ab_runs)
[[ -n "${SEED:-}" ]] && ROLLOUT_ARGS+=(--seed "${SEED}" --rollout-seed "${SEED}")

EVAL_ARGS=()
if [[ "${EVAL_INTERVAL}" != 0 ]]; then
  EVAL_ARGS=(
    --eval-interval "${EVAL_INTERVAL}"
    --eval-prompt-data kernelbench_holdout "${EVAL_PROMPT_DATA}"
    --n-samples-per-eval-prompt 1
    --eval-max-response-len "${MAX_RESPONSE_LEN}"
  )
fi

GRPO_ARGS=(
  --advantage-estimator grpo
  --disable-grpo-std-normalization
  --entropy-coef 0.00
  --eps-clip 0.2
  --eps-clip-high 0.28
)
# --use-kl-loss only with a weight: with it slime loads the reference model (--ref-load) into
# every trainer (its memory and one more forward pass a step) even at coefficient 0, and loads
# it last, which its non-colocated weight push then sends to the engines of a resumed run
# (slime_ext/slime_plugins/resume_weights.py undoes that). --ref-load stays: a fresh run starts
# from it.
[[ "${KL_LOSS_COEF}" =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] ||
  krl_die "KL_LOSS_COEF=${KL_LOSS_COEF}: use a non-negative number (0: no KL loss)"
if awk -v x="${KL_LOSS_COEF}" 'BEGIN { exit !(x + 0 != 0) }'; then
  GRPO_ARGS+=(--use-kl-loss --kl-loss-coef "${KL_LOSS_COEF}" --kl-loss-type low_var_kl)
fi

# MISMATCH=mrs: slime's own rollout correction (its examples/train_infer_mismatch_helper/mis.py)
# rejects whole samples whose trainer-vs-rollout log-probabilities disagree (sequence geometric
# mean of the ratio outside [1/MRS_BOUND, MRS_BOUND]; any token ratio below 1e-4) and truncates
# the token importance weights at 2 (TIS). Its settings are top-level keys of the run recipe
# (MISMATCH_SETTINGS, each written only where the recipe does not set it). Off by default.
MISMATCH_ARGS=()
MISMATCH_SETTINGS=()
case "${MISMATCH:-off}" in
  off) ;;
  mrs)
    MISMATCH_ARGS=(--use-tis --custom-tis-function-path examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp)
    MISMATCH_SETTINGS=(use_tis=true tis_level=token tis_mode=truncate tis_upper_bound=2.0 tis_lower_bound=null
      use_rs=true rs_level=geometric "rs_lower_bound=$(awk -v b="${MRS_BOUND:-1.01}" 'BEGIN{print 1/b}')"
      "rs_upper_bound=${MRS_BOUND:-1.01}" rs_veto_threshold=1.0e-4 tis_batch_normalize=false)
    ;;
  *) krl_die "MISMATCH=${MISMATCH}: use MISMATCH=off or MISMATCH=mrs" ;;
esac

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${LR}"
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
  --clip-grad 0.05
)

SGLANG_ARGS=()
if [[ "${TRAIN_ONLY}" == 1 ]]; then
  # slime starts no SGLang engine and no router, pushes no weights, and still calls the rollout
  # function every step (the agent runner generates with SGLANG_URL meanwhile).
  SGLANG_ARGS=(--debug-train-only)
else
  SGLANG_ARGS=(
    --rollout-num-gpus-per-engine "${ROLLOUT_GPUS_PER_ENGINE}"
    --sglang-mem-fraction-static "${SGLANG_MEM_FRACTION:-0.7}"
    --sglang-router-port "${ROUTER_PORT}"   # slime starts its router on this port at SLIME_HOST_IP
  )
  # SGLang's --attention-backend (e.g. triton, fa3, flashinfer); empty: SGLang chooses.
  if [[ -n "${SGLANG_ATTENTION_BACKEND:-}" ]]; then
    SGLANG_ARGS+=(--sglang-attention-backend "${SGLANG_ATTENTION_BACKEND}")
  fi
  # Any other SGLang server flags, slime-prefixed, as words (e.g. "--sglang-sampling-backend pytorch").
  read -ra _sglang_extra <<<"${SGLANG_EXTRA_ARGS:-}"
  SGLANG_ARGS+=("${_sglang_extra[@]}")
fi

# PERF_ARGS, WANDB_ARGS, MISC_ARGS: shared with the other runs.
# shellcheck source=shared_args.sh
source "${KRL_REPO_ROOT}/configs/run/shared_args.sh"
