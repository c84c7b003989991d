#!/usr/bin/env bash
# A real Slurm on this machine (Debian's slurm-wlm and munge): a one-node cluster configured in a
# scratch directory, with its own ports, state, munge key and socket, so it touches nothing of the
# machine's own. The Fashion-MNIST example runs under `srun -n 5` and under `sbatch`, each task
# finding its role with pscoro's Slurm resolver (chief, ps, 3 workers); each job ends when its chief
# does, because the chief ends the job (its servers exit with its code): srun returns the chief's
# code and Slurm records the job COMPLETED with exit code 0, or FAILED with the chief's code 1.
# Every daemon this test started is stopped. Skipped (exit 77) where it cannot run, saying why.
# usage: slurm_test.sh FASHION_MNIST
set -uo pipefail
example=$1
skip() { echo "SKIPPED: $1"; exit 77; }

[ "$(id -u)" -eq 0 ] || skip "the test's slurmd runs jobs as their users, which needs root"
for tool in munged mungekey slurmctld slurmd srun sbatch scontrol; do
  command -v "$tool" > /dev/null || skip "$tool is not installed (scripts/run.sh test installs slurm-wlm and munge)"
done

source "$(dirname "$0")/checks.sh"
daemons=()  # pid files of what this test started
cleanup() {
  for pid_file in "${daemons[@]}"; do
    [ -f "$pid_file" ] && kill -TERM "$(cat "$pid_file")" 2> /dev/null
  done
  for pid_file in "${daemons[@]}"; do
    for _ in $(seq 100); do
      [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2> /dev/null || break
      sleep 0.1
    done
    [ -f "$pid_file" ] && kill -9 "$(cat "$pid_file")" 2> /dev/null
  done
  kill -9 $(jobs -p) 2> /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# free_ports N: N ports nobody listens on now (the kernel's choice).
free_ports() {
  /usr/bin/python3 -c '
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in held])' "$1"
}
# free_base N: a port p such that p .. p+N-1 are all free (the tasks of one node take consecutive ports).
free_base() {
  /usr/bin/python3 -c '
import random, socket, sys
n = int(sys.argv[1])
for _ in range(1000):
    base = random.randrange(20000, 60000 - n)
    held = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); held.append(s); s.bind(("127.0.0.1", p))
        print(base); break
    except OSError:
        pass
    finally:
        for s in held: s.close()' "$1"
}

mkdir -p "$work"/{munge,state,spool,log}
mungekey --create --keyfile="$work/munge/munge.key" || skip "mungekey cannot create a key"
chmod 400 "$work/munge/munge.key"
socket=$work/munge/munge.socket
munged --force --socket="$socket" --key-file="$work/munge/munge.key" --log-file="$work/log/munged.log" \
  --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/munged.seed" ||
  { cat "$work/log/munged.log"; skip "munged does not start here"; }
daemons+=("$work/munge/munged.pid")

read -r ctld_port slurmd_port < <(free_ports 2)
export SLURM_CONF=$work/slurm.conf
# One node, "localhost", claiming 8 CPUs on a smaller machine (config_overrides) so five tasks fit;
# no cgroups (proctrack/pgid, task/none) and no accounting database: Slurm itself keeps the job's
# state and exit code for MinJobAge seconds, where scontrol reads them.
cat > "$SLURM_CONF" << EOF
ClusterName=pscorotest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=pscoro Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
daemons+=("$work/slurmctld.pid" "$work/slurmd.pid")
slurmctld -f "$SLURM_CONF" || { cat "$work/log/slurmctld.log"; skip "slurmctld does not start here"; }
slurmd -f "$SLURM_CONF" -N localhost || { cat "$work/log/slurmd.log"; skip "slurmd does not start here"; }
node_up() { sinfo -h -N -o '%T' 2> /dev/null | grep -qE '^(idle|mixed|allocated)$'; }
for _ in $(seq 300); do node_up && break; sleep 0.1; done
node_up || { tail -n 20 "$work"/log/slurm*.log; skip "the test's Slurm node did not come up"; }
echo "Slurm $(sinfo -V | awk '{print $2}') on localhost: slurmctld on port $ctld_port, slurmd on $slurmd_port"

# The tasks listen on localhost, ports from a free base; they share a cluster secret, as a real
# job's tasks on several nodes must (srun passes the environment on).
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret"
chmod 600 "$work/secret"
export PSCORO_AUTH_SECRET_FILE=$work/secret
train=("$example" --steps 200 --log-every 100 --min-accuracy 0.5)

# job_field ID FIELD: the value of FIELD (JobState, ExitCode) in scontrol's record of job ID.
job_field() { scontrol show job "$1" 2> /dev/null | grep -oE "(^|[[:space:]])$2=[^[:space:]]+" | head -n 1 | cut -d= -f2; }
# wait_job ID: until Slurm says job ID has ended (at most 300 s).
wait_job() {
  for _ in $(seq 3000); do
    case "$(job_field "$1" JobState)" in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.1 ;; *) return 0 ;; esac
  done
  echo "job $1 did not end within 300 s: $(scontrol show job "$1")"
  return 1
}
last_job() { squeue -h -t all -o '%i' 2> /dev/null | sort -n | tail -n 1; }

echo "--- srun -n 5: the chief trains with a ps and 3 workers; the step ends with the chief's code 0"
PSCORO_SLURM_PORT_BASE=$(free_base 5) timeout 600 srun -n 5 -J pscoro-srun -o "$work/srun-%t.log" "${train[@]}"
code=$?
check "srun exits 0 (got $code)" test "$code" -eq 0
chief_log=$work/srun-0.log
check "rank 0 is the chief and prints the accuracy" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.[0-9]+ on 10000 images$' "$chief_log"
check "rank 1 is ps:0" grep -qE "$(line_of ps:0)"'pscoro: ps:0 listening on 127\.0\.0\.1:[0-9]+$' "$work/srun-1.log"
check "rank 4 is worker:2" grep -qE "$(line_of worker:2)"'pscoro: worker:2 listening on 127\.0\.0\.1:[0-9]+$' "$work/srun-4.log"
for rank in 1 2 3 4; do
  check "rank $rank stops when the chief ends the job" grep -qE 'ended the job with exit code 0: (ps|worker):[0-9] stops$' \
    "$work/srun-$rank.log"
done
job=$(last_job)
check "Slurm records the job COMPLETED" test "$(job_field "$job" JobState)" = COMPLETED
check "with exit code 0:0" test "$(job_field "$job" ExitCode)" = 0:0
[ "$failed" -eq 0 ] || tail -n 30 "$work"/srun-*.log

echo "--- a chief that fails ends the job with its code: srun exits 1, Slurm records FAILED 1:0"
PSCORO_SLURM_PORT_BASE=$(free_base 5) timeout 600 srun -n 5 -J pscoro-fail -o "$work/fail-%t.log" "$example" \
  --steps 20 --log-every 10 --min-accuracy 1.01
code=$?
check "srun exits 1 (got $code)" test "$code" -eq 1
check "the chief says why" grep -qE "$(line_of chief:0)"'chief: accuracy 0\.[0-9]+ is below the required 1\.01$' "$work/fail-0.log"
check "the servers heard code 1" test "$(grep -lE 'ended the job with exit code 1: ' "$work"/fail-[1-4].log | wc -l)" -eq 4
job=$(last_job)
check "Slurm records the job FAILED" test "$(job_field "$job" JobState)" = FAILED
check "with exit code 1:0" test "$(job_field "$job" ExitCode)" = 1:0

echo "--- sbatch: a batch script's srun step trains; the job completes with exit code 0"
cat > "$work/train.sbatch" << EOF
#!/bin/bash
#SBATCH --ntasks=5
#SBATCH --job-name=pscoro-batch
#SBATCH --output=$work/batch.log
export PSCORO_SLURM_PORT_BASE=$(free_base 5)
srun ${train[*]}
EOF
job=$(sbatch --parsable "$work/train.sbatch")
check "sbatch accepts the script (job '$job')" test -n "$job"
if [ -n "$job" ] && wait_job "$job"; then
  check "Slurm records the job COMPLETED" test "$(job_field "$job" JobState)" = COMPLETED
  check "with exit code 0:0" test "$(job_field "$job" ExitCode)" = 0:0
  check "the chief printed the accuracy" grep -qE "$(line_of chief:0)"'chief: test accuracy 0\.[0-9]+ on 10000 images$' "$work/batch.log"
  check "every server stopped when the chief ended the job" \
    test "$(grep -cE 'ended the job with exit code 0: (ps|worker):[0-9] stops$' "$work/batch.log")" -eq 4
else
  check "the batch job ended" false
fi
[ "$failed" -eq 0 ] || { tail -n 40 "$work/batch.log"; tail -n 20 "$work"/log/slurm*.log; }
finish
