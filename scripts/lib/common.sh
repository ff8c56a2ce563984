# shellcheck shell=bash
# Shared shell functions of the launchers (sourced, never run): messages, health waits, port
# checks, PID files with start times, process-group stops and tmux windows.
#
# Rules kept here: "is it up" is decided by the service's own /health, never by sleep; a process
# is only ever signalled if its PID file was written by this run and its start time still
# matches (a reused PID is left alone); tmux calls go through `krl_tmux`, which honours
# TMUX_SOCKET (a private tmux server, e.g. in tests) so other tmux sessions are never touched.

KRL_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KRL_REPO_ROOT="$(cd "${KRL_LIB_DIR}/../.." && pwd)"
# The port settings of a run's Ray head (scripts/lib/ray_train.sh): checked free before a start,
# kept in run.env and passed to the trainer window (defaults in configs/run/common.sh).
KRL_RAY_PORT_VARS=(RAY_PORT RAY_DASHBOARD_PORT RAY_CLIENT_PORT RAY_AGENT_PORT)
export KRL_LIB_DIR KRL_REPO_ROOT

krl_info() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
# krl_py ARGS...: this checkout's Python tools (`krl_py -m tools.X`), whatever the caller's
# directory and whatever other copy of the project is installed.
krl_py() { PYTHONPATH="${KRL_REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" "${PYTHON:-python3}" "$@"; }
krl_die() {
  printf '[%s] ERROR: %s\n' "$(date +%H:%M:%S)" "$*" >&2
  exit 1
}

# krl_usage SCRIPT: print SCRIPT's header comment (its usage and settings).
krl_usage() { sed -n '2,/^set -euo/p' "$1" | sed '$d; s/^# \{0,1\}//'; }

# krl_help_or_continue SCRIPT ARG: -h/--help as ARG prints SCRIPT's usage (exit 0).
krl_help_or_continue() {
  if [[ "${2:-}" == -h || "${2:-}" == --help ]]; then
    krl_usage "$1"
    exit 0
  fi
}

# krl_no_arguments SCRIPT ARGS...: a launcher configured by environment variables takes no
# arguments: -h/--help prints its usage (exit 0); anything else is refused (exit 2).
krl_no_arguments() {
  local script="$1"
  shift
  (($#)) || return 0
  if [[ "$1" == -h || "$1" == --help ]]; then
    krl_usage "${script}"
    exit 0
  fi
  printf '[%s] ERROR: unknown argument(s): %s; settings are environment variables (%s --help, docs/LAUNCH.md)\n' \
    "$(date +%H:%M:%S)" "$*" "${script##*/}" >&2
  exit 2
}

# krl_tmux ARGS...: tmux on this run's server. TMUX_SOCKET names a private server (-L NAME), or
# is its socket path when it contains a slash (-S PATH); empty = the default server.
krl_tmux() {
  if [[ "${TMUX_SOCKET:-}" == */* ]]; then
    tmux -S "${TMUX_SOCKET}" "$@"
  elif [[ -n "${TMUX_SOCKET:-}" ]]; then
    tmux -L "${TMUX_SOCKET}" "$@"
  else
    tmux "$@"
  fi
}

# krl_attach_command: how to attach to this run's session.
krl_attach_command() {
  local flag=""
  if [[ "${TMUX_SOCKET:-}" == */* ]]; then
    flag=" -S ${TMUX_SOCKET}"
  elif [[ -n "${TMUX_SOCKET:-}" ]]; then
    flag=" -L ${TMUX_SOCKET}"
  fi
  printf 'tmux%s attach -t %s' "${flag}" "${TMUX_SESSION}"
}

# krl_port_free HOST PORT: success if nothing listens on HOST:PORT (a bind test).
krl_port_free() {
  "${PYTHON:-python3}" - "$1" "$2" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

# krl_http_ok URL: success if GET URL answers 200 within 3 s.
krl_http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null
  else
    "${PYTHON:-python3}" -c 'import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=3).status == 200 else 1)
except Exception:
    sys.exit(1)' "$1"
  fi
}

# krl_proc_start PID: the process's start time (clock ticks since boot; /proc/PID/stat field 22),
# empty if the process does not exist. Used with the PID to recognise the same process later.
krl_proc_start() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  stat="${stat##*) }" # drop "pid (comm) ": comm may contain spaces
  # shellcheck disable=SC2086  # word splitting intended: the fields of /proc/PID/stat
  set -- ${stat}
  printf '%s' "${20}"
}

# krl_pid_alive PIDFILE: success if the process recorded in PIDFILE ("PID START") still runs.
krl_pid_alive() {
  local pid start
  [[ -s "$1" ]] || return 1
  read -r pid start <"$1" || true
  [[ -n "${pid}" && -n "${start}" ]] || return 1
  [[ "$(krl_proc_start "${pid}")" == "${start}" ]]
}

# krl_group_alive PGID: success if any process of the process group still exists.
krl_group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# krl_wait_healthy NAME URL TIMEOUT_S [PIDFILE]: poll URL until it answers 200. Fails (with the
# tail of the window's log) when TIMEOUT_S passes or when the process in PIDFILE has exited; the
# one-line reason, naming the fix, is left in KRL_WAIT_FAILURE.
krl_wait_healthy() {
  local name="$1" url="$2" timeout_s="$3" pidfile="${4:-}"
  local deadline=$((SECONDS + timeout_s)) seen_pid=0 log="${RUN_DIR:-.}/logs/$1.log"
  krl_info "waiting for ${name} at ${url} (up to ${timeout_s} s)"
  while true; do
    if krl_http_ok "${url}"; then
      krl_info "${name} is healthy"
      return 0
    fi
    if [[ -n "${pidfile}" ]]; then
      if [[ -s "${pidfile}" ]]; then
        seen_pid=1
        if ! krl_pid_alive "${pidfile}"; then
          krl_info "${name} exited before becoming healthy; last log lines:"
          tail -n 30 "${log}" >&2 2>/dev/null || true
          KRL_WAIT_FAILURE="${name} exited before answering ${url}: fix the error at the end of ${log} (shown above), then start again"
          return 1
        fi
      fi
    fi
    if ((SECONDS >= deadline)); then
      if ((seen_pid == 0)) && [[ -n "${pidfile}" ]]; then
        krl_info "${name} never started (no PID file ${pidfile})"
        KRL_WAIT_FAILURE="${name} never started (no ${pidfile}): see ${log}"
      else
        krl_info "${name} not healthy after ${timeout_s} s; last log lines:"
        tail -n 30 "${log}" >&2 2>/dev/null || true
        KRL_WAIT_FAILURE="${name} not healthy at ${url} within HEALTH_TIMEOUT_S=${timeout_s} s: see ${log}; if it is only slow to start, raise HEALTH_TIMEOUT_S"
      fi
      return 1
    fi
    sleep 0.5
  done
}

# krl_wait_file FILE TIMEOUT_S: wait until FILE exists (e.g. a window's PID file).
krl_wait_file() {
  local deadline=$((SECONDS + $2))
  until [[ -s "$1" ]]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# krl_write_cmd FILE ARGV...: write a window's command as a small bash script (each argument
# quoted), preceded by the environment lines in the array KRL_CMD_ENV ("export K=V" lines).
krl_write_cmd() {
  local file="$1"
  shift
  {
    printf '#!/usr/bin/env bash\n# written by the launcher; the window runs it with scripts/lib/window.sh\n'
    printf 'set -euo pipefail\n'
    printf 'cd %q\n' "${KRL_REPO_ROOT}"
    local line
    for line in "${KRL_CMD_ENV[@]}"; do
      printf '%s\n' "${line}"
    done
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
  } >"${file}.tmp"
  chmod +x "${file}.tmp"
  mv "${file}.tmp" "${file}"
}

# krl_write_shell_cmd FILE STRING: like krl_write_cmd for a user-given shell command string.
krl_write_shell_cmd() {
  local file="$1" cmd="$2"
  {
    printf '#!/usr/bin/env bash\nset -euo pipefail\n'
    printf 'cd %q\n' "${KRL_REPO_ROOT}"
    local line
    for line in "${KRL_CMD_ENV[@]}"; do
      printf '%s\n' "${line}"
    done
    printf '%s\n' "${cmd}"
  } >"${file}.tmp"
  chmod +x "${file}.tmp"
  mv "${file}.tmp" "${file}"
}

# krl_write_window NAME OVERRIDE ARGV...: RUN_DIR/cmd/NAME.sh runs the shell string OVERRIDE when
# it is set (tests, the dry run), else ARGV.
krl_write_window() {
  local name="$1" override="$2"
  shift 2
  if [[ -n "${override}" ]]; then
    krl_write_shell_cmd "${RUN_DIR}/cmd/${name}.sh" "${override}"
  else
    krl_write_cmd "${RUN_DIR}/cmd/${name}.sh" "$@"
  fi
}

# krl_env_line NAME: an "export NAME=value" line (value quoted) for KRL_CMD_ENV.
krl_env_line() { printf 'export %s=%q' "$1" "${!1-}"; }

# krl_open_window SESSION NAME: run RUN_DIR/cmd/NAME.sh in tmux window NAME (created with the
# session if it does not exist yet) through window.sh (log tee, PID file, own process group).
krl_open_window() {
  local session="$1" name="$2"
  local launch
  launch="$(printf '%q ' bash "${KRL_LIB_DIR}/window.sh" "${name}" "${RUN_DIR}" "${RUN_DIR}/cmd/${name}.sh")"
  if krl_tmux has-session -t "=${session}" 2>/dev/null; then
    krl_tmux new-window -d -t "=${session}:" -n "${name}" -c "${KRL_REPO_ROOT}" "${launch}"
  else
    krl_tmux new-session -d -s "${session}" -n "${name}" -c "${KRL_REPO_ROOT}" -x 200 -y 50 "${launch}"
    # The server that holds the session, by its socket path: scripts/stop.sh addresses it there
    # whatever $TMUX says where stop.sh runs (a pane of another server, `tmux -L other`)
    printf 'export TMUX_SERVER=%q\n' "$(krl_tmux display-message -p -t "=${session}:" '#{socket_path}')" \
      >>"${RUN_DIR}/run.env"
  fi
  # Keep a window whose command ended, so its last lines can be read after a crash.
  krl_tmux set-option -w -t "${session}:${name}" remain-on-exit on >/dev/null 2>&1 || true
}

# krl_stop_group NAME PIDFILE TIMEOUT_S: SIGTERM the process group recorded in PIDFILE (only if
# the recorded process is still the same one), SIGKILL it after TIMEOUT_S.
krl_stop_group() {
  local name="$1" pidfile="$2" timeout_s="$3" pid start
  [[ -s "${pidfile}" ]] || return 0
  read -r pid start <"${pidfile}" || true
  if ! krl_pid_alive "${pidfile}"; then
    # The leader is gone (or the PID now belongs to another process): signal the group only if
    # its members still carry this run's id (they were started by us).
    if krl_group_alive "${pid}" && krl_group_is_ours "${pid}"; then
      kill -TERM -- "-${pid}" 2>/dev/null || true
    else
      return 0
    fi
  else
    krl_info "stopping ${name} (process group ${pid})"
    kill -TERM -- "-${pid}" 2>/dev/null || true
  fi
  local deadline=$((SECONDS + timeout_s))
  while krl_group_alive "${pid}" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if krl_group_alive "${pid}"; then
    krl_info "${name} still running after ${timeout_s} s: SIGKILL"
    kill -KILL -- "-${pid}" 2>/dev/null || true
  fi
}

# krl_run_pids [PGID]: PIDs of the processes (of process group PGID, if given) whose environment
# carries KRL_RUN_ID=<this run>: the windows' commands and everything they started, unless a
# child scrubbed its environment. This process and its children are never listed.
krl_run_pids() {
  [[ -n "${KRL_RUN_ID:-}" ]] || return 0
  "${PYTHON:-python3}" - "KRL_RUN_ID=${KRL_RUN_ID}" "${1:-}" "$$" <<'PY'
import os, sys
marker, pgid, me = sys.argv[1].encode(), sys.argv[2], int(sys.argv[3])
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in (me, os.getpid(), os.getppid()):
        continue
    try:
        with open(f"/proc/{name}/environ", "rb") as f:
            env = f.read().split(b"\0")
        if marker not in env:
            continue
        if pgid and str(os.getpgid(int(name))) != pgid:
            continue
    except OSError:
        continue
    print(name)
PY
}

# krl_stop_run_pids TIMEOUT_S: SIGTERM every process carrying this run's id (krl_run_pids), SIGKILL
# what is left after TIMEOUT_S.
krl_stop_run_pids() {
  local left deadline
  mapfile -t left < <(krl_run_pids)
  ((${#left[@]})) || return 0
  krl_info "stopping ${#left[@]} remaining process(es) of run ${KRL_RUN_ID}: ${left[*]}"
  kill -TERM "${left[@]}" 2>/dev/null || true
  deadline=$((SECONDS + $1))
  while ((SECONDS < deadline)); do
    mapfile -t left < <(krl_run_pids)
    ((${#left[@]})) || break
    sleep 0.2
  done
  if ((${#left[@]})); then
    krl_info "SIGKILL ${left[*]}"
    kill -KILL "${left[@]}" 2>/dev/null || true
  fi
}

# krl_group_is_ours PGID: success if a member of the group carries this run's id, so a reused
# process group id is never signalled.
krl_group_is_ours() { [[ -n "$(krl_run_pids "$1")" ]]; }

# ------------------------------------------------------------------ launcher steps (shared by
# run_kbench_multiturn.sh and run_sft.sh). They read RUN_DIR, RUN_NAME, TMUX_SESSION, KRL_RUN_ID.

# krl_load_model_args: MODEL_ARGS from MODEL_ARGS_FILE (configs/models/${MODEL}.sh); left empty
# when TRAINER_CMD replaces the trainer (no Megatron flags needed then).
krl_load_model_args() {
  # shellcheck disable=SC2034  # a global, read by the calling script (the file assigns it too)
  MODEL_ARGS=()
  [[ -n "${TRAINER_CMD:-}" ]] && return 0
  [[ -f "${MODEL_ARGS_FILE}" ]] ||
    krl_die "model args not found: ${MODEL_ARGS_FILE} (generate them with the converter tools, or set MODEL_ARGS_FILE)"
  # shellcheck source=/dev/null
  source "${MODEL_ARGS_FILE}"
}

# krl_preflight_session PORT...: tmux present, the session not running yet, the ports free.
# PRINT_ONLY=1 starts nothing, so it needs neither tmux nor free ports (it prints on any machine,
# e.g. beside a running run); it still refuses a session of the same name.
krl_preflight_session() {
  if [[ "${PRINT_ONLY:-0}" == 1 ]] && ! command -v tmux >/dev/null; then
    krl_info "PRINT_ONLY: tmux not found (needed to start the run: apt-get install tmux)"
  else
    command -v tmux >/dev/null || krl_die "tmux not found (apt-get install tmux)"
    if krl_tmux has-session -t "=${TMUX_SESSION}" 2>/dev/null; then
      krl_die "tmux session ${TMUX_SESSION} already exists: attach (tmux attach -t ${TMUX_SESSION}) or stop it (scripts/stop.sh ${RUN_DIR})"
    fi
  fi
  if [[ "${PRINT_ONLY:-0}" == 1 ]]; then
    (($#)) && krl_info "PRINT_ONLY: ports $* not checked (a real start checks that they are free)"
    return 0
  fi
  local port
  for port in "$@"; do
    krl_port_free 127.0.0.1 "${port}" || krl_die "port ${port} is in use (change the *_PORT setting or stop what uses it)"
  done
}

# krl_check_inputs: what the trainer reads at start, checked before anything starts
# (tools/preflight.py --gate: slime and Megatron-LM sources and Ray first, then HF checkpoint and
# tokenizer, REF_LOAD, LOAD_DIR, MODEL_ARGS against
# config.json, prompt data). Exits with one line naming the first problem and its fix.
krl_check_inputs() {
  local msg
  msg="$(SLIME_DIR="${SLIME_DIR}" MEGATRON_DIR="${MEGATRON_DIR}" HF_CKPT="${HF_CKPT}" REF_LOAD="${REF_LOAD}" LOAD_DIR="${LOAD_DIR}" MODEL="${MODEL}" \
    MODEL_ARGS_FILE="${MODEL_ARGS_FILE}" PROMPT_DATA="${PROMPT_DATA}" \
    krl_py -m tools.preflight --gate 2>&1)" || krl_die "${msg##*$'\n'}"
}

# krl_report_resume LOAD_DIR FALLBACK: say whether slime's --load will resume (it does when
# latest_checkpointed_iteration.txt exists there) or start from FALLBACK.
krl_report_resume() {
  if [[ -s "$1/latest_checkpointed_iteration.txt" ]]; then
    krl_info "resuming from $1 iteration $(cat "$1/latest_checkpointed_iteration.txt")"
  else
    krl_info "no checkpoint in $1: starting from $2"
  fi
}

# krl_print_only_scratch: with PRINT_ONLY=1 for a run the caller did not name (its RUN_NAME made
# from the clock, new at every call), the run directory written to print the windows is removed
# at exit, and RUNS_ROOT too when this call created it: printing leaves nothing behind. A named
# run (RUN_NAME or RUN_DIR set) keeps the scripts it printed there, to inspect.
krl_print_only_scratch() {
  [[ "${PRINT_ONLY:-0}" == 1 && "${KRL_RUN_NAMED:-1}" == 0 && ! -e "${RUN_DIR}" ]] || return 0
  local cleanup
  cleanup="rm -rf -- $(printf '%q' "${RUN_DIR}")"
  [[ -e "${RUNS_ROOT}" ]] || cleanup+="; rmdir -- $(printf '%q' "${RUNS_ROOT}") 2>/dev/null || true"
  # shellcheck disable=SC2064  # the paths are fixed now, on purpose
  trap "${cleanup}" EXIT
}

# krl_init_run_dir VAR...: create RUN_DIR/{logs,pids,cmd}, forget the PID files of an earlier
# start, write RUN_DIR/run.env (the listed variables; stop.sh reads it) and the base KRL_CMD_ENV.
krl_init_run_dir() {
  mkdir -p "${RUN_DIR}/logs" "${RUN_DIR}/pids" "${RUN_DIR}/cmd"
  rm -f "${RUN_DIR}"/pids/*.pid "${RUN_DIR}"/pids/*.rc "${RUN_DIR}/stopped"
  local var
  for var in RUN_NAME RUN_DIR TMUX_SESSION TMUX_SOCKET KRL_RUN_ID RAY_TMPDIR "$@"; do
    krl_env_line "${var}"
    printf '\n'
  done >"${RUN_DIR}/run.env.tmp"
  mv "${RUN_DIR}/run.env.tmp" "${RUN_DIR}/run.env"
  # The windows see this run's CUDA_VISIBLE_DEVICES, not the tmux server's: a server started by
  # another run (one with CUDA_VISIBLE_DEVICES=0) would otherwise pass that run's GPUs on.
  local gpus="unset CUDA_VISIBLE_DEVICES"
  [[ -v CUDA_VISIBLE_DEVICES ]] && gpus="$(krl_env_line CUDA_VISIBLE_DEVICES)"
  KRL_CMD_ENV=("${gpus}" "$(krl_env_line KRL_RUN_ID)" "$(krl_env_line PATH)" "export PYTHONUNBUFFERED=1"
    "export PYTHONPATH=$(printf '%q' "${KRL_REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}")")
}

# krl_run_plan KIND: the run's plan (tools/run_plan.py: the one place of its rules) as the
# variables RAY_NUM_GPUS, RAY_VISIBLE_DEVICES and, for KIND rl, ROLLOUT_GPUS, EVAL_DEVICES,
# SGLANG_URL, EVAL_URL, BUFFER_URL, ENGINE_HEALTH_URL, SLIME_HOST_IP and KRL_PORTS (the ports a
# start needs free). The physical ids come from CUDA_VISIBLE_DEVICES when it is set, so the
# launcher never reaches a GPU the caller hid.
krl_run_plan() {
  local out var settings=()
  for var in TRAIN_GPUS ROLLOUT_GPUS EVAL_GPUS ROLLOUT_GPUS_PER_ENGINE COLOCATE TP CP PP TRAIN_ONLY TRAINER_CMD \
    EVAL_DEVICES EVAL_FLEET PRINT_ONLY MODE ENGINE ENGINE_CMD ENGINE_PORT ENGINE_HEALTH_URL SGLANG_URL ROUTER_HOST ROUTER_PORT \
    SLIME_HOST_IP EVAL_PORT BUFFER_PORT "${KRL_RAY_PORT_VARS[@]}"; do
    settings+=("${var}=${!var-}")
  done
  out="$(env "${settings[@]}" PYTHONPATH="${KRL_REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" \
    "${PYTHON:-python3}" -m tools.run_plan --kind "$1" --shell)" ||
    krl_die "no plan for these settings (the line above says why)"
  eval "${out}"
}

# krl_write_trainer_cmd ENTRY ARGS...: the trainer window's script: TRAINER_CMD when set (tests,
# dry run), else ray_train.sh running slime's ENTRY (train.py, train_async.py) with ARGS on
# RAY_NUM_GPUS GPUs (CUDA_VISIBLE_DEVICES=RAY_VISIBLE_DEVICES). SLIME_HOST_IP=ROUTER_HOST: the
# address slime's get_host_info() returns, where it binds its SGLang router and engines.
krl_write_trainer_cmd() {
  local env_lines=("${KRL_CMD_ENV[@]}") var
  for var in SLIME_DIR MEGATRON_DIR MASTER_ADDR "${KRL_RAY_PORT_VARS[@]}" RAY_TMPDIR RAY_NUM_GPUS; do
    KRL_CMD_ENV+=("$(krl_env_line "${var}")")
  done
  KRL_CMD_ENV+=("export CUDA_VISIBLE_DEVICES=${RAY_VISIBLE_DEVICES}"
    "$(krl_env_line KRL_REPO_ROOT)" "export SLIME_HOST_IP=$(printf '%q' "${ROUTER_HOST}")"
    "$(krl_env_line TRAINER_PYTHONPATH)")
  krl_write_window trainer "${TRAINER_CMD:-}" bash "${KRL_LIB_DIR}/ray_train.sh" "$@"
  KRL_CMD_ENV=("${env_lines[@]}")
}

# krl_print_windows WINDOW...: show the window scripts (PRINT_ONLY=1).
krl_print_windows() {
  local w
  for w in "$@"; do
    printf '### window %s (%s)\n' "${w}" "${RUN_DIR}/cmd/${w}.sh"
    cat "${RUN_DIR}/cmd/${w}.sh"
  done
}

# krl_start_windows WINDOW...: open the windows in order; after each, wait for its PID file and,
# when `krl_health_url WINDOW` (defined by the caller) names one, for its /health. On failure
# everything started so far is stopped (scripts/stop.sh) and the script exits 1.
krl_start_windows() {
  local w url
  for w in "$@"; do
    krl_info "starting window ${w}"
    krl_open_window "${TMUX_SESSION}" "${w}"
    url="$(krl_health_url "${w}")"
    KRL_WAIT_FAILURE="window ${w} did not start (no ${RUN_DIR}/pids/${w}.pid after 60 s): see ${RUN_DIR}/logs/${w}.log"
    if ! krl_wait_file "${RUN_DIR}/pids/${w}.pid" 60 ||
      { [[ -n "${url}" ]] && ! krl_wait_healthy "${w}" "${url}" "${HEALTH_TIMEOUT_S:-600}" "${RUN_DIR}/pids/${w}.pid"; }; then
      krl_info "start aborted: stopping what this run started"
      bash "${KRL_REPO_ROOT}/scripts/stop.sh" "${RUN_DIR}" || true
      krl_die "${KRL_WAIT_FAILURE}"
    fi
  done
  cat <<MSG
Run ${RUN_NAME} started in tmux session ${TMUX_SESSION} (windows: $*).
  attach:  $(krl_attach_command)
  logs:    ${RUN_DIR}/logs/
  stop:    scripts/stop.sh ${RUN_DIR}
MSG
}
