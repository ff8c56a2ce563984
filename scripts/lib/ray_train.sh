#!/usr/bin/env bash
# The trainer window of a real run: ray_train.sh ENTRY ARGS...
#
# Starts a Ray head for this run (its own temp dir, so stop.sh can find its processes), submits
# `python3 ${SLIME_DIR}/ENTRY ARGS...` as a Ray job with Megatron-LM and this repository on
# PYTHONPATH, and waits for it. Needs RAY_NUM_GPUS, RAY_PORT, RAY_DASHBOARD_PORT, RAY_CLIENT_PORT, RAY_AGENT_PORT, MASTER_ADDR,
# RAY_TMPDIR, SLIME_DIR, MEGATRON_DIR, KRL_REPO_ROOT and SLIME_HOST_IP in the environment (the
# launcher sets them). SLIME_HOST_IP goes into the job's runtime env too: the actor that starts
# slime's SGLang router binds it there (slime's get_host_info()), where the agent runner calls it.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

entry="$1"
shift
: "${NCCL_NVLS_ENABLE:=0}"  # NVLink multicast off unless the user turns it on
: "${SLIME_HOST_IP:?SLIME_HOST_IP not set (the launcher sets it to ROUTER_HOST)}"

# Kill a worker's own children (SGLang servers) when the worker exits, recursively.
export RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true
# KRL_RAY_EVAL_RESOURCES (EVAL_FLEET runs): this node's eval GPUs offered to the eval fleet (krl_eval)
eval_resources=()
[[ -n "${KRL_RAY_EVAL_RESOURCES:-}" ]] && eval_resources=(--resources "${KRL_RAY_EVAL_RESOURCES}")
ray start --head --node-ip-address "${MASTER_ADDR}" --port "${RAY_PORT}" --num-gpus "${RAY_NUM_GPUS}" \
  "${eval_resources[@]}" --temp-dir "${RAY_TMPDIR}" --disable-usage-stats \
  --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT}" \
  --ray-client-server-port "${RAY_CLIENT_PORT}" --dashboard-agent-listen-port "${RAY_AGENT_PORT}"

# The job's path: TRAINER_PYTHONPATH first (e.g. a NumPy 1.x for Megatron where the machine's default
# is 2.x), then Megatron-LM and this repository, then the caller's PYTHONPATH (packages installed
# beside the system ones reach slime's Ray workers too).
job_path="${TRAINER_PYTHONPATH:+${TRAINER_PYTHONPATH}:}${MEGATRON_DIR}:${KRL_REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
runtime_env="$(printf '{"env_vars": {"PYTHONPATH": "%s", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "%s", "KRL_RUN_ID": "%s", "SLIME_HOST_IP": "%s"}}' \
  "${job_path}" "${NCCL_NVLS_ENABLE}" "${KRL_RUN_ID}" "${SLIME_HOST_IP}")"

ray job submit --address "http://127.0.0.1:${RAY_DASHBOARD_PORT}" --runtime-env-json "${runtime_env}" \
  -- python3 "${SLIME_DIR}/${entry}" "$@"
exit
}
