#!/bin/sh
# Sets TF_CONFIG for a pod of a pscoro job on plain Kubernetes (jobs.yaml: no training operator to
# set it) or under Kubeflow Trainer v2 (trainjob.yaml: its JobSet gives no TF_CONFIG), then runs the
# program it is given:
#
#   tf_config_from_pod.sh fashion_mnist --steps 3000 --checkpoint-dir /checkpoints
#
# Task <type> <index> is the pod with hostname <job>-<type>-<index> (an Indexed Job named
# <job>-<type> names its pods so; a StatefulSet of that name does too), found by the others at
# <job>-<type>-<index>.<service>.<namespace>.svc:<port> through the headless Service that is the
# pods' subdomain. This pod's index is JOB_COMPLETION_INDEX (an Indexed Job sets it), else the
# number ending its hostname (a StatefulSet's ordinal). A JobSet puts the index of the Job within its
# replicated job between the two: with PSCORO_JOBSET_JOB_INDEX set (from the pod's label
# jobset.sigs.k8s.io/job-index, 0 for a replicated job of one Job named <type>), task <type> <index>
# is <job>-<type>-<job index>-<index>. TF_CONFIG is the training operator's form without
# "environment":
#
#   {"cluster":{"chief":["fashion-mnist-chief-0.fashion-mnist.default.svc:2222"],"ps":[...],
#    "worker":[...]},"task":{"type":"worker","index":2}}
#
# Read from the environment: PSCORO_TASK_TYPE (chief, ps or worker), PSCORO_JOB, PSCORO_SERVICE,
# PSCORO_NAMESPACE (the downward API's metadata.namespace), PSCORO_PS_REPLICAS,
# PSCORO_WORKER_REPLICAS, PSCORO_PORT (2222 when unset), PSCORO_CLUSTER_DOMAIN (appended after .svc
# when set, e.g. cluster.local), PSCORO_JOBSET_JOB_INDEX (unset outside a JobSet), and HOSTNAME
# (else uname -n). A missing or wrong value stops it
# with exit 2 and a message naming the variable, before the program starts.
set -eu

fail() {
  echo "tf_config_from_pod.sh: $*" >&2
  exit 2
}
need() {  # need NAME: prints the variable's value; fails naming it when it is unset or empty
  eval "value=\${$1:-}"
  [ -n "$value" ] || fail "$1 is not set (examples/deploy/jobs.yaml shows what to set)"
  printf '%s' "$value"
}
number() {  # number WHAT VALUE: VALUE must be a decimal number without leading zeros (JSON's)
  case $2 in
    '' | *[!0-9]* | 0?*) fail "$1 is '$2', not a number" ;;
  esac
}

[ "$#" -gt 0 ] || fail "usage: tf_config_from_pod.sh PROGRAM [ARGUMENTS...]"
type=$(need PSCORO_TASK_TYPE)
job=$(need PSCORO_JOB)
service=$(need PSCORO_SERVICE)
namespace=$(need PSCORO_NAMESPACE)
ps_replicas=$(need PSCORO_PS_REPLICAS)
number PSCORO_PS_REPLICAS "$ps_replicas"
worker_replicas=$(need PSCORO_WORKER_REPLICAS)
number PSCORO_WORKER_REPLICAS "$worker_replicas"
port=${PSCORO_PORT:-2222}
number PSCORO_PORT "$port"
domain=.svc${PSCORO_CLUSTER_DOMAIN:+.$PSCORO_CLUSTER_DOMAIN}
job_index=${PSCORO_JOBSET_JOB_INDEX:-}
[ -z "$job_index" ] || number PSCORO_JOBSET_JOB_INDEX "$job_index"

# shellcheck disable=SC3028  # the container runtime sets HOSTNAME to the pod's hostname
host=${HOSTNAME:-$(uname -n)}
index=${JOB_COMPLETION_INDEX:-${host##*-}}
number "this pod's index (JOB_COMPLETION_INDEX, else the end of its hostname '$host')" "$index"
case $type in
  chief) count=1 ;;
  ps) count=$ps_replicas ;;
  worker) count=$worker_replicas ;;
  *) fail "PSCORO_TASK_TYPE is '$type', not chief, ps or worker" ;;
esac
[ "$index" -lt "$count" ] || fail "this pod is $type $index, but there are $count $type tasks"
# The others dial this pod by that name: a pod named otherwise would never be found.
prefix=$job-$type${job_index:+-$job_index}
[ "$host" = "$prefix-$index" ] ||
  fail "this pod's hostname is '$host', but the others find $type $index as '$prefix-$index'" \
    "(an Indexed Job named $prefix with subdomain $service names its pods so)"

addresses() {  # addresses TYPE COUNT: the JSON list of the addresses of the COUNT tasks of TYPE
  list='' i=0
  while [ "$i" -lt "$2" ]; do
    list="$list${list:+,}\"$job-$1${job_index:+-$job_index}-$i.$service.$namespace$domain:$port\""
    i=$((i + 1))
  done
  printf '[%s]' "$list"
}
TF_CONFIG=$(printf '{"cluster":{"chief":%s,"ps":%s,"worker":%s},"task":{"type":"%s","index":%s}}' \
  "$(addresses chief 1)" "$(addresses ps "$ps_replicas")" "$(addresses worker "$worker_replicas")" "$type" "$index")
export TF_CONFIG
exec "$@"
