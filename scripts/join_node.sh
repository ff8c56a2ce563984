#!/usr/bin/env bash
# Join this node to a multi-node run's Ray cluster (the head runs scripts/run_kbench_multiturn.sh
# with EVAL_FLEET=N and MASTER_ADDR set to its address; it prints this command with its run id):
#   scripts/join_node.sh HEAD_ADDR:RAY_PORT RUN_ID --eval-gpus 0,1,2,3   # a node for evaluation
#   scripts/join_node.sh HEAD_ADDR:RAY_PORT RUN_ID --gpus 8              # a node for slime (training, engines)
# --eval-gpus IDS offers those GPUs to the run's eval fleet only (Ray resource krl_eval, not Ray
# GPUs, so slime never places work on them); --gpus N offers N GPUs to slime's placement groups;
# both may be given (different GPUs). --eval-cpu N offers N CPU-mode eval servers (tests, no GPU).
# The node's Ray daemons carry the run id (KRL_RUN_ID): scripts/stop.sh on the head stops them
# here through Ray, and scripts/stop_node.sh RUN_ID stops them from this node. Env: RAY_TMPDIR
# (default $TMPDIR/ray-RUN_ID), PYTHON.
set -euo pipefail
{

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
krl_help_or_continue "${BASH_SOURCE[0]}" "${1:-}"
(($# >= 2)) || krl_die "usage: scripts/join_node.sh HEAD_ADDR:RAY_PORT RUN_ID [--eval-gpus IDS] [--gpus N] [--eval-cpu N]"
head_address="$1"
run_id="$2"
shift 2
[[ "${head_address}" == *:* ]] || krl_die "HEAD_ADDR:RAY_PORT, got ${head_address} (the head's MASTER_ADDR and RAY_PORT)"
[[ "${run_id}" =~ ^[A-Za-z0-9._-]+$ ]] || krl_die "RUN_ID ${run_id}: the run id the head printed (letters, digits, . _ -)"
eval_gpus=""
gpus=0
eval_cpu=0
while (($#)); do
  case "$1" in
    --eval-gpus) eval_gpus="${2:?--eval-gpus needs GPU ids, e.g. 0,1}"; shift 2 ;;
    --gpus) gpus="${2:?--gpus needs a count}"; shift 2 ;;
    --eval-cpu) eval_cpu="${2:?--eval-cpu needs a count}"; shift 2 ;;
    *) krl_die "unknown option $1 (see --help)" ;;
  esac
done
[[ -z "${eval_gpus}" || "${eval_gpus}" =~ ^[0-9]+(,[0-9]+)*$ ]] || krl_die "--eval-gpus ${eval_gpus}: GPU ids like 0,1,2"
[[ "${gpus}" =~ ^[0-9]+$ && "${eval_cpu}" =~ ^[0-9]+$ ]] || krl_die "--gpus and --eval-cpu take counts"
eval_slots=${eval_cpu}
if [[ -n "${eval_gpus}" ]]; then
  IFS=, read -ra ids <<<"${eval_gpus}"
  eval_slots=$((eval_slots + ${#ids[@]}))
fi
((eval_slots + gpus > 0)) || krl_die "offer something: --eval-gpus IDS, --gpus N or --eval-cpu N"
if [[ -n "${eval_gpus}" ]] && command -v nvidia-smi >/dev/null; then
  count="$(nvidia-smi -L | grep -c '^GPU ' || true)"
  for id in "${ids[@]}"; do
    ((id < count)) || krl_die "--eval-gpus ${eval_gpus}: this node has ${count} GPU(s), no GPU ${id}"
  done
fi
why="$(krl_py -c "import sys; from krl_common.urls import unreachable; print(unreachable(sys.argv[1]) or '')" "${head_address}")"
[[ -z "${why}" ]] || krl_die "the run's Ray head at ${head_address}: ${why} (is the run started there, MASTER_ADDR its reachable address, the port open?)"

# Everything ray start launches carries the run id and this node's eval GPUs.
export KRL_RUN_ID="${run_id}" KRL_EVAL_GPU_IDS="${eval_gpus}"
export RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=true
ray_args=(--address "${head_address}" --num-gpus "${gpus}" --temp-dir "${RAY_TMPDIR:-${TMPDIR:-/tmp}/ray-${run_id}}"
  --disable-usage-stats)
((eval_slots > 0)) && ray_args+=(--resources "{\"krl_eval\": ${eval_slots}}")
krl_info "joining run ${run_id} at ${head_address}: ${gpus} GPU(s) for slime, eval GPUs '${eval_gpus}', ${eval_cpu} CPU eval slot(s)"
if [[ -n "${JOIN_PRINT_ONLY:-}" ]]; then
  printf 'ray start'
  printf ' %q' "${ray_args[@]}"
  printf '\n'
  exit 0
fi
ray start "${ray_args[@]}"
krl_info "joined; stop this node's part of the run with: scripts/stop_node.sh ${run_id} (scripts/stop.sh on the head does it too)"
exit
}
