# shellcheck shell=bash
# Flags of the rollout buffer window (python -m buffer_server --help lists them all). The agent
# runner's settings come from the `runner` section of the run's recipe (RUN_DIR/recipe.yaml, the
# user's recipe with this run's SGLang and eval URLs, data and tokenizer filled in).
# shellcheck disable=SC2034  # used by the script that sources this file
: "${BUFFER_MAX_STALENESS:=1}"
: "${BUFFER_GROUP_TIMEOUT_S:=600}"
: "${BUFFER_DROP_ZERO_VARIANCE:=1}"   # 0 keeps groups whose rewards are all equal (dry run)
BUFFER_SERVER_ARGS=(
  --host 127.0.0.1
  --port "${BUFFER_PORT}"
  --db "${RUN_DIR}/rollout_buffer.sqlite"
  --group-size "${N_SAMPLES_PER_PROMPT}"
  --max-staleness "${BUFFER_MAX_STALENESS}"
  --group-timeout-s "${BUFFER_GROUP_TIMEOUT_S}"
  --recipe "${RUN_RECIPE}"
)
if [[ "${BUFFER_DROP_ZERO_VARIANCE}" == 0 ]]; then
  BUFFER_SERVER_ARGS+=(--no-drop-zero-variance)
fi
