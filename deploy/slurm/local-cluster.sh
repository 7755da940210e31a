#!/usr/bin/env bash
# A one-node SLURM on this machine, for trying `--cluster slurm` and for the tests marked slurm:
#
#   bash deploy/slurm/local-cluster.sh up DIR     # then: export SLURM_CONF=DIR/slurm.conf
#   bash deploy/slurm/local-cluster.sh down DIR
#
# `up` installs Debian's slurm-wlm and munge when missing (apt-get, as root), writes DIR/slurm.conf
# (one node, this machine's CPUs and memory, address 127.0.0.1; proctrack/linuxproc and task/none:
# no cgroups or systemd needed; no accounting), starts munged (its own key and socket under DIR),
# slurmctld and slurmd, each daemon logging to DIR/NAME.log and recording its pid in
# DIR/NAME.pid, and waits until sinfo shows the node idle.  `down` stops, by those pids, what
# `up` started.  Both are idempotent.  Every daemon binds 127.0.0.1 only.
#
# Environment: LSHDIST_SLURM_PORT (slurmctld's port, default 6817; slurmd takes the next one),
# LSHDIST_SLURM_TIMEOUT (seconds to wait for the idle node, default 60).
set -euo pipefail

usage() { echo "usage: $0 up|down DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
ACTION=$1
DIR=$2
NODE=localhost
DAEMONS=(slurmd slurmctld munged)   # the order `down` stops them in

fail() { echo "local-cluster.sh: $*" >&2; exit 1; }

alive() {  # alive NAME: the pid recorded in DIR/NAME.pid is a running process of that name
    local pidfile=$DIR/$1.pid pid
    [[ -s $pidfile ]] || return 1
    pid=$(<"$pidfile")
    [[ -r /proc/$pid/comm ]] && [[ $(</proc/"$pid"/comm) == "$1"* ]]
}

install_packages() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
        || missing+=(slurm-wlm)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || fail "${missing[*]} not installed and not root: run as root, or \
apt-get install ${missing[*]} first"
    command -v apt-get >/dev/null || fail "${missing[*]} not installed and no apt-get here"
    echo "installing ${missing[*]} (apt-get)"
    apt-get update -qq >"$DIR/apt.log" 2>&1 || fail "apt-get update failed (see $DIR/apt.log)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >>"$DIR/apt.log" 2>&1 \
        || fail "apt-get install ${missing[*]} failed (see $DIR/apt.log)"
}

free_port() {  # free_port FROM: the first port >= FROM with nothing listening on it (TCP)
    local p=$1
    while ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || ss -Hltn "sport = :$((p + 1))" \
            2>/dev/null | grep -q .; do
        p=$((p + 2))
    done
    echo "$p"
}

write_config() {
    local cpus mem port user
    read -r cpus mem < <(slurmd -C | sed -n 's/.* CPUs=\([0-9]*\) .*RealMemory=\([0-9]*\).*/\1 \2/p')
    [[ -n ${cpus:-} && -n ${mem:-} ]] || fail "slurmd -C did not report this machine's CPUs/memory"
    port=$(free_port "${LSHDIST_SLURM_PORT:-6817}")
    user=$(id -un)
    mkdir -p "$DIR/state" "$DIR/spool"
    cat >"$DIR/slurm.conf" <<EOF
# A one-node SLURM written by deploy/slurm/local-cluster.sh: loopback only, no cgroups, no
# accounting.
ClusterName=lshdist-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
# bind the address the hosts resolve to (127.0.0.1), not every interface
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$DIR/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# a driver job and its worker jobs share the cores of this one node
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
}

start_munged() {
    alive munged && return 0
    if [[ ! -s $DIR/munge.key ]]; then
        dd if=/dev/urandom of="$DIR/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0600 "$DIR/munge.key"
    # --force: DIR may sit under a world-writable /tmp, which munged's directory checks refuse
    munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munge.seed" \
        || fail "munged did not start (see $DIR/munged.log)"
}

start_daemon() {  # start_daemon NAME: slurmctld or slurmd, daemonised, its pid file under DIR
    alive "$1" && return 0
    rm -f "$DIR/$1.pid"
    local args=(-f "$DIR/slurm.conf")
    [[ $1 == slurmd ]] && args+=(-N "$NODE")
    [[ $1 == slurmctld ]] && args+=(-i)   # ignore a stale state from an earlier run of DIR
    "$1" "${args[@]}" >>"$DIR/$1.log" 2>&1 || fail "$1 did not start (see $DIR/$1.log)"
    local i
    for i in $(seq 50); do
        alive "$1" && return 0
        sleep 0.1
    done
    fail "$1 wrote no pid file within 5 s (see $DIR/$1.log)"
}

wait_idle() {
    local timeout=${LSHDIST_SLURM_TIMEOUT:-60} start=$SECONDS state=""
    while ((SECONDS - start < timeout)); do
        state=$(SLURM_CONF=$DIR/slurm.conf sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
        # idle; mix or alloc when `up` is run again while jobs run
        [[ $state == idle || $state == mix || $state == alloc ]] && return 0
        for d in munged slurmctld slurmd; do
            alive "$d" || fail "$d exited (see $DIR/$d.log)"
        done
        sleep 0.5
    done
    fail "node $NODE not idle after ${timeout}s (state: '${state:-no answer}'); see \
$DIR/slurmctld.log and $DIR/slurmd.log"
}

up() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    install_packages
    if ! { alive slurmctld && [[ -s $DIR/slurm.conf ]]; }; then
        write_config
    fi
    start_munged
    start_daemon slurmctld
    start_daemon slurmd
    wait_idle
    echo "SLURM up: export SLURM_CONF=$DIR/slurm.conf"
}

down() {
    [[ -d $DIR ]] || return 0
    local d pid i jobs
    if alive slurmctld; then  # the jobs first: their steps are slurmd's children
        jobs=$(SLURM_CONF=$DIR/slurm.conf squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            SLURM_CONF=$DIR/slurm.conf scancel $jobs 2>/dev/null || true
            for i in $(seq 100); do
                [[ -z $(SLURM_CONF=$DIR/slurm.conf squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.1
            done
        fi
    fi
    for d in "${DAEMONS[@]}"; do
        alive "$d" || { rm -f "$DIR/$d.pid"; continue; }
        pid=$(<"$DIR/$d.pid")
        kill "$pid" 2>/dev/null || true
        for i in $(seq 100); do
            [[ -d /proc/$pid ]] || break
            sleep 0.1
        done
        [[ -d /proc/$pid ]] && kill -9 "$pid" 2>/dev/null || true
        rm -f "$DIR/$d.pid"
    done
    echo "SLURM down ($DIR)"
}

case $ACTION in
    up) up ;;
    down) DIR=$(cd "$DIR" 2>/dev/null && pwd || echo "$DIR"); down ;;
    *) usage ;;
esac
