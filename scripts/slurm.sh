#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for development and for the test suite
# (tests/test_slurm.py). Debian/Ubuntu, as root.
#
#   scripts/slurm.sh up       install slurm-wlm + munge when missing, configure, start, wait until
#                             `srun hostname` answers; a no-op when the cluster already answers
#   scripts/slurm.sh down     stop slurmd, slurmctld and munged (the config stays)
#   scripts/slurm.sh status   exit 0 when the cluster answers, and show `sinfo`
#
# The cluster: this machine's CPUs and memory as one node, partition `debug` (the default),
# proctrack/linuxproc + task/none (no cgroups needed), no accounting (so no sacct: the sweep
# launcher reads job states from squeue instead, see grpo_ablate/sweep/slurm.py), all
# daemons on 127.0.0.1. Its config is /etc/slurm/slurm.conf, which `up` writes only where
# there is none or where it wrote the one there (a marker line); a cluster's own is never touched.
#
# Exit codes: 0 done; 1 failed (the daemons' logs are printed); 3 cannot run on this machine
# (not root, no apt-get to install with, or somebody else's slurm.conf): the SLURM tests
# skip with this script's message.
set -uo pipefail

CONF=/etc/slurm/slurm.conf
MARKER="# written by grpo-ablate scripts/slurm.sh"
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGED_PID=/run/munge/munged.pid
LOCK=/run/lock/grpo-ablate-slurm.lock
NODE=$(hostname -s)

say() { echo "slurm.sh: $*"; }
cannot() { say "$*"; exit 3; }
die() { say "$*"; exit 1; }

# --------------------------------------------------------------------------- checks
answers() {
  # the controller answers, this node is usable, and a job step runs
  command -v sinfo >/dev/null 2>&1 || return 1
  timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" || return 1
  local state
  state=$(timeout 10 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1)
  case "$state" in idle*|mix*|alloc*|completing*) ;; *) return 1 ;; esac
  [ "${1:-}" = quick ] && return 0
  timeout 30 srun --quiet -N1 -n1 -t 1 hostname >/dev/null 2>&1
}

ours() { [ ! -e "$CONF" ] || head -1 "$CONF" | grep -qF "$MARKER"; }

# --------------------------------------------------------------------------- install
install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v srun >/dev/null; then
    return 0
  fi
  command -v apt-get >/dev/null || cannot "slurmctld/slurmd/munged are not installed and there is no apt-get to install them with"
  say "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/tmp/grpo-ablate-slurm-apt.log 2>&1 \
    && apt-get install -y -qq --no-install-recommends slurm-wlm munge >>/tmp/grpo-ablate-slurm-apt.log 2>&1 \
    || { tail -20 /tmp/grpo-ablate-slurm-apt.log; cannot "apt-get could not install slurm-wlm and munge (log above)"; }
}

# --------------------------------------------------------------------------- configure
write_config() {
  ours || cannot "$CONF was not written by this script (a real cluster's?); not touching it"
  # the node as slurmd itself sees it (CPUs, sockets, cores, memory), so it is never INVALID;
  # a little memory stays with the system
  local node_line memory cpus
  node_line=$(slurmd -C | head -1) || die "slurmd -C failed"
  memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
  cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
  node_line=$(sed "s/RealMemory=[0-9]*/RealMemory=$((memory * 95 / 100))/; s/^NodeName=[^ ]*/NodeName=$NODE/" <<<"$node_line")
  mkdir -p /etc/slurm "$LOG_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd"
  local tmp
  tmp=$(mktemp /etc/slurm/.slurm.conf.XXXXXX)
  cat >"$tmp" <<EOF
$MARKER: a one-node cluster for development and tests ($cpus CPUs); \`scripts/slurm.sh down\` stops it
ClusterName=grpo-ablate
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# finished jobs leave squeue after a minute; a job's processes get 10 s between SIGTERM and SIGKILL
MinJobAge=60
KillWait=10
InactiveLimit=0
Waittime=0
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  chmod 644 "$tmp"
  if [ -e "$CONF" ] && cmp -s "$tmp" "$CONF"; then rm -f "$tmp"; else mv "$tmp" "$CONF"; fi
}

munge_key() {
  [ -s /etc/munge/munge.key ] && return 0
  mkdir -p /etc/munge
  mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
}

# --------------------------------------------------------------------------- start / stop
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_daemons() {   # (9>&-: the daemons must not inherit the lock)
  mkdir -p /run/munge
  chown munge:munge /run/munge
  if ! alive "$MUNGED_PID"; then
    runuser -u munge -- /usr/sbin/munged 9>&- || die "munged did not start"
  fi
  munge -n | unmunge >/dev/null 2>&1 || die "munge does not answer (munge -n | unmunge)"
  alive "$CTLD_PID" || slurmctld 9>&- || die "slurmctld did not start: $(tail -5 $LOG_DIR/slurmctld.log)"
  alive "$SLURMD_PID" || slurmd 9>&- || die "slurmd did not start: $(tail -5 $LOG_DIR/slurmd.log)"
}

wait_until_answers() {
  local i
  for i in $(seq 1 60); do
    # a node that slurmctld remembers as down (a crash, an earlier config) is taken back
    if sinfo -h -n "$NODE" -o %T 2>/dev/null | grep -qE "down|drain|fail"; then
      scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1
    fi
    answers quick && answers && return 0
    sleep 1
  done
  echo "--- $LOG_DIR/slurmctld.log"; tail -15 "$LOG_DIR/slurmctld.log" 2>/dev/null
  echo "--- $LOG_DIR/slurmd.log"; tail -15 "$LOG_DIR/slurmd.log" 2>/dev/null
  die "the cluster did not answer within 60 s (logs above)"
}

stop() {  # $1: pid file, $2: name
  alive "$1" || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || { say "$2 stopped"; return 0; }; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null
  say "$2 killed (it did not stop within 10 s)"
}

# --------------------------------------------------------------------------- commands
up() {
  if answers quick; then
    say "the cluster is up (partition debug on $NODE); nothing to do"
    return 0
  fi
  [ "$(id -u)" = 0 ] || cannot "not root: cannot install or start the SLURM daemons (sudo $0 up)"
  install_packages
  write_config
  munge_key
  start_daemons
  wait_until_answers
  say "the cluster is up: partition debug, node $NODE ($(sinfo -h -o %c -n "$NODE") CPUs); $0 down stops it"
}

down() {
  [ "$(id -u)" = 0 ] || cannot "not root: cannot stop the SLURM daemons"
  ours || cannot "$CONF was not written by this script; not stopping somebody else's cluster"
  stop "$SLURMD_PID" slurmd
  stop "$CTLD_PID" slurmctld
  stop "$MUNGED_PID" munged
}

status() {
  if answers quick; then
    sinfo
    return 0
  fi
  say "no SLURM cluster answers here ($0 up starts one)"
  return 1
}

main() {
  local command=${1:-}
  case "$command" in
    up|down)
      if [ "$(id -u)" = 0 ]; then   # one `up` or `down` at a time on this machine
        mkdir -p "$(dirname "$LOCK")"
        exec 9>"$LOCK"
        flock 9
      fi
      "$command" ;;
    status) status ;;
    *) echo "usage: $0 up | down | status" >&2; exit 2 ;;
  esac
}

main "$@"
