#!/usr/bin/env bash
# A real one-node Slurm on this machine (munged, slurmctld, slurmd on localhost), and on it:
#   - the 2-rank batch script submitted with sbatch, its output checked (the job completed, the
#     loss fell), then submitted again: it resumes from the checkpoint the first job left;
#   - a rank SIGKILLed in the middle of a step, in a 2-rank (ZeRO 2) and a 4-rank (tp 2 x cp 2, sequence parallel, ZeRO 1) job: the
#     launch must end within 60 s (no rank left waiting in a collective), the batch script
#     restarts it from the last checkpoint, and the final checkpoint (parameters, AdamW moments,
#     step, random state) is byte for byte an uninterrupted job's.
# The daemons are stopped by pid. Installs Debian's Slurm 22.05 packages when missing.
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

# 4 CPUs at least (config_overrides: slurmd takes the configured count), so that the 4-rank job
# runs on a 2-core machine, oversubscribed.
cpus=$(( $(nproc) > 4 ? $(nproc) : 4 ))
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
SlurmdParameters=config_overrides
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

# job_end_state JOB: waits (up to 5 min) for the job to end; prints its final state.
job_end_state() {
  local state=
  for _ in $(seq 600); do
    state=$(scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
    sleep 0.5
  done
  echo "$state"
}
# wait_for_line FILE TEXT SECONDS: until FILE has a line with TEXT; fails after SECONDS.
wait_for_line() {
  local deadline=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2> /dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "slurm-one-node.sh: no \"$2\" in $1 after $3 s" >&2; return 1; }
    sleep 0.05
  done
}

# The batch script as users submit it; a short run (CI checks the machinery, not the model).
cd "$work/job"
job=$(LONGATTN_TRAIN=$program sbatch --parsable --export=ALL --chdir="$work/job" \
  "$root/apps/slurm/train-one-node.sbatch" --steps 12 --layers 2 --embed 128 --eval-every 0 --json "$work/job/summary.json")
echo "submitted job $job"
state=$(job_end_state "$job")
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

# rank_killed RANKS VICTIM [options...]: an uninterrupted job, then the same job with rank
# VICTIM SIGKILLed while step 6 runs (the output shows step 5 done); steps of ~0.25 s here.
rank_killed() {
  local ranks=$1 victim=$2
  shift 2
  local options=(--steps 10 --checkpoint-every 2 --layers 2 --embed 128 --context 1024 --batch 8 --eval-every 0 "$@")
  local reference=$work/job/uninterrupted-$ranks.ckpt killed=$work/job/killed-$ranks.ckpt
  LONGATTN_TRAIN=$program LONGATTN_CHECKPOINT=$reference sbatch --parsable --export=ALL --chdir="$work/job" \
    --ntasks="$ranks" --wait "$root/apps/slurm/train-one-node.sbatch" "${options[@]}" > /dev/null
  local job
  job=$(LONGATTN_TRAIN=$program LONGATTN_CHECKPOINT=$killed sbatch --parsable --export=ALL --chdir="$work/job" \
    --ntasks="$ranks" "$root/apps/slurm/train-one-node.sbatch" "${options[@]}")
  local out=$work/job/longattn-train-$job.out pid= p
  wait_for_line "$out" "step     5/10" 120
  for p in $(pgrep -x longattn-train); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$victim" && pid=$p
  done
  [ -n "$pid" ] || { cat "$out"; echo "slurm-one-node.sh: no rank $victim to kill" >&2; return 1; }
  kill -KILL "$pid"
  local killed_at=$SECONDS
  wait_for_line "$out" "restart 1 of" 60 || { cat "$out"; echo "slurm-one-node.sh: the job did not end within 60 s of the kill" >&2; return 1; }
  local ended=$((SECONDS - killed_at)) state
  state=$(job_end_state "$job")
  cat "$out"
  [ "$state" = COMPLETED ] || { echo "slurm-one-node.sh: job $job ended $state" >&2; return 1; }
  local resumed
  resumed=$(sed -n 's/^resumed   from .* at step \([0-9]*\)$/\1/p' "$out")
  [ -n "$resumed" ] || { echo "slurm-one-node.sh: the restarted run did not resume from a checkpoint" >&2; return 1; }
  cmp "$reference" "$killed" || { echo "slurm-one-node.sh: the final checkpoints differ" >&2; return 1; }
  echo "slurm-one-node.sh: $ranks ranks, rank $victim killed in step 6: the launch ended ${ended} s after," \
    "the run resumed at step $resumed, final checkpoint identical to the uninterrupted job's"
}
rank_killed 2 1 --zero 2
rank_killed 4 0 --tp 2 --cp 2 --zero 1 --sequence-parallel
ok=1
