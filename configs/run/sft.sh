# shellcheck shell=bash
# slime argument groups of the SFT run (scripts/run_sft.sh) on the prepared KernelBook data
# (tools/prepare_kernelbook_sft.py writes `messages` rows). Sourced after configs/run/common.sh
# and configs/models/${MODEL}.sh.
# shellcheck disable=SC2034  # the arrays are used by the script that sources this file

: "${SFT_DATA:=${DATA_DIR}/sft.jsonl}"          # python -m tools.prepare_kernelbook_sft --output
: "${SFT_BATCH_SIZE:=128}"
: "${SFT_NUM_EPOCH:=2}"
: "${SFT_LR:=1e-5}"
: "${SFT_SAVE_INTERVAL:=200}"
: "${LOSS_MASK_TYPE:=qwen3}"

CKPT_ARGS=(
  --hf-checkpoint "${HF_CKPT}"
  --ref-load "${REF_LOAD}"
  --load "${LOAD_DIR}"
  --save "${SAVE_DIR}"
  --save-interval "${SFT_SAVE_INTERVAL}"
)

SFT_ARGS=(
  --rollout-function-path slime.rollout.sft_rollout.generate_rollout
  --prompt-data "${SFT_DATA}"
  --input-key messages
  --loss-mask-type "${LOSS_MASK_TYPE}"
  --rollout-shuffle
  --num-epoch "${SFT_NUM_EPOCH}"
  --rollout-batch-size "${SFT_BATCH_SIZE}"
  --global-batch-size "${SFT_BATCH_SIZE}"
  --loss-type sft_loss
  --calculate-per-token-loss
  --disable-compute-advantages-and-returns
  --debug-train-only
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${SFT_LR}"
  --lr-decay-style cosine
  --min-lr 1e-6
  --lr-warmup-fraction 0.03
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.95
)

# PERF_ARGS, WANDB_ARGS, MISC_ARGS: shared with the other runs.
# shellcheck source=shared_args.sh
source "${KRL_REPO_ROOT}/configs/run/shared_args.sh"
