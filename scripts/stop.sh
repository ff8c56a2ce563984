#!/usr/bin/env bash
# Stop one run started by scripts/run_kbench_multiturn.sh (or the CPU dry run):
#   scripts/stop.sh RUN_DIR          (or RUN_NAME=... [RUNS_ROOT=...] scripts/stop.sh)
#
# What it stops, and nothing else:
#   1. each window's process group recorded in RUN_DIR/pids/*.pid, if the recorded process is
#      still the same one (PID and start time): SIGTERM, SIGKILL after STOP_TIMEOUT_S;
#   2. every remaining process carrying this run's id (KRL_RUN_ID in its environment: the Ray
#      daemons and workers of this run's Ray head, and anything else the windows started);
#   3. the run's tmux session, on the tmux server that holds it (its socket path, recorded in
#      RUN_DIR/run.env when the session was created), whatever $TMUX says here;
#   and first, for a multi-node run (EVAL_FLEET), its Ray-placed eval servers and its processes on
#   every other node (scripts/stop_node.sh there, run through the run's Ray cluster).
# It never kills by process name and never touches another run, another tmux session or Ray
# cluster. Safe to run twice.
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

krl_help_or_continue "${BASH_SOURCE[0]}" "${1:-}"
case "${1:-}" in
  -*)
    printf '[%s] ERROR: unknown option %s (usage: scripts/stop.sh RUN_DIR; --help)\n' "$(date +%H:%M:%S)" "$1" >&2
    exit 2
    ;;
esac
if (($# > 1)); then
  printf '[%s] ERROR: one RUN_DIR only, got %s arguments (usage: scripts/stop.sh RUN_DIR)\n' "$(date +%H:%M:%S)" "$#" >&2
  exit 2
fi
run_dir="${1:-}"
if [[ -z "${run_dir}" ]]; then
  [[ -n "${RUN_NAME:-}" ]] || krl_die "usage: scripts/stop.sh RUN_DIR (or set RUN_NAME)"
  run_dir="${RUNS_ROOT:-${KRL_REPO_ROOT}/runs}/${RUN_NAME}"
fi
[[ -f "${run_dir}/run.env" ]] || krl_die "${run_dir}/run.env not found: not a run directory of the launcher"

# Read the run's identity without exporting it (our own children must not look like the run's).
unset KRL_RUN_ID
run_env() { (
  # shellcheck source=/dev/null
  source "${run_dir}/run.env"
  printf '%s' "${!1-}"
); }
KRL_RUN_ID="$(run_env KRL_RUN_ID)"
TMUX_SESSION="$(run_env TMUX_SESSION)"
# The socket path of the server that holds the session, recorded when it was created (the
# launcher's TMUX_SOCKET for runs that recorded none)
TMUX_SOCKET="$(run_env TMUX_SERVER)"
[[ -n "${TMUX_SOCKET}" ]] || TMUX_SOCKET="$(run_env TMUX_SOCKET)"
RUN_DIR="${run_dir}"
: "${STOP_TIMEOUT_S:=30}"
[[ -n "${KRL_RUN_ID}" ]] || krl_die "${run_dir}/run.env has no KRL_RUN_ID"

# 0. Multi-node (EVAL_FLEET): the run's eval servers and every other node's processes of the run,
#    through the run's Ray head while it still runs (scripts/stop_node.sh on each node).
if [[ -n "$(run_env EVAL_FLEET)" && "$(run_env EVAL_FLEET)" != 0 ]]; then
  ray_port="$(run_env RAY_PORT)"
  "${PYTHON:-python3}" -m slime_ext.cluster.nodes stop --run-id "${KRL_RUN_ID}" \
    --address "127.0.0.1:${ray_port}" || krl_info "the run's other nodes could not be reached through Ray (stop them there: scripts/stop_node.sh ${KRL_RUN_ID})"
fi

# 1. Window process groups, the trainer first (it holds the clients of the other two).
for name in trainer buffer eval engine; do
  krl_stop_group "${name}" "${run_dir}/pids/${name}.pid" "${STOP_TIMEOUT_S}"
done
for pidfile in "${run_dir}"/pids/*.pid; do
  [[ -e "${pidfile}" ]] || continue
  name="$(basename "${pidfile}" .pid)"
  krl_stop_group "${name}" "${pidfile}" "${STOP_TIMEOUT_S}"
done

# 2. Anything else that carries the run id (e.g. Ray daemons started in their own sessions).
krl_stop_run_pids "${STOP_TIMEOUT_S}"

# 3. The tmux session.
if command -v tmux >/dev/null && krl_tmux has-session -t "=${TMUX_SESSION}" 2>/dev/null; then
  krl_tmux kill-session -t "=${TMUX_SESSION}"
  krl_info "tmux session ${TMUX_SESSION} closed"
fi
date -u +%FT%TZ >"${run_dir}/stopped"
krl_info "run ${run_dir} stopped"
exit
}
