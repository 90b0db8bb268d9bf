#!/usr/bin/env bash
# A one-host SLURM cluster with real accounting, for the integration tests.
#
#   tests/batch/slurm/cluster.sh up       install (if needed), configure, start; safe to re-run
#   tests/batch/slurm/cluster.sh down     stop only the daemons this script started
#   tests/batch/slurm/cluster.sh status   say whether it is up (exit 0 when up)
#
# There is no systemd on the CI machines, so daemons are started directly, in dependency
# order (munged, mysqld, slurmdbd, slurmctld, slurmd), each waited for before the next.
# Needs root and nothing on stdin.
set -euo pipefail

CLUSTER_NAME=${HPC_TEST_CLUSTER_NAME:-hpctest}
NODE=$(hostname -s)
NODE_CPUS=32    # not this machine's cores: room for the tests that run side by side (scripts/test)
NODE_MEMORY_MB=32000
# Daemons this script started are listed here, so `down` never touches anything else.
STATE_DIR=/run/hpc-cluster-test-slurm
DB_PASSWORD=hpc-cluster-test
PACKAGES=(slurm-wlm slurm-client slurmdbd slurm-wlm-basic-plugins slurm-wlm-mysql-plugin
          mariadb-server mariadb-client munge)

LOG_TAG="[cluster.sh]" LOGS_HINT="/var/log/slurm/, /var/log/mysql/"
# shellcheck source=../../helpers/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../helpers/cluster_lib.sh"

install_packages() {
    local missing=()
    for cmd in slurmctld slurmd slurmdbd sbatch sacct munged mariadbd; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    [[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/accounting_storage_mysql.so ]] \
        || ls /usr/lib/*/slurm-wlm/accounting_storage_mysql.so >/dev/null 2>&1 || missing+=(mysql-plugin)
    if ((${#missing[@]} == 0)); then
        log "packages already installed"
        return
    fi
    log "installing ${PACKAGES[*]} (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    # Package scripts must not try to start services (there is no init to ask).
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        local remove_policy=1
    fi
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" </dev/null >/dev/null
    [[ ${remove_policy:-0} == 1 ]] && rm -f /usr/sbin/policy-rc.d
    log "packages installed"
}

# write_if_changed PATH MODE OWNER: stdin -> PATH; prints "changed" when content differed.
write_if_changed() {
    local path=$1 mode=$2 owner=$3 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [[ -e $path ]] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
    else
        install -m "$mode" -o "${owner%%:*}" -g "${owner##*:}" "$tmp" "$path"
        rm -f "$tmp"
        CONFIG_CHANGED=1
    fi
}

write_configs() {
    CONFIG_CHANGED=0
    mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm
    chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm /run/slurm
    write_if_changed /etc/slurm/slurm.conf 644 root:root <<EOF
# Written by tests/batch/slurm/cluster.sh: a one-node test cluster. Not for production.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
MpiDefault=none
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# cgroups make a job over --mem end OUT_OF_MEMORY 0:125, as on production clusters.
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=task=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageEnforce=associations
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Jobs without --mem must not claim the whole node, or tests could not run side by side.
DefMemPerCPU=256
# Short timers: tests wait on state changes and should not wait on SLURM's defaults.
MinJobAge=30
KillWait=5
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
Waittime=0
ReturnToService=2
SchedulerParameters=sched_interval=2
# Preemption: a job in 'high' (or debug) cancels jobs in 'low' it needs room from; debug
# has the same tier as high so that other tests' jobs are never preempted.
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
# The node may declare more than the machine has, so many small jobs can run at once.
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY_MB State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP PriorityTier=10
PartitionName=low Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high Nodes=$NODE MaxTime=INFINITE State=UP PriorityTier=10
EOF
    write_if_changed /etc/slurm/cgroup.conf 644 root:root <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
EOF
    # slurmdbd refuses a config readable by others or not owned by SlurmUser.
    write_if_changed /etc/slurm/slurmdbd.conf 600 slurm:slurm <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=slurm
PidFile=/run/slurm/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASSWORD
StorageLoc=slurm_acct_db
EOF
    ((CONFIG_CHANGED)) && log "configs written to /etc/slurm" || log "configs unchanged"
}

# start NAME PIDFILE COMMAND...: start a daemon unless its pid file names a live process.
start() {
    local name=$1 pidfile=$2; shift 2
    if pid_alive "$pidfile"; then
        log "$name already running (pid $(cat "$pidfile"))"
        return 1
    fi
    log "starting $name"
    "$@"
    mkdir -p "$STATE_DIR"
    echo "$pidfile" >"$STATE_DIR/$name"
}

start_munge() {
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    fi
    start munged /run/munge/munged.pid runuser -u munge -- /usr/sbin/munged || true
    wait_for munged 20 bash -c 'munge -n | unmunge'
}

start_mysql() {
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    if [[ ! -d /var/lib/mysql/mysql ]]; then
        mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    fi
    if start mysqld /run/mysqld/mysqld.pid bash -c \
        'setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
            --socket=/run/mysqld/mysqld.sock --bind-address=127.0.0.1 \
            </dev/null >>/var/log/slurm/mariadb.log 2>&1 &'; then :; fi
    wait_for mysqld 60 mysqladmin --socket=/run/mysqld/mysqld.sock ping
    wait_for "mysqld pid file" 20 test -s /run/mysqld/mysqld.pid
    # Root logs in by unix socket on Debian; create the accounting database and its user.
    mysql --socket=/run/mysqld/mysqld.sock <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
}

sacctmgr_quiet() { sacctmgr -i "$@" >/dev/null 2>&1 || true; }

start_slurm() {
    start slurmdbd /run/slurm/slurmdbd.pid /usr/sbin/slurmdbd || true
    wait_for slurmdbd 60 sacctmgr -n list cluster
    # Register before slurmctld starts, so its first contact finds the cluster.
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
        log "registered cluster $CLUSTER_NAME"
    fi
    sacctmgr_quiet add account hpctest cluster="$CLUSTER_NAME" description=tests organization=tests
    sacctmgr_quiet add user root account=hpctest cluster="$CLUSTER_NAME" defaultaccount=hpctest
    if ! start slurmctld /run/slurm/slurmctld.pid /usr/sbin/slurmctld && ((CONFIG_CHANGED)); then
        log "config changed: scontrol reconfigure"
        if ! scontrol reconfigure; then
            # A node's CPUs or memory changed: only a restart of both daemons takes that.
            log "restarting slurmctld and slurmd for the new node configuration"
            stop_daemon slurmd
            stop_daemon slurmctld
            start slurmctld /run/slurm/slurmctld.pid /usr/sbin/slurmctld
        fi
    fi
    wait_for slurmctld 60 bash -c 'scontrol ping | grep -q UP'
    start slurmd /run/slurm/slurmd.pid /usr/sbin/slurmd || true
    # An admin-downed node (left over by an interrupted test) would never come back alone.
    if sinfo -h -N -n "$NODE" -o %T | grep -Eq 'down|drain'; then
        scontrol update nodename="$NODE" state=resume 2>/dev/null || true
    fi
    wait_for "node $NODE" 60 bash -c "sinfo -h -N -n '$NODE' -o %T | grep -Eq '^(idle|mixed|allocated)'"
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "run as root: it installs packages and starts system daemons"
    local t0=$SECONDS
    install_packages
    write_configs
    start_munge
    start_mysql
    start_slurm
    log "cluster $CLUSTER_NAME up in $((SECONDS - t0))s: node $NODE, partitions debug (default), low, high"
}

# stop_daemon NAME: stop a daemon the state dir says we started.
stop_daemon() {
    local name=$1 pidfile pid
    [[ -s $STATE_DIR/$name ]] || return 0
    pidfile=$(cat "$STATE_DIR/$name")
    if pid_alive "$pidfile"; then
        pid=$(cat "$pidfile")
        log "stopping $name (pid $pid)"
        kill -TERM "$pid"
        local deadline=$((SECONDS + 30))
        while proc_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        if proc_alive "$pid"; then log "$name did not stop; SIGKILL"; kill -KILL "$pid"; fi
    fi
    rm -f "$STATE_DIR/$name"
}

# Stop in reverse order, only what the state dir says we started.
cmd_down() {
    local name
    for name in slurmd slurmctld slurmdbd mysqld munged; do
        stop_daemon "$name"
    done
    log "down"
}

cmd_status() {
    local up=0 name pidfile
    for name in munged:/run/munge/munged.pid mysqld:/run/mysqld/mysqld.pid \
                slurmdbd:/run/slurm/slurmdbd.pid slurmctld:/run/slurm/slurmctld.pid \
                slurmd:/run/slurm/slurmd.pid; do
        pidfile=${name#*:}
        if pid_alive "$pidfile"; then
            echo "${name%%:*}: running (pid $(cat "$pidfile"))"
        else
            echo "${name%%:*}: not running"; up=1
        fi
    done
    if ((up == 0)); then
        sinfo -N -o '%N %P %T %c %m' 2>/dev/null || up=1
    fi
    ((up == 0)) && echo "cluster: up" || echo "cluster: down"
    return $up
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
