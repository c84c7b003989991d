#!/usr/bin/env bash
# The Kubernetes deployment of examples/deploy, checked without Kubernetes or Docker:
# - every YAML document parses (Debian's python3-yaml) and has the structure the docs promise:
#   replicas, restart policies, the secret mounted where PSCORO_AUTH_SECRET_FILE points, the
#   checkpoint claim at the chief's and evaluator's --checkpoint-dir, ports, one image, uid 1000;
#   trainjob.yaml's TrainingRuntime and TrainJob are valid against Kubeflow Trainer v2's CRD
#   schemas (the parts vendored in trainer_crd_schemas.yaml);
# - every replica's TF_CONFIG, as the training operator makes it for tfjob.yaml (see
#   deploy_manifests.py) and as tf_config_from_pod.sh makes it for jobs.yaml's and trainjob.yaml's
#   pods (run under dash with each pod's hostname, index and environment, as a Job or Trainer v2's
#   JobSet gives them), is read by pscoro's own resolver
#   (resolve_task): each pod is the task it should be, at its Service's address; a ps or worker
#   really listens on all interfaces at the container's port with the cluster secret, the chief's
#   strategy accepts the cluster (TF's checks), and the evaluator may not coordinate;
# - the Dockerfile read statically: its meson options configure a fresh build that installs the
#   entrypoint and every program the manifests run, and its runtime packages hold every shared
#   library the given binaries load (ldd, dpkg -S).
# What it cannot check: that the image builds (no registry to pull debian:bookworm from) and that
# a real operator, Trainer or cluster runs it.
# usage: deploy_test.sh SOURCE_ROOT RESOLVE_TASK [BINARY...]
#   (RESOLVE_TASK and each BINARY: programs whose shared libraries the image must provide)
set -uo pipefail
source_root=$(cd "$1" && pwd)
resolve=$2
binaries=("${@:2}")
here=$(dirname "$0")
deploy=$source_root/examples/deploy
skip() { echo "SKIPPED: $1"; exit 77; }

/usr/bin/python3 -c 'import yaml' 2> /dev/null || skip "Debian's python3-yaml is not installed (scripts/run.sh test installs it)"
source "$here/checks.sh"
manifests() { /usr/bin/python3 "$here/deploy_manifests.py" "$@"; }

echo "--- the manifests and the Dockerfile"
manifests check "$deploy" "$source_root/scripts/run.sh" > "$work/checks.txt"
status=$?
check "the manifest checks ran (exit $status)" test "$status" -eq 0 -a -s "$work/checks.txt"
while read -r verdict description; do
  check "$description" test "$verdict" = ok
done < "$work/checks.txt"

# Each pod has a network namespace of its own; so does each run of resolve_task when unshare can
# make one (root, or user namespaces), and then nothing on this machine's port 2222 is in the way.
pod=()
if unshare --net true 2> /dev/null; then
  pod=(unshare --net)
elif unshare --user --map-root-user --net true 2> /dev/null; then
  pod=(unshare --user --map-root-user --net)
else
  echo "(no network namespace here: the servers listen on this machine's port 2222)"
fi
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret")  # the mounted Secret's stand-in

# expect TYPE INDEX ADDRESS: what resolve_task prints for that task at that address.
expect() {
  case $1 in
    ps | worker) echo "task $1:$2 address $3 listens 0.0.0.0:2222" ;;
    chief) echo "task chief:0 address $3 coordinates 2 ps 3 workers" ;;
    *) echo "task $1:$2 address $3 coordinator refused" ;;
  esac
}

echo "--- tfjob.yaml: the training operator's TF_CONFIG, resolved by pscoro"
for namespace_domain in "default" "ml-team cluster.local"; do
  read -r namespace domain <<< "$namespace_domain"
  suffix=.svc${domain:+.$domain}
  manifests tfjob-tf-configs "$deploy/tfjob.yaml" "$namespace" "$domain" > "$work/tf_configs.txt"
  check "the operator's TF_CONFIG is made for 7 replicas in $namespace" test "$(wc -l < "$work/tf_configs.txt")" -eq 7
  while IFS=$'\t' read -r type index tf_config; do
    want=$(expect "$type" "$index" "fashion-mnist-$type-$index.$namespace$suffix:2222")
    got=$(env -i PATH="$PATH" TF_CONFIG="$tf_config" PSCORO_AUTH_SECRET_FILE="$work/secret" "${pod[@]}" "$resolve" 2>&1)
    check "TFJob $type $index in $namespace: '$want' (got '$got')" test "$got" = "$want"
  done < "$work/tf_configs.txt"
done

echo "--- jobs.yaml: tf_config_from_pod.sh's TF_CONFIG, resolved by pscoro"
manifests job-pods "$deploy/jobs.yaml" default > "$work/pods.txt"
check "jobs.yaml has 6 pods with TF_CONFIG" test "$(wc -l < "$work/pods.txt")" -eq 6
while IFS=$'\t' read -r -a fields; do
  type=${fields[0]} index=${fields[1]}
  want=$(expect "$type" "$index" "fashion-mnist-$type-$index.fashion-mnist.default.svc:2222")
  got=$(env -i PATH="$PATH" "${fields[@]:2}" PSCORO_AUTH_SECRET_FILE="$work/secret" \
    "${pod[@]}" sh "$deploy/tf_config_from_pod.sh" "$resolve" 2>&1)
  check "Job pod $type $index: '$want' (got '$got')" test "$got" = "$want"
done < "$work/pods.txt"

echo "--- trainjob.yaml: tf_config_from_pod.sh's TF_CONFIG in Trainer v2's JobSet pods, resolved by pscoro"
manifests trainjob-pods "$deploy/trainjob.yaml" default > "$work/trainjob_pods.txt"
check "trainjob.yaml has 6 pods with TF_CONFIG" test "$(wc -l < "$work/trainjob_pods.txt")" -eq 6
while IFS=$'\t' read -r -a fields; do
  type=${fields[0]} index=${fields[1]}
  want=$(expect "$type" "$index" "fashion-mnist-$type-0-$index.fashion-mnist.default.svc:2222")
  got=$(env -i PATH="$PATH" "${fields[@]:2}" PSCORO_AUTH_SECRET_FILE="$work/secret" \
    "${pod[@]}" sh "$deploy/tf_config_from_pod.sh" "$resolve" 2>&1)
  check "TrainJob pod $type $index: '$want' (got '$got')" test "$got" = "$want"
done < "$work/trainjob_pods.txt"

# A pod set up wrongly stops before the program starts, saying what is wrong.
mapfile -t worker_env < <(awk -F'\t' '$1 == "worker" && $2 == 1' "$work/pods.txt" | cut -f3- | tr '\t' '\n')
pod_fails() {  # pod_fails PATTERN VARIABLE=VALUE...: worker 1 with these changes exits 2 saying PATTERN
  local got code
  got=$(env -i PATH="$PATH" "${worker_env[@]}" "${@:2}" sh "$deploy/tf_config_from_pod.sh" echo started 2>&1)
  code=$?
  if [ "$code" -eq 2 ] && grep -q -- "$1" <<< "$got"; then return 0; fi
  echo "exit $code: $got"
  return 1
}
check "tf_config_from_pod.sh: a hostname the Service does not name fails" \
  pod_fails "hostname is 'worker-1'" HOSTNAME=worker-1
check "tf_config_from_pod.sh: an index past the replicas fails" \
  pod_fails "there are 3 worker tasks" HOSTNAME=fashion-mnist-worker-3 JOB_COMPLETION_INDEX=3
check "tf_config_from_pod.sh: a missing variable is named" pod_fails "PSCORO_SERVICE is not set" PSCORO_SERVICE=
check "tf_config_from_pod.sh: with PSCORO_JOBSET_JOB_INDEX, a hostname without JobSet's Job index fails" \
  pod_fails "the others find worker 1 as 'fashion-mnist-worker-0-1'" PSCORO_JOBSET_JOB_INDEX=0
check "tf_config_from_pod.sh: a PSCORO_JOBSET_JOB_INDEX that is no number fails" \
  pod_fails "PSCORO_JOBSET_JOB_INDEX is 'x'" PSCORO_JOBSET_JOB_INDEX=x
check "tf_config_from_pod.sh: without JOB_COMPLETION_INDEX the hostname's ordinal (a StatefulSet's) is the index" \
  test "$(env -i PATH="$PATH" "${worker_env[@]}" JOB_COMPLETION_INDEX= sh "$deploy/tf_config_from_pod.sh" \
    sh -c 'echo "$TF_CONFIG"' | grep -o '"task":.*')" = '"task":{"type":"worker","index":1}}'

echo "--- the image: the Dockerfile's meson options and runtime packages"
mapfile -t options < <(manifests dockerfile "$deploy/Dockerfile" meson-options)
# From the scratch directory: CMake, which meson asks, wants to run in a writable one.
if (cd "$work" && meson setup image-build "$source_root" "${options[@]}") > "$work/setup.log" 2>&1; then
  check "the Dockerfile's meson options (${options[*]}) configure a fresh build" true
  meson introspect "$work/image-build" --installed > "$work/installed.json"
  option() {  # option NAME: a meson option of that build
    meson introspect "$work/image-build" --buildoptions |
      /usr/bin/python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
  }
  prefix=$(option prefix)
  libdir=$prefix/$(option libdir)
  entrypoint=$(manifests dockerfile "$deploy/Dockerfile" entrypoint)
  for program in "$entrypoint" fashion_mnist_evaluator hello_cluster pscoro-launch; do
    check "meson installs $program into $prefix/bin (the image runs it)" \
      grep -qF "\"$prefix/bin/$program\"" "$work/installed.json"
  done
  check "meson installs libpscoro.so.<version> into $libdir" grep -qE "\"$libdir/libpscoro\\.so\\.[0-9.]+\"" "$work/installed.json"
else
  cat "$work/setup.log"
  check "the Dockerfile's meson options (${options[*]}) configure a fresh build" false
fi

mapfile -t runtime_packages < <(manifests dockerfile "$deploy/Dockerfile" runtime-packages)
# package_of FILE: the Debian package that installed a library ldd found (dpkg knows one of its
# names: the path, its target, or either with or without /usr, as merged /usr has it both ways).
package_of() {
  local path candidate owner
  for path in "$1" "$(readlink -f "$1")"; do
    for candidate in "$path" "${path#/usr}" "/usr$path"; do
      if owner=$(dpkg -S "$candidate" 2> /dev/null); then
        echo "${owner%%:*}"  # "libssl3:amd64: /usr/lib/x86_64-linux-gnu/libssl.so.3"
        return 0
      fi
    done
  done
  return 1
}
if [ "$(. /etc/os-release && echo "$VERSION_CODENAME")" = bookworm ] && command -v dpkg > /dev/null; then
  check "the loader of Debian bookworm looks in ${libdir:-?} (ld.so.conf), where the image has libpscoro" \
    grep -qxF -- "${libdir:-?}" <(cat /etc/ld.so.conf.d/*.conf)
  for binary in "${binaries[@]}"; do
    name=$(basename "$binary")
    ldd "$binary" > "$work/ldd.txt" 2>&1
    check "$name: ldd finds every library" test "$(grep -c 'not found' "$work/ldd.txt")" -eq 0
    while read -r library; do
      case $library in */libpscoro.so*) continue ;; esac  # the image's own, from meson install
      package=$(package_of "$library")
      check "$name needs $library: Debian package '$package' is in the runtime stage" \
        grep -qxF -- "$package" <(printf '%s\n' "${runtime_packages[@]}")
    done < <(grep -oE '(=> )?/[^ ]+ \(0x' "$work/ldd.txt" | sed -E 's/^=> //; s/ \(0x$//')
  done
else
  echo "(not Debian bookworm: the runtime packages are not checked against the binaries' libraries)"
fi

finish
