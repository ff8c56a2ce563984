# shellcheck shell=bash
# slime argument groups shared by the main run and the SFT run (sourced by
# configs/run/kbench_multiturn.sh and configs/run/sft.sh): parallelism and batching, W&B, misc.
# shellcheck disable=SC2034  # the arrays are used by the script that sources this file

: "${MAX_TOKENS_PER_GPU:=16384}"
: "${ATTENTION_BACKEND:=flash}"   # Megatron --attention-backend: flash | fused | unfused | local | auto
# Megatron fuses the weight-gradient GEMM with gradient accumulation through apex's
# fused_weight_gradient_mlp_cuda (in the slime image); 0 turns it off where apex is missing.
: "${GRAD_ACCUM_FUSION:=1}"

PERF_ARGS=(--tensor-model-parallel-size "${TP}")
# Sequence parallelism splits along the TP group: with TP=1 Megatron turns it off with a warning.
if ((TP > 1)); then
  PERF_ARGS+=(--sequence-parallel)
fi
PERF_ARGS+=(
  --pipeline-model-parallel-size "${PP}"
  --context-parallel-size "${CP}"
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
  --use-dynamic-batch-size
  --max-tokens-per-gpu "${MAX_TOKENS_PER_GPU}"
)
if [[ "${GRAD_ACCUM_FUSION}" == 0 ]]; then
  PERF_ARGS+=(--no-gradient-accumulation-fusion)
fi

# A resumed run (same RUN_NAME) loads Megatron's LR schedule from the checkpoint, and Megatron
# refuses one that differs from this launch's: a run extended with a larger NUM_ROLLOUT changes the
# schedule's length (slime sizes it from num_rollout) and stopped at the first step (H200, 2026-11-27:
# "class input value 208 and checkpoint value 192 for total number of iterations do not match").
#   args        this launch's settings define the schedule; its position (steps done) still
#               comes from the checkpoint (--override-opt_param-scheduler)
#   checkpoint  the checkpoint's schedule is kept whatever this launch says
#               (--use-checkpoint-opt_param-scheduler)
#   strict      Megatron's check: a resume must repeat the schedule's settings exactly
: "${LR_SCHEDULE_ON_RESUME:=args}"
case "${LR_SCHEDULE_ON_RESUME}" in
  args) OPTIMIZER_ARGS+=(--override-opt_param-scheduler) ;;
  checkpoint) OPTIMIZER_ARGS+=(--use-checkpoint-opt_param-scheduler) ;;
  strict) ;;
  *) krl_die "LR_SCHEDULE_ON_RESUME=${LR_SCHEDULE_ON_RESUME}: use args, checkpoint or strict" ;;
esac

WANDB_ARGS=()
if [[ -n "${WANDB_PROJECT}" ]]; then
  WANDB_ARGS=(--use-wandb --wandb-project "${WANDB_PROJECT}" --wandb-group "${WANDB_GROUP}")
fi

MISC_ARGS=(
  --attention-dropout 0.0
  --hidden-dropout 0.0
  --accumulate-allreduce-grads-in-fp32
  --attention-softmax-in-fp32
  --attention-backend "${ATTENTION_BACKEND}"
)
