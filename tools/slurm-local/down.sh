#!/usr/bin/env bash
# Stops exactly the daemons tools/slurm-local/up.sh started (pids in $STATE/pids, newest first),
# cancels nothing else, and removes the files it wrote (slurm.conf, cgroup.conf, slurmdbd.conf,
# its /etc/hosts lines). Safe to run twice, or when up.sh failed half-way.
set -uo pipefail
STATE=/var/tmp/canzona-slurm
MARK="# written by canzona tools/slurm-local/up.sh"
[ "$(id -u)" -eq 0 ] || { echo "slurm-local: needs root" >&2; exit 2; }
if [ -s "$STATE/pids" ]; then
  command -v scancel >/dev/null && scancel --full --quiet --user=root 2>/dev/null || true
  tac "$STATE/pids" | while read -r name pid; do
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    echo "slurm-local: stopped $name ($pid)"
  done
  : > "$STATE/pids"
fi
for f in /etc/slurm/slurm.conf /etc/slurm/cgroup.conf /etc/slurm/slurmdbd.conf; do
  [ -f "$f" ] && head -1 "$f" | grep -qF "$MARK" && rm -f "$f"
done
if grep -qF "$MARK" /etc/hosts; then
  # /etc/hosts may be a bind mount: rewrite it in place rather than replacing the file
  kept=$(grep -vF "$MARK" /etc/hosts); printf '%s\n' "$kept" > /etc/hosts
fi
exit 0
