# shellcheck shell=bash
# slime argument groups of the main run (scripts/run_kbench_multiturn.sh), in the order of
# slime's own run scripts. Sourced after configs/run/common.sh and configs/models/${MODEL}.sh.
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

# slime plug-ins of this project (dotted paths, importable in Ray workers: the project is
# pip-installed in the image and its root is on PYTHONPATH of the Ray job).
: "${ROLLOUT_FUNCTION_PATH:=slime_ext.slime_plugins.rollout.generate_rollout}"
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
  --prompt-data "${PROMPT_DATA}"
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

EVAL_ARGS=(
  --eval-interval 20
  --eval-prompt-data kernelbench_holdout "${EVAL_PROMPT_DATA}"
  --n-samples-per-eval-prompt 1
  --eval-max-response-len "${MAX_RESPONSE_LEN}"
)

GRPO_ARGS=(
  --advantage-estimator grpo
  --disable-grpo-std-normalization
  --use-kl-loss
  --kl-loss-coef 0.00
  --kl-loss-type low_var_kl
  --entropy-coef 0.00
  --eps-clip 0.2
  --eps-clip-high 0.28
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${LR}"
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
  --clip-grad 0.05
)

SGLANG_ARGS=(
  --rollout-num-gpus-per-engine "${ROLLOUT_GPUS_PER_ENGINE}"
  --sglang-mem-fraction-static "${SGLANG_MEM_FRACTION:-0.7}"
  --sglang-router-port "${ROUTER_PORT}"   # slime starts its router on this port at the node IP
)

# PERF_ARGS, WANDB_ARGS, MISC_ARGS: shared with the other runs.
# shellcheck source=shared_args.sh
source "${KRL_REPO_ROOT}/configs/run/shared_args.sh"
