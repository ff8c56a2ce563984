#!/usr/bin/env bash
# Stop one run's processes on this node: every process whose environment carries KRL_RUN_ID=RUN_ID
# (the Ray daemons scripts/join_node.sh started for the run, the eval servers and workers they
# started), SIGTERM then SIGKILL after STOP_TIMEOUT_S (default 30). Nothing else is touched.
#   scripts/stop_node.sh RUN_ID
# The head's scripts/stop.sh runs it on every other node of a multi-node run through Ray.
set -euo pipefail
{

# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
krl_help_or_continue "${BASH_SOURCE[0]}" "${1:-}"
[[ -n "${1:-}" && "$1" != -* ]] || krl_die "usage: scripts/stop_node.sh RUN_ID"
KRL_RUN_ID="$1"
krl_stop_run_pids "${STOP_TIMEOUT_S:-30}"
krl_info "run ${KRL_RUN_ID} stopped on $(hostname)"
exit
}
