#!/usr/bin/env bash
# A one-host Son of Grid Engine (Debian's gridengine 8.1.9) with accounting, for the SGE tests.
#
#   tests/batch/sge/cluster.sh up       install (if needed), configure, start; safe to re-run
#   tests/batch/sge/cluster.sh down     stop only the daemons this script started (qconf -ke / -km)
#   tests/batch/sge/cluster.sh status   say whether it is up (exit 0 when up)
#
# No systemd here: sge_qmaster and sge_execd are started directly, each waited for. Needs root
# and nothing on stdin. The queue all.q enforces h_rt and h_vmem (the job's requests: SGE's
# execd kills a job whose processes together pass its h_vmem, and qmaster one past its h_rt);
# accounting is written at once (accounting_flush_time=0), so `qacct -j` knows a job as soon
# as it ends. Jobs may run as root (min_uid 0): the tests submit as root.
set -euo pipefail

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
NODE=$(hostname)
SLOTS=16
COMMON=$SGE_ROOT/$SGE_CELL/common
SPOOL=/var/spool/gridengine
QMASTER_PID=$SPOOL/qmaster/qmaster.pid
STATE_DIR=/run/hpc-cluster-test-sge          # daemons this script started: `down` stops only these
PACKAGES=(gridengine-master gridengine-exec gridengine-client)

LOG_TAG="[sge/cluster.sh]" LOGS_HINT="$SPOOL/qmaster/messages"
# shellcheck source=../../helpers/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/cluster_lib.sh"
pid_of() { [[ -s $1 ]] && proc_alive "$(cat "$1")" && cat "$1"; }
execd_pidfile() { ls "$SPOOL"/execd/*/execd.pid 2>/dev/null | head -1; }

install_packages() {
    if command -v qsub >/dev/null && [[ -x /usr/sbin/sge_qmaster && -x /usr/sbin/sge_execd ]]; then
        log "packages already installed"
        return
    fi
    log "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # gridengine-common asks for the master host and cell, and whether to configure it; the
    # mail transport it pulls in asks for a mailer type. Answered here, so nothing prompts.
    debconf-set-selections <<EOF
gridengine-common shared/gridenginemaster string $NODE
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridengineconfig boolean true
gridengine-master shared/gridenginemaster string $NODE
gridengine-master shared/gridenginecell string $SGE_CELL
gridengine-master shared/gridengineconfig boolean true
postfix postfix/main_mailer_type select No configuration
postfix postfix/mailname string $NODE
EOF
    # Package scripts must not try to start services (there is no init to ask).
    local remove_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        remove_policy=1
    fi
    local aptlog=/tmp/hpc-cluster-sge-apt.log
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; } \
            </dev/null >"$aptlog" 2>&1; then
        cat "$aptlog" >&2
        die "apt-get install ${PACKAGES[*]} failed (above)"
    fi
    ((remove_policy)) && rm -f /usr/sbin/policy-rc.d
    [[ -s $COMMON/bootstrap ]] || die "gridengine installed but $COMMON/bootstrap is missing: the cell was not \
configured (dpkg-reconfigure gridengine-common, answering yes to automatic configuration)"
    log "packages installed"
}

start_qmaster() {
    # The hostname resolves to 127.0.0.1, which resolves back to 'localhost'; commlib refuses
    # a peer whose names disagree unless host_aliases says they are one host.
    [[ "$(cat "$COMMON/host_aliases" 2>/dev/null)" == "$NODE localhost" ]] \
        || echo "$NODE localhost" >"$COMMON/host_aliases"
    mkdir -p "$STATE_DIR"
    if pid=$(pid_of "$QMASTER_PID"); then
        log "sge_qmaster already running (pid $pid)"
    else
        log "starting sge_qmaster"
        /usr/sbin/sge_qmaster </dev/null >/dev/null 2>&1     # daemonizes, runs as sgeadmin
        echo "$QMASTER_PID" >"$STATE_DIR/qmaster"
    fi
    wait_for sge_qmaster 60 qconf -sh
}

# modify_global_conf FILE: `qconf -mconf global` with an EDITOR that copies FILE in: 8.1.9's
# -Mconf reads its argument as a host name, so this is the non-interactive way.
modify_global_conf() {
    local want=$1 editor
    editor=$(mktemp)
    printf '#!/bin/sh\ncp %q "$1"\n' "$want" >"$editor"
    chmod +x "$editor"
    EDITOR=$editor qconf -mconf global >/dev/null 2>&1
    rm -f "$editor"
}

configure() {
    local tmp changed=0
    tmp=$(mktemp -d)
    # Global: root may run jobs; accounting written at once; finished jobs kept briefly.
    # execd's PDC checks h_vmem (and collects usage): every second, said explicitly.
    qconf -sconf global | sed -e 's/^min_uid .*/min_uid                      0/' \
        -e 's/^min_gid .*/min_gid                      0/' \
        -e 's/^execd_params .*/execd_params                 PDC_INTERVAL=1/' >"$tmp/global"
    if ! grep -q 'accounting_flush_time=00:00:00' "$tmp/global"; then
        sed -i 's/flush_time=00:00:15/flush_time=00:00:15 accounting_flush_time=00:00:00/' "$tmp/global"
    fi
    if ! qconf -sconf global | cmp -s - "$tmp/global"; then
        modify_global_conf "$tmp/global"; changed=1
    fi
    # Scheduler: a pass every second (default 15 s), placement by queue order, not load (two
    # cores here, shared with other work: the load would otherwise hold jobs back).
    qconf -ssconf | sed -e 's/^schedule_interval .*/schedule_interval                 0:0:1/' \
        -e 's/^flush_submit_sec .*/flush_submit_sec                  1/' \
        -e 's/^flush_finish_sec .*/flush_finish_sec                  1/' \
        -e 's/^job_load_adjustments .*/job_load_adjustments              NONE/' \
        -e 's/^queue_sort_method .*/queue_sort_method                 seqno/' >"$tmp/sched"
    if ! qconf -ssconf | cmp -s - "$tmp/sched"; then
        qconf -Msconf "$tmp/sched" >/dev/null 2>&1; changed=1
    fi
    qconf -ss 2>/dev/null | grep -qx "$NODE" || { qconf -as "$NODE" >/dev/null 2>&1; changed=1; }
    ((changed)) && log "configuration written" || log "configuration unchanged"
    rm -rf "$tmp"
}

start_execd() {
    local pidfile pid
    pidfile=$(execd_pidfile || true)
    if [[ -n $pidfile ]] && pid=$(pid_of "$pidfile"); then
        log "sge_execd already running (pid $pid)"
    else
        log "starting sge_execd"
        mkdir -p "$SPOOL/execd" && chown sgeadmin:sgeadmin "$SPOOL/execd"
        /usr/sbin/sge_execd </dev/null >/dev/null 2>&1
        wait_for "sge_execd pid file" 30 bash -c "ls $SPOOL/execd/*/execd.pid"
        execd_pidfile >"$STATE_DIR/execd"
    fi
    # An execd on an admin host registers itself; its first load report makes it usable.
    wait_for "exec host $NODE" 60 bash -c "qconf -sel | grep -qx '$NODE'"
}

queue_conf() {
    # Every limit INFINITY: the job's own -l h_rt/h_vmem requests are what is enforced.
    cat <<EOF
qname                 all.q
hostlist              $NODE
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               NONE
rerun                 FALSE
slots                 $SLOTS
tmpdir                /tmp
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      unix_behavior
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:60
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
EOF
    local l
    for l in rt cpu fsize data stack core rss vmem; do
        printf 's_%-20s INFINITY\nh_%-20s INFINITY\n' "$l" "$l"
    done
}

make_queue() {
    local tmp
    tmp=$(mktemp)
    queue_conf >"$tmp"
    if ! qconf -sq all.q >/dev/null 2>&1; then
        qconf -Aq "$tmp" >/dev/null 2>&1
        log "queue all.q added ($SLOTS slots)"
    elif ! diff <(qconf -sq all.q | awk '{print $1, $2}' | sort) <(awk '{print $1, $2}' "$tmp" | sort) >/dev/null; then
        qconf -Mq "$tmp" >/dev/null 2>&1
        log "queue all.q updated"
    fi
    rm -f "$tmp"
    # Usable: the queue instance reports a load and is in no alarm/error/disabled state.
    wait_for "queue all.q@$NODE" 60 bash -c \
        "qstat -f -q all.q | awk '\$1 == \"all.q@$NODE\" && \$4 != \"-NA-\" && NF == 5 {ok=1} END {exit !ok}'"
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "run as root: it installs packages and starts system daemons"
    local t0=$SECONDS
    install_packages
    start_qmaster
    configure
    start_execd
    make_queue
    log "gridengine up in $((SECONDS - t0))s: host $NODE, queue all.q ($SLOTS slots), SGE_ROOT=$SGE_ROOT"
}

cmd_down() {
    local pidfile pid
    # Grid Engine's own stop commands first; a pid that outlives them gets SIGTERM.
    if [[ -s $STATE_DIR/execd ]]; then
        pidfile=$(cat "$STATE_DIR/execd")
        if pid=$(pid_of "$pidfile"); then
            log "stopping sge_execd (pid $pid)"
            qconf -ke "$NODE" >/dev/null 2>&1 || kill -TERM "$pid"
            stop_wait "$pid"
        fi
        rm -f "$STATE_DIR/execd"
    fi
    if [[ -s $STATE_DIR/qmaster ]]; then
        if pid=$(pid_of "$QMASTER_PID"); then
            log "stopping sge_qmaster (pid $pid)"
            qconf -km >/dev/null 2>&1 || kill -TERM "$pid"
            stop_wait "$pid"
        fi
        rm -f "$STATE_DIR/qmaster"
    fi
    log "down"
}

stop_wait() {
    local deadline=$((SECONDS + 30))
    while proc_alive "$1" && ((SECONDS < deadline)); do sleep 0.2; done
    if proc_alive "$1"; then log "pid $1 did not stop; SIGTERM"; kill -TERM "$1" 2>/dev/null || true; fi
}

cmd_status() {
    local up=0 pid pidfile
    if pid=$(pid_of "$QMASTER_PID"); then echo "sge_qmaster: running (pid $pid)"; else echo "sge_qmaster: not running"; up=1; fi
    pidfile=$(execd_pidfile || true)
    if [[ -n $pidfile ]] && pid=$(pid_of "$pidfile"); then echo "sge_execd: running (pid $pid)"; else echo "sge_execd: not running"; up=1; fi
    if ((up == 0)); then qstat -f -q all.q 2>/dev/null | grep -q "all.q@" || up=1; fi
    ((up == 0)) && echo "gridengine: up" || echo "gridengine: down"
    return $up
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
