#!/usr/bin/env bash
# What a launcher's tmux window runs: window.sh NAME RUN_DIR CMD_SCRIPT
#
# Runs CMD_SCRIPT in its own session and process group (so stop.sh can end it and everything it
# started with one signal to the group), appends everything it prints to RUN_DIR/logs/NAME.log
# while still showing it in the window, records "PID START_TIME" in RUN_DIR/pids/NAME.pid and
# the exit code in RUN_DIR/pids/NAME.rc. Ctrl-C in the window ends the command: SIGTERM to its
# group (a background command of a non-interactive shell starts with SIGINT ignored, so SIGINT
# itself could not reach it).
set -euo pipefail
# The whole script is one block, read before it runs: editing the file (git pull) while it runs
# cannot change what a running copy does.
{

name="$1"
run_dir="$2"
cmd_script="$3"
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

mkdir -p "${run_dir}/logs" "${run_dir}/pids"
log="${run_dir}/logs/${name}.log"
# tee ignores Ctrl-C and the hang-up the pane's processes get when this shell exits, and this
# shell waits for it at the end: the command's last lines always reach the log.
exec > >(
  trap '' INT HUP
  exec tee -a "${log}"
) 2>&1
tee_pid=$!

krl_info "window ${name}: starting ${cmd_script}"
# Started in the background of a non-interactive shell, setsid does not fork: $! is the new
# session's leader, whose PID is also its process group id.
setsid bash "${cmd_script}" </dev/null &
pid=$!
printf '%s %s\n' "${pid}" "$(krl_proc_start "${pid}")" >"${run_dir}/pids/${name}.pid.tmp"
mv "${run_dir}/pids/${name}.pid.tmp" "${run_dir}/pids/${name}.pid"

interrupted=0
# shellcheck disable=SC2329  # invoked by the traps
forward() {
  interrupted=1
  kill -"$1" -- "-${pid}" 2>/dev/null || true
}
trap 'forward TERM' INT TERM HUP

# A forwarded signal cuts `wait` short (status > 128); wait again for the command's own status
# (bash keeps it until then). 127 means that status was already collected.
rc=0
while true; do
  interrupted=0
  previous="${rc}"
  wait "${pid}" && rc=0 || rc=$?
  if ((rc == 127 && previous != 0)); then
    rc="${previous}"
  fi
  ((interrupted)) || break
done
printf '%s\n' "${rc}" >"${run_dir}/pids/${name}.rc"
krl_info "window ${name}: command exited with code ${rc}"
exec >&- 2>&-
wait "${tee_pid}" 2>/dev/null || true
exit "${rc}"
}
