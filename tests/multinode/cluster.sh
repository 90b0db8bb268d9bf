#!/usr/bin/env bash
# A multi-node SLURM cluster on one host, for the tests in tests/multinode/ (issue 33).
#
#   tests/multinode/cluster.sh up              start (after tests/batch/slurm/cluster.sh up); safe to re-run
#   tests/multinode/cluster.sh down            stop it and remove every namespace, link, cgroup and file it made
#   tests/multinode/cluster.sh status          exit 0 when every node is up in SLURM
#   tests/multinode/cluster.sh kill-node N     SIGKILL every process of node N (its slurmd, jobs, workers)
#   tests/multinode/cluster.sh start-node N    start node N again (after kill-node); SLURM returns it to service
#   tests/multinode/cluster.sh cut N|login     take node N's link down (a network partition), or the login node's
#   tests/multinode/cluster.sh mend N|login    bring it back
#
# The login node is this host (its root namespaces): slurmctld of cluster "hpcmulti" (a second
# controller beside the one-node cluster's, on its own port), the one-node cluster's slurmdbd
# and munged (shared), the cluster daemon and the user's Python. Each compute node hpcnK is a
# network namespace on the bridge hpcmnbr0 (10.77.0.0/24; the login node is 10.77.0.1 on a veth of its
# own, node K is 10.77.0.1K) plus its own UTS namespace (hostname hpcnK), mount namespace (node-local /tmp and
# /etc/hosts, the rest shared: /root, /work, the project directory) and cgroup namespace (its
# own memory cgroup, limited to the node's memory; SLURM's job cgroups live inside it). The
# nodes' /etc/hosts name the nodes only: like at many sites, the compute nodes cannot resolve
# the login node's host name, so workers must be given an address, not a name.
#
# Nothing listens outside 127.0.0.0/8 and 10.77.0.0/24: the controller and the slurmds bind
# their own address (CommunicationParameters=NoInAddrAny), the nodes have no default route, and
# the host does not forward (the bridge is not attached to any real interface).
set -euo pipefail

NODES=${HPC_MULTINODE_NODES:-6}
NODE_CPUS=8
NODE_MEMORY_MB=3000
SUBNET=10.77.0
BRIDGE=hpcmnbr0
CLUSTER_NAME=hpcmulti
CONF_DIR=/etc/slurm-multinode
export SLURM_CONF=$CONF_DIR/slurm.conf
STATE=/var/lib/hpc-multinode           # per-node directories and the shared project directory
RUN=/run/hpc-multinode                  # pid files of what this script started
LOGS=/var/log/slurm/multinode
CTLD_PORT=6917
SLURMD_PORT=6918
CONTROLLERS=(cpu cpuacct cpuset devices freezer memory pids)
LOGIN=$(hostname -s)

LOG_TAG="[multinode]" LOGS_HINT="$LOGS/"
# shellcheck source=../helpers/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../helpers/cluster_lib.sh"

node_name() { echo "hpcn$1"; }
node_addr() { echo "$SUBNET.1$1"; }
node_index() { local n=${1#hpcn}; [[ $n =~ ^[0-9]+$ ]] || die "no such node: $1 (hpcn1..hpcn$NODES)"; echo "$n"; }

first_job_id() {
    local last
    last=$(env -u SLURM_CONF sacct -M "$CLUSTER_NAME" -X -n -P -o JobIDRaw -S 2020-01-01 2>/dev/null \
        | grep -E '^[0-9]+$' | sort -n | tail -1)
    echo $(( ${last:-0} >= 500000 ? last + 1 : 500000 ))
}

write_configs() {
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/shared" "$LOGS" "$RUN"
    chown slurm:slurm "$STATE/ctld" "$LOGS"
    chmod 1777 "$STATE/shared"
    local nodes="" k
    for ((k = 1; k <= NODES; k++)); do
        nodes+="NodeName=$(node_name "$k") NodeAddr=$(node_addr "$k") CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY_MB State=UNKNOWN"$'\n'
    done
    cat >"$CONF_DIR/slurm.conf" <<EOF
# Written by tests/multinode/cluster.sh: a multi-node test cluster in network namespaces. Not for production.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$LOGIN($SUBNET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
# Bind the address of the node, not every interface.
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SrunPortRange=60001-61000
SlurmUser=slurm
AuthType=auth/munge
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=task=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageEnforce=associations,limits
# Job ids apart from the one-node cluster's (they share slurmdbd and the host's cgroups), and
# after every id this cluster had before a down (slurmdbd keeps their records: an id used
# twice would merge two jobs in sacct).
FirstJobId=$(first_job_id)
SchedulerType=sched/backfill
SelectType=select/cons_tres
# CR_LLN: jobs go to the least loaded node, so a test's workers spread over the nodes.
SelectTypeParameters=CR_Core_Memory,CR_LLN
DefMemPerCPU=256
MinJobAge=30
KillWait=5
SlurmctldTimeout=10
# A minute (SLURM's default is 300 s): a 30 s network partition must not fail the node (tests cut
# links for 30 s), and a node killed for good is marked DOWN within ~80 s.
SlurmdTimeout=60
MessageTimeout=10
InactiveLimit=0
Waittime=0
ReturnToService=2
# A job on a failed node ends NODE_FAIL (not requeued), as the tests expect.
JobRequeue=0
SchedulerParameters=sched_interval=2
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmdParameters=config_overrides
${nodes}PartitionName=debug Nodes=hpcn[1-$NODES] Default=YES MaxTime=INFINITE State=UP PriorityTier=10
PartitionName=low Nodes=hpcn[1-$NODES] MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high Nodes=hpcn[1-$NODES] MaxTime=INFINITE State=UP PriorityTier=10
EOF
    cat >"$CONF_DIR/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=yes
ConstrainSwapSpace=no
EOF
}

network_up() {
    # The login node's address sits on a veth of its own (hpcmnl0), its peer a port of the
    # bridge: taking that port down cuts the login node off while the nodes still reach each other.
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" up
    if ! ip link show hpcmnl0 >/dev/null 2>&1; then
        ip link add hpcmnl0 type veth peer name hpcmnl1
        ip addr add "$SUBNET.1/24" dev hpcmnl0
    fi
    ip link set hpcmnl1 master "$BRIDGE" up
    ip link set hpcmnl0 up
    local k name
    for ((k = 1; k <= NODES; k++)); do
        name=$(node_name "$k")
        [[ -e /var/run/netns/$name ]] || ip netns add "$name"
        if ! ip link show "hpcmnv$k" >/dev/null 2>&1; then
            ip link add "hpcmnv$k" type veth peer name eth0 netns "$name"
            ip -n "$name" addr add "$(node_addr "$k")/24" dev eth0
        fi
        ip link set "hpcmnv$k" master "$BRIDGE" up
        ip -n "$name" link set lo up
        ip -n "$name" link set eth0 up
    done
}

# The node's own cgroup in every controller SLURM uses, limited to the node's memory.
node_cgroups() {
    local name=$1 c
    for c in "${CONTROLLERS[@]}"; do mkdir -p "/sys/fs/cgroup/$c/hpcmn-$name"; done
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/hpcmn-$name/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/hpcmn-$name/cpuset.mems"
    echo $((NODE_MEMORY_MB * 1024 * 1024)) >"/sys/fs/cgroup/memory/hpcmn-$name/memory.limit_in_bytes"
}

node_hosts() {
    local k
    echo "127.0.0.1 localhost"
    for ((k = 1; k <= NODES; k++)); do echo "$(node_addr "$k") $(node_name "$k")"; done
}

start_node() {
    local k=$1 name dir
    name=$(node_name "$k")
    dir=$STATE/$name
    if pid_alive "$RUN/slurmd-$name.pid"; then log "$name: slurmd already running"; return; fi
    mkdir -p "$dir/tmp" "$dir/spool"
    chmod 1777 "$dir/tmp"
    node_hosts >"$dir/hosts"
    node_cgroups "$name"
    # The checkout (and so the venv) may live under the host's /tmp (a CI clone): show it
    # through the node's own /tmp at the same path.
    local keep=()
    [[ -n ${HPC_MULTINODE_SHARE:-} ]] && keep=($HPC_MULTINODE_SHARE)
    # A subshell joins the node's cgroups, then enters its namespaces: slurmd and every job
    # it starts live there.
    (
        for c in "${CONTROLLERS[@]}"; do echo $BASHPID >"/sys/fs/cgroup/$c/hpcmn-$name/cgroup.procs"; done
        exec nsenter --net="/var/run/netns/$name" unshare --uts --mount --cgroup --propagation private \
            bash -c '
                set -e
                name=$1 dir=$2; shift 2
                hostname "$name"
                for p in "$@"; do
                    case $p in /tmp/*) mkdir -p "$dir/tmp/${p#/tmp/}"; mount --bind "$p" "$dir/tmp/${p#/tmp/}";; esac
                done
                mount --bind "$dir/tmp" /tmp
                mount --bind "$dir/hosts" /etc/hosts
                mkdir -p "/var/spool/slurmd-$name"
                mount --bind "$dir/spool" "/var/spool/slurmd-$name"
                for c in cpu cpuacct cpuset devices freezer memory pids; do
                    mount --bind "/sys/fs/cgroup/$c/hpcmn-$name" "/sys/fs/cgroup/$c"
                done
                exec /usr/sbin/slurmd -f "$SLURM_CONF"
            ' node "$name" "$dir" "${keep[@]}"
    ) </dev/null >>"$LOGS/start-$name.log" 2>&1
    wait_for "$name slurmd" 30 pid_alive "$RUN/slurmd-$name.pid"
}

start_ctld() {
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
        sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
        log "registered cluster $CLUSTER_NAME in slurmdbd"
    fi
    sacctmgr -i add account hpctest cluster="$CLUSTER_NAME" description=tests organization=tests >/dev/null 2>&1 || true
    sacctmgr -i add user root account=hpctest cluster="$CLUSTER_NAME" defaultaccount=hpctest >/dev/null 2>&1 || true
    # A site's cap on jobs per user (issue 33 point 5): jobs under account `capped` run 2 at a time.
    sacctmgr -i add account capped cluster="$CLUSTER_NAME" description=capped organization=tests >/dev/null 2>&1 || true
    sacctmgr -i add user root account=capped cluster="$CLUSTER_NAME" >/dev/null 2>&1 || true
    sacctmgr -i modify user root where account=capped cluster="$CLUSTER_NAME" set MaxJobs=2 >/dev/null 2>&1 || true
    if pid_alive "$RUN/slurmctld.pid"; then
        log "slurmctld already running"
    else
        log "starting slurmctld ($CLUSTER_NAME, $SUBNET.1:$CTLD_PORT)"
        # NoCtldInAddrAny binds what the host name resolves to, 127.0.0.1 on this host: the
        # controller alone sees a hosts file naming the login node by its bridge address.
        { echo "127.0.0.1 localhost"; echo "$SUBNET.1 $LOGIN"; node_hosts | tail -n +2; } >"$STATE/ctld-hosts"
        unshare --mount --propagation private bash -c \
            'mount --bind "$1" /etc/hosts && exec /usr/sbin/slurmctld -f "$SLURM_CONF"' ctld "$STATE/ctld-hosts" \
            </dev/null >>"$LOGS/start-ctld.log" 2>&1
    fi
    wait_for slurmctld 60 bash -c 'scontrol ping | grep -q UP'
}

nodes_up() {
    local k
    for ((k = 1; k <= NODES; k++)); do
        sinfo -h -N -n "$(node_name "$k")" -o %T | grep -Eq '^(idle|mixed|allocated|completing)' || return 1
    done
}

cmd_up() {
    [[ $(id -u) == 0 ]] || die "run as root: it makes network namespaces and starts system daemons"
    env -u SLURM_CONF bash "$(dirname "$0")/../batch/slurm/cluster.sh" status >/dev/null 2>&1 \
        || die "the one-node cluster (munged, slurmdbd) must be up first: bash tests/batch/slurm/cluster.sh up"
    local t0=$SECONDS k
    write_configs
    network_up
    start_ctld
    for ((k = 1; k <= NODES; k++)); do start_node "$k"; done
    for ((k = 1; k <= NODES; k++)); do
        if sinfo -h -N -n "$(node_name "$k")" -o %T | grep -Eq 'down|drain'; then
            scontrol update nodename="$(node_name "$k")" state=resume 2>/dev/null || true
        fi
    done
    wait_for "$NODES nodes" 60 nodes_up
    log "cluster $CLUSTER_NAME up in $((SECONDS - t0))s: nodes hpcn[1-$NODES] at $SUBNET.11-1$NODES, login $SUBNET.1; export SLURM_CONF=$SLURM_CONF"
}

stop_pid() {
    local pid=$1 deadline
    proc_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 20))
    while proc_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    proc_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
}

# Every process inside node N's network namespace: its slurmd, slurmstepds, jobs, workers.
node_pids() { ip netns pids "$1" 2>/dev/null || true; }

cmd_kill_node() {
    local name=$1 pid
    node_index "$name" >/dev/null
    for pid in $(node_pids "$name"); do kill -KILL "$pid" 2>/dev/null || true; done
    local deadline=$((SECONDS + 20))
    while [[ -n $(node_pids "$name") ]] && ((SECONDS < deadline)); do sleep 0.2; done
    rm -f "$RUN/slurmd-$name.pid"
    log "$name: every process killed"
}

cmd_start_node() {
    local k
    k=$(node_index "$1")
    start_node "$k"
    wait_for "$1 in service" 90 bash -c "sinfo -h -N -n '$1' -o %T | grep -Eq '^(idle|mixed|allocated)'"
}

link_of() {
    if [[ $1 == login ]]; then echo hpcmnl1; else echo "hpcmnv$(node_index "$1")"; fi
}

cmd_cut() { ip link set "$(link_of "$1")" down; log "$1: link down"; }
cmd_mend() {
    ip link set "$(link_of "$1")" up
    log "$1: link up"
    # A node SLURM marked DOWN while cut off does not always come back alone once it answers
    # again (seen here: DOWN+NOT_RESPONDING for minutes with slurmd reachable both ways); an
    # admin resumes it, and so does this, once its slurmd answers.
    if [[ $1 != login ]] && sinfo -h -N -n "$1" -o %T | grep -q '^down'; then
        local deadline=$((SECONDS + 60))
        until scontrol update nodename="$1" state=resume 2>/dev/null; do
            ((SECONDS < deadline)) || { log "$1: still not answering; left down"; return 0; }
            sleep 1
        done
        log "$1: resumed"
    fi
}

cmd_down() {
    local k name c
    for ((k = 1; k <= NODES; k++)); do
        name=$(node_name "$k")
        [[ -e /var/run/netns/$name ]] && cmd_kill_node "$name" >/dev/null
    done
    [[ -s $RUN/slurmctld.pid ]] && stop_pid "$(cat "$RUN/slurmctld.pid")"
    for ((k = 1; k <= NODES; k++)); do
        name=$(node_name "$k")
        ip link del "hpcmnv$k" 2>/dev/null || true
        [[ -e /var/run/netns/$name ]] && ip netns del "$name"
        # Job cgroups SLURM left behind, deepest first, then the node's own.
        for c in "${CONTROLLERS[@]}"; do
            if [[ -d /sys/fs/cgroup/$c/hpcmn-$name ]]; then
                find "/sys/fs/cgroup/$c/hpcmn-$name" -depth -type d -exec rmdir {} \; 2>/dev/null || true
            fi
        done
    done
    ip link del hpcmnl0 2>/dev/null || true
    ip link del "$BRIDGE" 2>/dev/null || true
    if [[ -n ${HPC_MULTINODE_KEEP_LOGS:-} && -d $LOGS ]]; then
        mkdir -p "$HPC_MULTINODE_KEEP_LOGS" && cp -r "$LOGS/." "$HPC_MULTINODE_KEEP_LOGS/"
    fi
    rm -rf "$STATE" "$RUN" "$LOGS" "$CONF_DIR"
    log "down"
}

cmd_status() {
    [[ -s $RUN/slurmctld.pid ]] && pid_alive "$RUN/slurmctld.pid" || { echo "slurmctld: not running"; echo "cluster: down"; return 1; }
    if nodes_up; then
        sinfo -N -o '%N %o %T %c %m'
        echo "cluster: up"
    else
        sinfo -N -o '%N %o %T %c %m' 2>/dev/null || true
        echo "cluster: down"
        return 1
    fi
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kill-node) cmd_kill_node "${2:?node}" ;;
    start-node) cmd_start_node "${2:?node}" ;;
    cut) cmd_cut "${2:?node or login}" ;;
    mend) cmd_mend "${2:?node or login}" ;;
    *) echo "usage: $0 up|down|status|kill-node N|start-node N|cut N|login|mend N|login" >&2; exit 2 ;;
esac
