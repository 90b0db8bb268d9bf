# What the test clusters' scripts (tests/batch/slurm/cluster.sh, tests/batch/sge/cluster.sh,
# tests/multinode/cluster.sh) share: their log lines, waiting on a condition, and whether a
# daemon lives. Sourced, after the script sets LOG_TAG ("[multinode]") and LOGS_HINT (where
# to look when something is not ready).

log() { echo "$LOG_TAG $*"; }
die() { echo "$LOG_TAG ERROR: $*" >&2; exit 1; }

# wait_for DESCRIPTION SECONDS COMMAND...: poll COMMAND until it succeeds.
wait_for() {
    local what=$1 limit=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what not ready after ${limit}s (see $LOGS_HINT)"
        sleep 0.3
    done
    log "$what ready"
}

# A killed daemon stays a zombie until init reaps it, and the init here can be slow to:
# kill -0 would call it alive, so read its state instead.
proc_alive() {
    local state
    # The state follows the ')' closing the command name, which may itself hold spaces.
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}
pid_alive() { [[ -s $1 ]] && proc_alive "$(cat "$1")"; }
