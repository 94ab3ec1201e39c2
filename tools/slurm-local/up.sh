#!/usr/bin/env bash
# A real single-host Slurm for the project's own tests: two emulated nodes (n1, n2) on this
# machine, one slurmctld, one slurmd per node (`slurmd -N n1`), munge, and with --accounting
# slurmdbd on a private MariaDB. No systemd: the daemons are started here and their pids kept
# in $STATE/pids, so tools/slurm-local/down.sh stops exactly these and nothing else.
#
#   tools/slurm-local/up.sh [--accounting]     (root; installs Debian's packages when missing)
#
# Why two emulated nodes: every Slurm path of a sweep (preflight, one allocation per model,
# srun steps on 2 nodes, torchrun per node, kill-on-bad-exit, requeue, scancel) needs more than
# one node; the nodes share the host's 2 cores, which is enough for qwen3-micro on gloo.
# Only loopback addresses are used. Slurm state, spool and logs live under $STATE.
set -euo pipefail

STATE=/var/tmp/canzona-slurm
CONF=/etc/slurm/slurm.conf
MARK="# written by canzona tools/slurm-local/up.sh"
CTLD_PORT=16817
NODE_PORTS=(16818 16819)
DBD_PORT=16820
ACCOUNTING=0
for arg in "$@"; do
  case "$arg" in
    --accounting) ACCOUNTING=1 ;;
    *) echo "usage: $0 [--accounting]" >&2; exit 2 ;;
  esac
done

die() { echo "slurm-local: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "needs root (it installs packages, writes $CONF and starts daemons as root); run it with sudo"
if [ -f "$STATE/pids" ] && [ -s "$STATE/pids" ]; then
  die "already up (pids in $STATE/pids); run tools/slurm-local/down.sh first"
fi
if [ -f "$CONF" ] && ! head -1 "$CONF" | grep -qF "$MARK"; then
  die "$CONF exists and was not written by this script: this host has its own Slurm; refusing to touch it"
fi

packages=(slurmctld slurmd slurm-client munge)
[ "$ACCOUNTING" -eq 1 ] && packages+=(slurmdbd mariadb-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null || die "packages ${missing[*]} are missing and there is no apt-get here"
  t0=$(date +%s)
  echo "slurm-local: installing ${missing[*]}"
  apt-get update -qq
  # policy-rc.d 101: Debian's maintainer scripts must not start the packaged services
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
  echo "slurm-local: installed in $(( $(date +%s) - t0 )) s"
fi

t0=$(date +%s)
rm -rf "$STATE"
mkdir -p "$STATE"/{log,ctld,spool/n1,spool/n2}
: > "$STATE/pids"
record() { echo "$1 $2" >> "$STATE/pids"; }
host=$(hostname -s)

# Node names must resolve (torchrun's master address is the first node's name).
for n in n1 n2; do
  if ! getent hosts "$n" >/dev/null; then
    echo "127.0.0.1 n1 n2 $MARK" >> /etc/hosts
    break
  fi
done
getent hosts "$host" >/dev/null || echo "127.0.0.1 $host $MARK" >> /etc/hosts

# munge: reuse a running one (not ours to stop), else start one as the munge user.
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  install -d -o munge -g munge -m 0755 /run/munge
  [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
  record munged "$(cat /run/munge/munged.pid)"
  (munge -n | unmunge) >/dev/null || die "munged started but does not answer"
fi

if [ "$ACCOUNTING" -eq 1 ]; then
  install -d -o mysql -g mysql "$STATE/mysql" /run/mysqld
  mariadb-install-db --user=mysql --datadir="$STATE/mysql" --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.log" 2>&1
  mariadbd --user=mysql --datadir="$STATE/mysql" --socket=/run/mysqld/mysqld.sock --skip-networking \
    --pid-file="$STATE/mysql/mariadbd.pid" --log-error="$STATE/mysql/error.log" </dev/null >>"$STATE/log/mariadb.log" 2>&1 &
  record mariadbd $!
  for _ in $(seq 100); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb -e 'select 1' >/dev/null || die "mariadbd did not answer; see $STATE/mysql/error.log"
  cat > /etc/slurm/slurmdbd.conf <<DBD
$MARK
AuthType=auth/munge
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=canzona_slurm_acct
DBD
  chmod 600 /etc/slurm/slurmdbd.conf
  slurmdbd
  for _ in $(seq 100); do [ -s "$STATE/slurmdbd.pid" ] && break; sleep 0.1; done
  record slurmdbd "$(cat "$STATE/slurmdbd.pid")"
  accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/linux"
else
  accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

cat > "$CONF" <<CFG
$MARK
# Two emulated nodes on $host; see tools/slurm-local/up.sh. Removed by down.sh.
ClusterName=canzona-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits cred_expire seconds before it may start again (default 120)
AuthInfo=cred_expire=30
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
$accounting
JobCompType=jobcomp/none
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=${NODE_PORTS[0]} CPUs=2 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=${NODE_PORTS[1]} CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=cpu Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
CFG
# Slurm 22.05 reads cgroup.conf even with task/none; v1 hierarchies need the v1 plugin.
if [ -d /sys/fs/cgroup/memory ] || [ -d /sys/fs/cgroup/cpu ]; then plugin=cgroup/v1; else plugin=cgroup/v2; fi
printf '%s\nCgroupPlugin=%s\nCgroupAutomount=no\n' "$MARK" "$plugin" > /etc/slurm/cgroup.conf

if [ "$ACCOUNTING" -eq 1 ]; then
  for _ in $(seq 50); do sacctmgr -i add cluster canzona-local >/dev/null 2>&1 && break; sacctmgr -n list cluster format=cluster 2>/dev/null | grep -q canzona-local && break; sleep 0.2; done
fi
slurmctld -i
for _ in $(seq 100); do [ -s "$STATE/slurmctld.pid" ] && break; sleep 0.1; done
record slurmctld "$(cat "$STATE/slurmctld.pid")"
for n in n1 n2; do
  slurmd -N "$n"
  for _ in $(seq 100); do [ -s "$STATE/slurmd-$n.pid" ] && break; sleep 0.1; done
  record "slurmd-$n" "$(cat "$STATE/slurmd-$n.pid")"
done
for _ in $(seq 150); do
  [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -eq 2 ] && break
  sleep 0.2
done
if [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -ne 2 ]; then
  sinfo -N >&2 || true
  die "the nodes did not become idle; see $STATE/log/"
fi
echo "slurm-local: up in $(( $(date +%s) - t0 )) s: $(sinfo -h -o '%P %D %T %N'), $(sinfo -V), accounting $([ "$ACCOUNTING" -eq 1 ] && echo slurmdbd || echo none)"
