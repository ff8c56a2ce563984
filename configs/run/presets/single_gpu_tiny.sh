# shellcheck shell=bash
# Preset: the whole main run on ONE GPU with the tiny Qwen3 model (slime_ext/dev_engine/tiny_model.py), to
# check the training half end to end before a real run (docs/LAUNCH.md "One GPU, tiny model").
#
#   PRESET=single_gpu_tiny TRAIN_ONLY=1 scripts/run_kbench_multiturn.sh
#       slime --debug-train-only: no SGLang; an `engine` window serves HF_CKPT with the embedded
#       /generate engine (python -m slime_ext.dev_engine.engine, ENGINE_ARGS for more flags), the buffer's
#       agent runner generates with it, slime trains on GPU 0 from REF_LOAD (weights are not pushed
#       back to the engine: it keeps sampling from the initial model).
#   PRESET=single_gpu_tiny scripts/run_kbench_multiturn.sh
#       the same inside the slime image with SGLang colocated on GPU 0 (COLOCATE=1, no engine window),
#       on the hd64 size of the tiny model (head dim 64: SGLang's attention kernels need 64 or 128,
#       the default size has 16) with SGLang's triton attention backend.
#
# Sourced by configs/run/common.sh when PRESET=single_gpu_tiny; every line is a default, so a
# variable set by the caller wins (e.g. CREDIT=per_turn, MODE=in_slime without TRAIN_ONLY).
# Before the first run (CPU is enough):
#   python -m slime_ext.dev_engine.tiny_model --out "$HF_CKPT"               # TRAIN_ONLY=1
#   python -m slime_ext.dev_engine.tiny_model --size hd64 --out "$HF_CKPT"   # with SGLang
#   scripts/convert_hf_to_megatron.sh --hf-dir "$HF_CKPT" --out "$REF_LOAD" --dtype bf16

# --- model: configs/models/qwen3-tiny{,-hd64}.sh are generated from the tiny model's config.json ---
if [[ "${TRAIN_ONLY:-0}" == 1 ]]; then
  : "${MODEL:=qwen3-tiny}"         # head dim 16: the embedded engine serves it, SGLang could not
  : "${HF_NAME:=Qwen3-tiny}"       # HF_CKPT=${CKPT_ROOT}/Qwen3-tiny, REF_LOAD=${HF_CKPT}_torch_dist
else
  : "${MODEL:=qwen3-tiny-hd64}"    # tiny_model --size hd64: head dim 64, which SGLang serves
  : "${HF_NAME:=Qwen3-tiny-hd64}"  # HF_CKPT=${CKPT_ROOT}/Qwen3-tiny-hd64, REF_LOAD=${HF_CKPT}_torch_dist
fi

# --- one GPU: training on GPU 0, the eval server beside it on GPU 0 -------------------------------
: "${TRAIN_GPUS:=1}"
: "${ROLLOUT_GPUS:=0}"
: "${EVAL_GPUS:=0}"
# the eval server shares the training GPU: the first of CUDA_VISIBLE_DEVICES when the caller set it
_krl_first_gpu="${CUDA_VISIBLE_DEVICES:-0}"
: "${EVAL_DEVICES:=${_krl_first_gpu%%,*}}"
: "${TP:=1}"                 # and so no --sequence-parallel (configs/run/shared_args.sh)
: "${CP:=1}"
: "${PP:=1}"
if [[ "${TRAIN_ONLY:-0}" == 1 ]]; then
  : "${ENGINE:=tiny}"        # the runner's engine: SGLANG_URL defaults to it
  # SCRIPTED MIX (labelled in the engine's log and every reply's meta_info): the random model
  # writes no code, so the engine answers each turn with a bundled correct candidate with
  # probability 0.5, else a wrong one, log-probs teacher-forced by the model; GRPO groups get
  # reward variance. ENGINE_ARGS="--device cuda" samples from the model instead.
  : "${ENGINE_ARGS:=--device cuda --scripted-mix 0.5}"
else
  : "${COLOCATE:=1}"         # SGLang shares GPU 0 with training (slime --colocate)
  : "${SGLANG_MEM_FRACTION:=0.4}"  # leaves room for Megatron and the eval server on the same GPU
  # SGLang's attention backend (slime --sglang-attention-backend, configs/run/kbench_multiturn.sh);
  # set but empty: no flag, SGLang chooses.
  : "${SGLANG_ATTENTION_BACKEND=triton}"
  # SGLANG_EXTRA_ARGS (configs/run/kbench_multiturn.sh, empty by default) adds more SGLang server
  # flags as slime-prefixed words, e.g. "--sglang-sampling-backend pytorch --sglang-disable-cuda-graph"
  # as tests/gpu/test_sglang_serve_gpu.py serves.
fi

# --- a few small steps -----------------------------------------------------------------------
: "${ROLLOUT_BATCH_SIZE:=4}"    # prompts per step
: "${N_SAMPLES_PER_PROMPT:=4}"  # episodes per prompt; global batch = 4 x 4 = 16 trajectories
: "${NUM_ROLLOUT:=3}"
: "${SAVE_INTERVAL:=3}"         # saves after the last step (slime also always saves the last one)
: "${EVAL_INTERVAL:=0}"         # no evaluation
: "${MAX_RESPONSE_LEN:=2048}"   # tokens per turn (a bundled candidate is up to ~1500 tiny-tokenizer tokens)
: "${MAX_CONTEXT_LEN:=8192}"    # prompt + every turn (a sample prompt is ~700 tiny-tokenizer tokens)
: "${MAX_TOKENS_PER_GPU:=16384}"
: "${LR:=1e-4}"                 # large enough that 3 steps visibly move the bf16 weights
: "${ATTENTION_BACKEND:=auto}"  # Transformer Engine picks a kernel for the tiny head sizes (16; hd64: 64)
: "${GRAD_ACCUM_FUSION:=0}"     # also runs outside the slime image, where apex is missing
: "${PROMPT_DATA:=${DATA_DIR:-${KRL_REPO_ROOT}/data}/sample_prompts.jsonl}"  # python -m tools.sample_prompts --out "$PROMPT_DATA"
: "${KL_LOSS_COEF:=0.01}"       # non-zero KL to the reference model (REF_LOAD)
: "${BUFFER_DROP_ZERO_VARIANCE:=0}"  # a random model's group rewards are usually all equal
: "${CREDIT:=trajectory}"       # episode.reward.credit of the run recipe: trajectory | per_turn | trloo
# The agent runner's budgets follow slime's lengths; the caller's RECIPE_SET words come last (win).
RECIPE_SET="runner.max_new_tokens=${MAX_RESPONSE_LEN} episode.max_new_tokens_per_turn=${MAX_RESPONSE_LEN} runner.max_context_tokens=${MAX_CONTEXT_LEN} runner.concurrency=8 ${RECIPE_SET:-}"
