#!/usr/bin/env bash
# A one-node SLURM on this machine, for running pipert under a real srun (root; Debian 12's
# slurm-wlm and munge, which scripts/deps.sh installs):
#   scripts/slurm-one-node.sh start   writes /etc/slurm/slurm.conf for this host (every core, tasks
#                                      may outnumber them), starts munged, slurmctld and slurmd, and
#                                      waits until the node takes jobs
#   scripts/slurm-one-node.sh stop    stops the three daemons
# KillOnBadExit=0: a task that fails does not end its step (elastic replicas need the others
# to run on). Jobs then run with `srun --overcommit -n N ...`.
set -euo pipefail
host=$(hostname -s)
cores=$(nproc)

stop() {
  pkill -x slurmd 2>/dev/null || true
  pkill -x slurmctld 2>/dev/null || true
  pkill -x munged 2>/dev/null || true
}

start() {
  [ "$(id -u)" = 0 ] || { echo "slurm-one-node.sh: needs root" >&2; exit 77; }
  command -v slurmctld >/dev/null || { echo "slurm-one-node.sh: slurm-wlm is not installed (scripts/deps.sh)" >&2; exit 77; }
  if [ -f /etc/slurm/slurm.conf ] && ! grep -q '^ClusterName=pipert$' /etc/slurm/slurm.conf; then
    echo "slurm-one-node.sh: /etc/slurm/slurm.conf is another SLURM's: left alone" >&2; exit 77
  fi
  stop
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
  chown munge:munge /run/munge
  cat >/etc/slurm/slurm.conf <<EOF
ClusterName=pipert
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
KillOnBadExit=0
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=$cores State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null;
                                   chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  su -s /bin/sh munge -c munged
  slurmctld
  slurmd
  for _ in $(seq 1 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm-one-node.sh: node $host takes jobs ($cores cores)"; return 0
    fi
    sleep 0.5
  done
  echo "slurm-one-node.sh: the node did not come up; /var/log/slurm/ says why" >&2
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
