#!/usr/bin/env bash
# A real one-node Slurm on this machine (munged, slurmctld, slurmd on localhost), the 2-rank
# batch script submitted with sbatch, its output checked (the job completed, the loss fell), and
# the daemons stopped by pid. Installs Debian's Slurm 22.05 packages when missing.
#
#   .ci/slurm-one-node.sh BUILD_DIR     (with BUILD_DIR/apps/train/longattn-train built)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
program=$(cd "$1" && pwd)/apps/train/longattn-train
[ -x "$program" ] || { echo "slurm-one-node.sh: no $program" >&2; exit 2; }
if ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge > /dev/null
fi

work=$(mktemp -d /tmp/longattn-slurm.XXXXXX)
munge_pid= ; ctld_pid= ; slurmd_pid=
# wait_for_exit PID: up to 5 s for the process to end (daemons write their state on the way out).
wait_for_exit() {
  for _ in $(seq 50); do kill -0 "$1" 2> /dev/null || return 0; sleep 0.1; done
}
stop() {
  [ -n "$ctld_pid" ] && scontrol shutdown > /dev/null 2>&1 || true
  for pid in $slurmd_pid $ctld_pid; do
    wait_for_exit "$pid"
    kill "$pid" 2> /dev/null || true
    wait_for_exit "$pid"
  done
  # munged writes its seed file into $work/munge as it exits: removing the folder before it has
  # ended fails ("Directory not empty"), and that failure was the script's exit status.
  if [ -n "$munge_pid" ]; then
    kill "$munge_pid" 2> /dev/null || true
    wait_for_exit "$munge_pid"
  fi
  if [ "${ok:-0}" != 1 ]; then tail -n 20 "$work"/*.log 2> /dev/null || true; fi
  rm -rf "$work" || echo "slurm-one-node.sh: could not remove $work (left in place)" >&2
}
trap stop EXIT

# munge: a key of our own, its socket and pid file in the work dir.
mkdir -p "$work/munge" "$work/state" "$work/spool" "$work/job"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$work/munge"; chmod 400 "$work/munge/munge.key"
munged --key-file="$work/munge/munge.key" --socket="$work/munge/socket" --pid-file="$work/munge/pid" \
  --log-file="$work/munge/log" --seed-file="$work/munge/seed" --force
munge_pid=$(cat "$work/munge/pid")

cpus=$(nproc)
cat > "$work/slurm.conf" <<CONF
ClusterName=longattn-ci
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=ci Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf
slurmctld -f "$SLURM_CONF"
for _ in $(seq 50); do [ -s "$work/slurmctld.pid" ] && break; sleep 0.1; done
ctld_pid=$(cat "$work/slurmctld.pid")
slurmd -f "$SLURM_CONF"
for _ in $(seq 50); do [ -s "$work/slurmd.pid" ] && break; sleep 0.1; done
slurmd_pid=$(cat "$work/slurmd.pid")
for _ in $(seq 100); do sinfo -h -o %T 2> /dev/null | grep -q idle && break; sleep 0.2; done
sinfo

# The batch script as users submit it; a short run (CI checks the machinery, not the model).
cd "$work/job"
job=$(LONGATTN_TRAIN=$program sbatch --parsable --export=ALL --chdir="$work/job" \
  "$root/apps/slurm/train-one-node.sbatch" --steps 12 --layers 2 --embed 128 --eval-every 0 --json "$work/job/summary.json")
echo "submitted job $job"
for _ in $(seq 600); do
  state=$(scontrol show job "$job" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 0.5
done
cat "$work/job/longattn-train-$job.out"
[ "$state" = COMPLETED ] || { echo "slurm-one-node.sh: job $job ended $state" >&2; exit 1; }
python3 - "$work/job/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
first, last, ranks = s["summary"]["first_loss"], s["summary"]["last_loss"], s["grid"]["dp"] * s["grid"]["cp"]
print(f"slurm job: {ranks} ranks, loss {first:.3f} -> {last:.3f}")
assert ranks == 2, "the batch script ran 2 ranks"
assert last < first - 0.5, "the loss fell"
PY
# Resubmitted, the script resumes from the checkpoint the first job left.
job=$(LONGATTN_TRAIN=$program sbatch --parsable --export=ALL --chdir="$work/job" --wait \
  "$root/apps/slurm/train-one-node.sbatch" --steps 14 --layers 2 --embed 128 --eval-every 0)
grep -q "resumed   from .* at step 12" "$work/job/longattn-train-$job.out" || {
  cat "$work/job/longattn-train-$job.out"; echo "slurm-one-node.sh: the second job did not resume" >&2; exit 1; }
echo "slurm-one-node.sh: both jobs completed; the second resumed at step 12"
ok=1
