#!/usr/bin/env bash
# What a launcher's tmux window runs: window.sh NAME RUN_DIR CMD_SCRIPT
#
# Runs CMD_SCRIPT in its own session and process group (so stop.sh can end it and everything it
# started with one signal to the group), appends everything it prints to RUN_DIR/logs/NAME.log
# while still showing it in the window, records "PID START_TIME" in RUN_DIR/pids/NAME.pid and
# the exit code in RUN_DIR/pids/NAME.rc. Ctrl-C in the window is forwarded to the group.
set -euo pipefail

name="$1"
run_dir="$2"
cmd_script="$3"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mkdir -p "${run_dir}/logs" "${run_dir}/pids"
log="${run_dir}/logs/${name}.log"
exec > >(tee -a "${log}") 2>&1

krl_info "window ${name}: starting ${cmd_script}"
# Started in the background of a non-interactive shell, setsid does not fork: $! is the new
# session's leader, whose PID is also its process group id.
setsid bash "${cmd_script}" </dev/null &
pid=$!
printf '%s %s\n' "${pid}" "$(krl_proc_start "${pid}")" >"${run_dir}/pids/${name}.pid.tmp"
mv "${run_dir}/pids/${name}.pid.tmp" "${run_dir}/pids/${name}.pid"

# shellcheck disable=SC2329  # invoked by the traps
forward() { kill -"$1" -- "-${pid}" 2>/dev/null || true; }
trap 'forward INT' INT
trap 'forward TERM' TERM HUP

rc=0
while true; do
  wait "${pid}" && rc=0 || rc=$?
  # wait returns >128 when a trapped signal interrupted it; the child may still be running.
  kill -0 "${pid}" 2>/dev/null || break
done
printf '%s\n' "${rc}" >"${run_dir}/pids/${name}.rc"
krl_info "window ${name}: command exited with code ${rc}"
exit "${rc}"
