# shellcheck shell=bash
# Shared shell helpers for the scripts under hack/ (sourced, never run).
#
#   log MSG...             one line on stderr, prefixed with the script's tag and the seconds
#                          elapsed since the script started
#   die MSG...             log and exit 1
#   pid_alive FILE [NAME]  the pid recorded in FILE is a running process (named NAME)
#   wait_until SECS WHAT CMD...
#                          run CMD until it succeeds; give up after SECS naming WHAT
#   ensure_packages PKG... apt-get install --no-install-recommends whatever is missing, with
#                          maintainer scripts kept from starting daemons
#   without_fds CMD...     run CMD with the caller's descriptors beyond 0-2 closed (daemons);
#                          exec_without_fds the same in place of the shell
#   spawn PIDFILE LOG CMD... run CMD in the background, in a session of its own

: "${LOG_TAG:=hack}"
_t0=${EPOCHREALTIME/,/.}

_elapsed() {
  local now=${EPOCHREALTIME/,/.}
  awk -v a="$_t0" -v b="$now" 'BEGIN { printf "%.1f", b - a }'
}

log() { printf '[%s +%ss] %s\n' "$LOG_TAG" "$(_elapsed)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

pid_alive() {
  [[ -s $1 ]] && kill -0 "$(<"$1")" 2>/dev/null || return 1
  # with a name: a stale pid file whose pid now belongs to another program is not alive
  [[ -z ${2:-} || $(cat "/proc/$(<"$1")/comm" 2>/dev/null) == "$2" ]]
}

# Polls with a short back-off; the deadline is what bounds it, not the number of tries.
wait_until() {
  local secs=$1 what=$2 delay=0.05
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "gave up after ${secs}s waiting for $what"
      return 1
    fi
    sleep "$delay"
    delay=0.2
  done
  return 0 # an until loop's status is that of the body's last command
}

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"
  done
}

# policy-rc.d exiting 101 tells invoke-rc.d not to start anything; whatever policy file was
# there before is put back afterwards, byte for byte.
ensure_packages() {
  local missing=()
  mapfile -t missing < <(missing_packages "$@")
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  log "installing: ${missing[*]}"
  local policy=/usr/sbin/policy-rc.d saved=""
  if [[ -e $policy ]]; then
    saved=$(mktemp)
    cp -a "$policy" "$saved"
  fi
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  local rc=0 aptlog
  aptlog=$(mktemp)
  {
    apt-get -o DPkg::Lock::Timeout=600 update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
  } >"$aptlog" 2>&1 || rc=$?
  if [[ -n $saved ]]; then
    mv -f "$saved" "$policy"
  else
    rm -f "$policy"
  fi
  if ((rc != 0)); then
    tail -n 30 "$aptlog" >&2
    rm -f "$aptlog"
    die "apt-get install failed (exit $rc) for: ${missing[*]}"
  fi
  rm -f "$aptlog"
  log "installed ${#missing[@]} packages"
}

# exec_without_fds CMD...: closes every descriptor of this shell beyond 0-2, then execs CMD
# in its place; for a subshell or a background job (`exec_without_fds daemon &`, where $!
# is then the daemon's own pid). `flock FILE make ...` hands its locked descriptor down to
# every child, and a daemon keeping it holds the lock long after make has ended, so that
# everyone else waits forever.
exec_without_fds() {
  local fd
  for fd in /proc/self/fd/*; do
    fd=${fd##*/}
    if ((fd > 2)); then exec {fd}>&-; fi 2>/dev/null
  done
  exec "$@"
}

# without_fds CMD...: runs CMD in a child without those descriptors and waits for it: for
# a daemon that forks itself away (virtlogd -d, sshd, dnsmasq).
without_fds() { (exec_without_fds "$@"); }

# spawn PIDFILE LOGFILE CMD...: runs CMD in the background in a session of its own (so it
# outlives the script), output appended to LOGFILE, its pid in PIDFILE, without the
# caller's descriptors. setsid execs CMD in place (a background job is no group leader),
# so the pid is CMD's own.
spawn() {
  local pidfile=$1 logfile=$2
  shift 2
  exec_without_fds setsid "$@" >>"$logfile" 2>&1 </dev/null &
  echo $! >"$pidfile"
}
