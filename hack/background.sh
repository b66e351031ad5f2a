#!/usr/bin/env bash
# Runs a step of make test in the background at the lowest CPU priority (nice 19), so that
# it takes only the CPU the tiers in the foreground leave idle: downloads, guests booting
# under TCG, tests waiting on a daemon. make test starts the guest image, the one-node
# cluster's Kubernetes binaries and the fuzz smoke this way (see docs/testing.md).
#
#   hack/background.sh start OWNER_PID NAME CMD...   start CMD; OWNER_PID is make's pid
#   hack/background.sh wait NAME                     wait for it, print its output, exit
#                                                    with its status
#   hack/background.sh wait --advisory NAME          the same, but a failure is reported
#                                                    and not returned: for a cache fill
#                                                    whose tier builds it itself if need be
#
# A job follows the process that started it: should OWNER_PID end without waiting for it
# (an earlier tier failed and make stopped), the job and everything it started are
# stopped, so nothing is left running. A job that is waited for is given back the normal
# priority: nothing else is running in the foreground then.
#
# Each job runs in a session of its own; its output goes to $STATE/NAME.log, its exit
# status to $STATE/NAME.rc, its process group to $STATE/NAME.pgid.
# Knob: BACKGROUND_STATE (${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/background).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=background
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

STATE=${BACKGROUND_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator/background}

usage() { die "usage: $0 start OWNER_PID NAME CMD... | wait [--advisory] NAME"; }

valid_name() { [[ $1 =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "job name '$1': lower-case letters, digits and '-' only"; }

# job OWNER RCFILE LOG CMD...: the body of the job's session. The watch stops the whole
# session (this shell, the command and its children) once the owner is gone.
job() {
  local owner=$1 rcfile=$2 logfile=$3
  shift 3
  (
    while kill -0 "$owner" 2>/dev/null; do sleep 2; done
    printf '[background] stopped: pid %s, which started this job, has ended without waiting for it\n' "$owner" >>"$logfile"
    kill -TERM -- "-$$"
  ) &
  local watch=$! rc=0
  nice -n 19 "$@" </dev/null >>"$logfile" 2>&1 || rc=$?
  kill "$watch" 2>/dev/null || true
  printf '%s\n' "$rc" >"$rcfile.tmp" && mv -f "$rcfile.tmp" "$rcfile"
}

cmd_start() {
  (($# >= 3)) || usage
  local owner=$1 name=$2
  shift 2
  if ! [[ $owner =~ ^[0-9]+$ ]] || ! kill -0 "$owner" 2>/dev/null; then die "owner pid '$owner' is not a running process"; fi
  valid_name "$name"
  mkdir -p "$STATE"
  local rcfile=$STATE/$name.rc logfile=$STATE/$name.log
  if [[ -s $STATE/$name.pgid ]] && kill -0 -- "-$(<"$STATE/$name.pgid")" 2>/dev/null && [[ ! -s $rcfile ]]; then
    die "job $name is already running (process group $(<"$STATE/$name.pgid")); its log: $logfile"
  fi
  rm -f "$rcfile" "$STATE/$name.pgid"
  printf '[background] %s started at %s, nice 19: %s\n' "$name" "$(date +%T)" "$*" >"$logfile"
  # setsid: a session and process group of the job's own, which the watch can stop whole
  # and which no signal to make's process group reaches by accident.
  setsid bash -c "$(declare -f job); echo \$\$ >'$STATE/$name.pgid'; job \"\$@\"" job "$owner" "$rcfile" "$logfile" "$@" \
    </dev/null >/dev/null 2>&1 &
  wait_until 10 "job $name to record its process group" test -s "$STATE/$name.pgid"
  log "$name: started in the background (nice 19, process group $(<"$STATE/$name.pgid")); log $logfile"
}

cmd_wait() {
  local advisory=false
  if [[ ${1:-} == --advisory ]]; then
    advisory=true
    shift
  fi
  (($# == 1)) || usage
  local name=$1
  valid_name "$name"
  local rcfile=$STATE/$name.rc logfile=$STATE/$name.log pgid=""
  [[ -s $STATE/$name.pgid ]] || die "no job $name was started (no $STATE/$name.pgid)"
  pgid=$(<"$STATE/$name.pgid")
  if [[ ! -s $rcfile ]]; then
    renice -n 0 -g "$pgid" >/dev/null 2>&1 || true
    log "$name: waiting for it to finish (process group $pgid, log $logfile)"
    local t0=$SECONDS
    while [[ ! -s $rcfile ]]; do
      if ! kill -0 -- "-$pgid" 2>/dev/null; then
        [[ -s $rcfile ]] && break
        sed 's/^/  /' "$logfile" >&2 || true
        die "$name: its process group $pgid is gone without an exit status; its log is above ($logfile)"
      fi
      sleep 1
    done
    log "$name: finished after $((SECONDS - t0))s of waiting"
  fi
  local rc
  rc=$(<"$rcfile")
  sed "s/^/[$name] /" "$logfile"
  if [[ $rc == 0 ]]; then
    log "$name: passed"
    return 0
  fi
  if $advisory; then
    log "$name: the background run failed (exit $rc); the tier that needed it built it itself; its log is above ($logfile)"
    return 0
  fi
  log "$name: failed (exit $rc); its log is above ($logfile)"
  return "$rc"
}

case ${1:-} in
start) shift && cmd_start "$@" ;;
wait) shift && cmd_wait "$@" ;;
*) usage ;;
esac
