"""Reads examples/deploy for deploy_test.sh with a real YAML parser (Debian's python3-yaml).

usage: /usr/bin/python3 deploy_manifests.py check DEPLOY_DIR RUN_SH
         one line per check: "ok DESCRIPTION" or "FAILED DESCRIPTION: what was found"
       /usr/bin/python3 deploy_manifests.py tfjob-tf-configs TFJOB_YAML NAMESPACE [CLUSTER_DOMAIN]
         "TYPE<tab>INDEX<tab>TF_CONFIG" for every replica, as the training operator makes it
       /usr/bin/python3 deploy_manifests.py job-pods JOBS_YAML NAMESPACE
         "TYPE<tab>INDEX<tab>NAME=VALUE..." for every pod of jobs.yaml that gets TF_CONFIG: its
         environment as Kubernetes gives it (HOSTNAME, JOB_COMPLETION_INDEX, the container's env)
       /usr/bin/python3 deploy_manifests.py trainjob-pods TRAINJOB_YAML NAMESPACE
         the same for trainjob.yaml's pods, as Trainer v2's JobSet makes them
       /usr/bin/python3 deploy_manifests.py dockerfile DOCKERFILE meson-options|entrypoint|runtime-packages

TF_CONFIG as the training operator (kubeflow/training-operator, kubeflow.org/v1) makes it, from
pkg/controller.v1/tensorflow/tensorflow.go (genTFConfigJSONStr, genClusterSpec), util.go
(GetPortFromTFJob, isDistributed) and tfjob_controller.go (SetClusterSpec): every replica type,
the Evaluator too, is a job of the cluster, lowercased; task i of type t in namespace n is
"<job>-<t>-<i>.<n>.svc[.<CUSTOM_CLUSTER_DOMAIN>]:<port>", the port being that of the port named
"tfjob-port" of the container named "tensorflow" (2222 without one); JSON as Go's encoding/json
writes it (no spaces, map keys sorted, struct fields in order: cluster, task, environment "cloud");
no TF_CONFIG at all for a job of one replica; only the "tensorflow" container gets it.

Pods of a TrainJob (Kubeflow Trainer v2) as its JobSet (kubernetes-sigs/jobset, v1alpha2) makes
them: the JobSet is named as the TrainJob; replicated job r makes Jobs <jobset>-r-<job index>, whose
pods have hostname <jobset>-r-<job index>-<completion index>, the JobSet's name as subdomain (its
headless Service's), and the labels jobset.sigs.k8s.io/jobset-name and jobset.sigs.k8s.io/job-index.
trainer_crd_schemas.yaml, beside this file, holds the parts of Trainer v2's CRD schemas the
manifests are validated against (and says where they come from).
"""
import json
import os
import re
import shlex
import sys

import yaml

IMAGE_USER = 1000  # examples/deploy/Dockerfile's USER, every pod's runAsUser
TFJOB_REPLICAS = {"Chief": 1, "PS": 2, "Worker": 3, "Evaluator": 1}
TFJOB_RESTARTS = {"Chief": "ExitCode", "PS": "ExitCode", "Worker": "OnFailure", "Evaluator": "OnFailure"}
# Signals the operator's ExitCode policy retries (train_util.IsRetryableExitCode): 128 + SIGINT,
# SIGKILL, SIGUSR1, SIGTERM.
RETRYABLE_EXIT_CODES = [130, 137, 138, 143]
MIN_SECRET_BYTES = 16
# scripts/run.sh installs these for the tests, benchmarks and example data only: not in the build stage.
NOT_FOR_BUILDING = {"doctest-dev", "libbenchmark-dev", "openssl", "dataset-fashion-mnist", "python3",
                    "python3-protobuf", "python3-crc32c", "python3-numpy", "python3-yaml", "iproute2",
                    "nftables", "slurm-wlm", "munge"}

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
TRAINJOB_REPLICATED_JOBS = ["chief", "ps", "worker", "evaluator"]
RFC_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_crd_schemas.yaml")

results = []


def check(description, ok, found=""):
    results.append(f"ok {description}" if ok else f"FAILED {description}: {found}")


def documents(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def env_value(container, name):
    entry = env_of(container).get(name)
    return None if entry is None else entry.get("value")


def option(arguments, name):
    """The value after `name` in a list of program arguments, or None."""
    arguments = list(arguments or [])
    return arguments[arguments.index(name) + 1] if name in arguments[:-1] else None


def check_pod(label, pod, container_name, image, secret, claim, needs_secret, needs_checkpoints):
    """What every pod of both variants must be: pscoro's image as uid 1000, locked down; the secret
    (mounted read-only, named by PSCORO_AUTH_SECRET_FILE) when it is in the cluster; the checkpoint
    claim at --checkpoint-dir when it saves or reads checkpoints."""
    spec = pod["spec"]
    context = spec.get("securityContext", {})
    check(f"{label}: runs as uid {IMAGE_USER}, not root (runAsNonRoot)",
          context.get("runAsNonRoot") is True and context.get("runAsUser") == IMAGE_USER
          and context.get("runAsGroup") == IMAGE_USER and context.get("fsGroup") == IMAGE_USER, context)
    containers = spec.get("containers", [])
    check(f"{label}: one container, named {container_name}",
          [c.get("name") for c in containers] == [container_name], [c.get("name") for c in containers])
    if not containers:
        return
    container = containers[0]
    check(f"{label}: image {image}", container.get("image") == image, container.get("image"))
    locked = container.get("securityContext", {})
    check(f"{label}: no privilege escalation, a read-only root file system, no capabilities",
          locked.get("allowPrivilegeEscalation") is False and locked.get("readOnlyRootFilesystem") is True
          and "ALL" in locked.get("capabilities", {}).get("drop", []), locked)
    check(f"{label}: a memory limit (a ps holds at most 3/4 of it)",
          "memory" in container.get("resources", {}).get("limits", {}), container.get("resources"))

    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = container.get("volumeMounts", [])
    secret_mounts = [m for m in mounts if "secret" in volumes.get(m["name"], {})]
    secret_file = env_value(container, "PSCORO_AUTH_SECRET_FILE")
    if needs_secret:
        good = []
        for m in secret_mounts:
            source = volumes[m["name"]]["secret"]
            key = os.path.relpath(secret_file, m["mountPath"]) if secret_file else None
            if (source.get("secretName") == secret["metadata"]["name"] and key in secret_keys(secret)
                    and m.get("readOnly") is True and source.get("defaultMode", 0o644) & 0o007 == 0):
                good.append(m)
        check(f"{label}: PSCORO_AUTH_SECRET_FILE ({secret_file}) is a key of Secret "
              f"{secret['metadata']['name']}, mounted read-only and unreadable to others",
              len(good) == 1, [(m, volumes[m["name"]]) for m in secret_mounts])
    else:
        check(f"{label}: no cluster secret (it is no task of the cluster)",
              not secret_mounts and secret_file is None, (secret_mounts, secret_file))

    claim_mounts = [m for m in mounts
                    if volumes.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName")
                    == claim["metadata"]["name"]]
    if needs_checkpoints:
        directory = option(container.get("args"), "--checkpoint-dir")
        check(f"{label}: claim {claim['metadata']['name']} mounted at --checkpoint-dir ({directory})",
              len(claim_mounts) == 1 and claim_mounts[0]["mountPath"] == directory, claim_mounts)
    else:
        check(f"{label}: no checkpoint volume", not claim_mounts, claim_mounts)


def schema_errors(value, schema, path="$"):
    """What the API server's structural validation of a custom resource would refuse in value: an
    unknown field (kubectl's strict field validation, the default since Kubernetes 1.27), a wrong
    type, a missing required field, a value outside an enum or a bound."""
    errors = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: {value!r} is not an integer"]
    elif kind in types and not isinstance(value, types[kind]):
        return [f"{path}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value} is under the minimum {schema['minimum']}")
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{path}: shorter than {schema['minLength']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{path}: longer than {schema['maxLength']}")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: more than {schema['maxItems']} items")
    if kind == "array":
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    if kind == "object" and not schema.get("x-kubernetes-preserve-unknown-fields"):
        properties = schema.get("properties", {})
        if len(value) < schema.get("minProperties", 0):
            errors.append(f"{path}: fewer than {schema['minProperties']} fields")
        errors += [f"{path}: no field {name!r} (unknown field)" for name in value if name not in properties]
        errors += [f"{path}: required field {name!r} is missing" for name in schema.get("required", [])
                   if name not in value]
        for name, field in value.items():
            if name in properties:
                errors += schema_errors(field, properties[name], f"{path}.{name}")
    return errors


def secret_keys(secret):
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def check_manifests(deploy, run_sh):
    parsed = {}
    for name in sorted(os.listdir(deploy)):
        if name.endswith(".yaml"):
            try:
                parsed[name] = documents(os.path.join(deploy, name))
                check(f"{name}: {len(parsed[name])} YAML document(s) parse", True)
            except yaml.YAMLError as e:
                check(f"{name}: parses as YAML", False, str(e).replace("\n", " "))
    kinds = {name: [(d.get("apiVersion"), d.get("kind")) for d in docs] for name, docs in parsed.items()}
    expected_kinds = {
        "secret.yaml": [("v1", "Secret")],
        "checkpoints.yaml": [("v1", "PersistentVolumeClaim")],
        "tfjob.yaml": [("kubeflow.org/v1", "TFJob")],
        "jobs.yaml": [("v1", "Service")] + [("batch/v1", "Job")] * 4,
        "trainjob.yaml": [(TRAINER_API, "TrainingRuntime"), (TRAINER_API, "TrainJob")],
    }
    check("the manifests are secret.yaml, checkpoints.yaml, tfjob.yaml, jobs.yaml and trainjob.yaml, of the kinds they say",
          kinds == expected_kinds, kinds)
    if kinds != expected_kinds:
        return

    (secret,) = parsed["secret.yaml"]
    with open(os.path.join(deploy, "secret.yaml")) as f:
        secret_text = f.read()
    placeholder = secret.get("stringData", {}).get("auth-secret", "")
    check("secret.yaml says how to make a secret (openssl rand -hex 32)", "openssl rand -hex 32" in secret_text)
    check(f"secret.yaml's placeholder is refused by every task (under {MIN_SECRET_BYTES} bytes)",
          0 < len(placeholder.encode()) < MIN_SECRET_BYTES, placeholder)
    (claim,) = parsed["checkpoints.yaml"]
    check("the checkpoint claim is ReadWriteMany (chief and evaluator may be on different nodes)",
          claim["spec"].get("accessModes") == ["ReadWriteMany"], claim["spec"].get("accessModes"))

    image = None
    (tfjob,) = parsed["tfjob.yaml"]
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    counts = {t: r.get("replicas", 1) for t, r in replicas.items()}
    check(f"TFJob replicas {TFJOB_REPLICAS}", counts == TFJOB_REPLICAS, counts)
    restarts = {t: r.get("restartPolicy") for t, r in replicas.items()}
    check(f"TFJob restart policies {TFJOB_RESTARTS}", restarts == TFJOB_RESTARTS, restarts)
    run_policy = tfjob["spec"].get("runPolicy", {})
    check("TFJob runPolicy.cleanPodPolicy Running: nothing runs on after the job has ended",
          run_policy.get("cleanPodPolicy") == "Running", run_policy)
    check("TFJob runPolicy.backoffLimit bounds crash loops", isinstance(run_policy.get("backoffLimit"), int),
          run_policy)
    if "Chief" not in replicas:
        return
    image = replicas["Chief"]["template"]["spec"]["containers"][0].get("image")
    steps = option(replicas["Chief"]["template"]["spec"]["containers"][0].get("args"), "--steps")
    for rtype, replica in replicas.items():
        pod = replica["template"]
        in_cluster = rtype != "Evaluator"
        check_pod(f"TFJob {rtype}", pod, "tensorflow", image, secret, claim, needs_secret=in_cluster,
                  needs_checkpoints=rtype in ("Chief", "Evaluator"))
        container = pod["spec"]["containers"][0]
        ports = [(p.get("name"), p.get("containerPort")) for p in container.get("ports", [])]
        if in_cluster:
            check(f"TFJob {rtype}: port 2222 named tfjob-port (the operator's)", ports == [("tfjob-port", 2222)], ports)
            check(f"TFJob {rtype}: runs the image's entrypoint (fashion_mnist)", "command" not in container,
                  container.get("command"))
        else:
            check("TFJob Evaluator: runs fashion_mnist_evaluator until the chief's last step",
                  container.get("command") == ["fashion_mnist_evaluator"]
                  and steps is not None and option(container.get("args"), "--until-step") == steps,
                  (container.get("command"), container.get("args"), steps))
            check("TFJob Evaluator: mounts the checkpoints read-only",
                  all(m.get("readOnly") for m in container.get("volumeMounts", [])), container.get("volumeMounts"))

    service, *jobs = parsed["jobs.yaml"]
    by_name = {j["metadata"]["name"]: j for j in jobs}
    names = sorted(by_name)
    expected_names = sorted(f"fashion-mnist-{t}" for t in ("chief", "ps", "worker", "evaluator"))
    check(f"jobs.yaml: Jobs {expected_names}", names == expected_names, names)
    if names != expected_names:
        return
    sspec = service["spec"]
    check("jobs.yaml: the Service is headless, publishes pods before they are ready, port 2222",
          sspec.get("clusterIP") == "None" and sspec.get("publishNotReadyAddresses") is True
          and [p.get("port") for p in sspec.get("ports", [])] == [2222], sspec)
    selector = sspec.get("selector", {})
    for name, job in sorted(by_name.items()):
        spec = job["spec"]
        pod = spec["template"]
        container = pod["spec"]["containers"][0]
        labels = pod.get("metadata", {}).get("labels", {})
        selected = all(labels.get(k) == v for k, v in selector.items())
        if name == "fashion-mnist-evaluator":
            check_pod(f"Job {name}", pod, "pscoro", image, secret, claim, needs_secret=False, needs_checkpoints=True)
            check(f"Job {name}: runs fashion_mnist_evaluator until the chief's last step, restarted on failure",
                  container.get("command") == ["fashion_mnist_evaluator"]
                  and option(container.get("args"), "--until-step") == steps
                  and pod["spec"].get("restartPolicy") == "OnFailure",
                  (container.get("command"), container.get("args"), pod["spec"].get("restartPolicy")))
            check(f"Job {name}: not behind the Service (it listens nowhere)", not selected, labels)
            continue
        env = {k: v.get("value") for k, v in env_of(container).items()}
        task_type = env.get("PSCORO_TASK_TYPE")
        check_pod(f"Job {name}", pod, "pscoro", image, secret, claim, needs_secret=True,
                  needs_checkpoints=task_type == "chief")
        count = {"chief": 1, "ps": env.get("PSCORO_PS_REPLICAS"), "worker": env.get("PSCORO_WORKER_REPLICAS")}
        wanted = {"chief": 1, "ps": 2, "worker": 3}.get(task_type)
        check(f"Job {name}: Indexed, {wanted} pods at once, PSCORO_*_REPLICAS agreeing",
              spec.get("completionMode") == "Indexed" and spec.get("completions") == wanted
              and spec.get("parallelism") == wanted and str(count.get(task_type)) == str(wanted)
              and env.get("PSCORO_PS_REPLICAS") == "2" and env.get("PSCORO_WORKER_REPLICAS") == "3",
              (spec.get("completionMode"), spec.get("completions"), spec.get("parallelism"), env))
        check(f"Job {name}: pods named {name}-<index> under the Service (PSCORO_JOB-PSCORO_TASK_TYPE, subdomain)",
              f"{env.get('PSCORO_JOB')}-{task_type}" == name and selected
              and pod["spec"].get("subdomain") == env.get("PSCORO_SERVICE") == service["metadata"]["name"],
              (env, pod["spec"].get("subdomain"), labels))
        namespace = env_of(container).get("PSCORO_NAMESPACE", {})
        check(f"Job {name}: PSCORO_NAMESPACE is the pod's namespace (downward API)",
              namespace.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace", namespace)
        ports = [p.get("containerPort") for p in container.get("ports", [])]
        check(f"Job {name}: PSCORO_PORT is the container's port, 2222",
              env.get("PSCORO_PORT") == "2222" and ports == [2222], (env.get("PSCORO_PORT"), ports))
        check(f"Job {name}: runs the example through tf_config_from_pod.sh",
              container.get("command") == ["tf_config_from_pod.sh", "fashion_mnist"], container.get("command"))
        rules = spec.get("podFailurePolicy", {}).get("rules", [])
        final = {"operator": "NotIn", "values": RETRYABLE_EXIT_CODES} if task_type == "chief" else \
            {"operator": "In", "values": [1]}
        expected_rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                          {"action": "FailJob", "onExitCodes": {"containerName": "pscoro", **final}}]
        check(f"Job {name}: restartPolicy Never; evictions ignored, FailJob on exit codes {final}",
              pod["spec"].get("restartPolicy") == "Never" and rules == expected_rules,
              (pod["spec"].get("restartPolicy"), rules))
    chief_args = by_name["fashion-mnist-chief"]["spec"]["template"]["spec"]["containers"][0].get("args")
    check("jobs.yaml: the chief trains as many steps as in tfjob.yaml", option(chief_args, "--steps") == steps,
          chief_args)

    check_trainjob(parsed["trainjob.yaml"], by_name, image, secret, claim)

    check_dockerfile(os.path.join(deploy, "Dockerfile"), run_sh, image)


def check_trainjob(documents_, jobs, image, secret, claim):
    """trainjob.yaml: valid against Trainer v2's CRD schemas, and the same Jobs as jobs.yaml's, but
    for the names JobSet gives them (the JobSet's subdomain, the TrainJob's name from a label)."""
    runtime, trainjob = documents_
    with open(SCHEMAS) as f:
        schemas = yaml.safe_load(f)
    for document in documents_:
        errors = schema_errors(document, schemas[document["kind"]])
        check(f"trainjob.yaml: the {document['kind']} is valid against Trainer v2's CRD schema", not errors, errors)
    name = trainjob["metadata"]["name"]
    check(f"trainjob.yaml: the TrainJob's name ({name}) is an RFC 1035 label of at most 63 characters (its CRD's rule)",
          RFC_1035_LABEL.match(name) is not None and len(name) <= 63, name)
    reference = trainjob["spec"]["runtimeRef"]
    check("trainjob.yaml: the TrainJob runs the TrainingRuntime beside it",
          reference.get("kind") == "TrainingRuntime" and reference.get("name") == runtime["metadata"]["name"]
          and reference.get("apiGroup", "trainer.kubeflow.org") == "trainer.kubeflow.org", reference)
    jobset = runtime["spec"]["template"]["spec"]
    network = jobset.get("network", {})
    check("trainjob.yaml: the JobSet gives pods DNS names, published before they are ready, under its own subdomain",
          network.get("enableDNSHostnames") is True and network.get("publishNotReadyAddresses") is True
          and "subdomain" not in network, network)
    check("trainjob.yaml: a Job that fails fails the JobSet (failurePolicy.maxRestarts 0)",
          jobset.get("failurePolicy", {}).get("maxRestarts") == 0 and not jobset.get("failurePolicy", {}).get("rules"),
          jobset.get("failurePolicy"))
    replicated = {r["name"]: r for r in jobset["replicatedJobs"]}
    check(f"trainjob.yaml: replicated jobs {TRAINJOB_REPLICATED_JOBS}, one Job each",
          [r["name"] for r in jobset["replicatedJobs"]] == TRAINJOB_REPLICATED_JOBS
          and all(r.get("replicas", 1) == 1 for r in jobset["replicatedJobs"]), list(replicated))
    from_label = {"jobset-name": "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
                  "job-index": "metadata.labels['jobset.sigs.k8s.io/job-index']"}
    for rname, rjob in replicated.items():
        job = rjob["template"]["spec"]
        pod = job["template"]
        container = pod["spec"]["containers"][0]
        twin = jobs[f"fashion-mnist-{rname}"]["spec"]  # jobs.yaml's Job for the same role
        check(f"TrainJob {rname}: an Indexed Job (JobSet's DNS hostnames need one)",
              job.get("completionMode") == "Indexed", job.get("completionMode"))
        in_cluster = rname != "evaluator"
        check_pod(f"TrainJob {rname}", pod, "pscoro", image, secret, claim, needs_secret=in_cluster,
                  needs_checkpoints=rname in ("chief", "evaluator"))
        check(f"TrainJob {rname}: no subdomain of its own (the JobSet's Service is the subdomain)",
              "subdomain" not in pod["spec"], pod["spec"].get("subdomain"))
        # Apart from the names, each Job is jobs.yaml's: counts, restarts, command, arguments, ports.
        defaults = {"completions": 1, "parallelism": 1, "backoffLimit": 6, "podFailurePolicy": None}  # batch/v1's
        differ = {k: (job.get(k, d), twin.get(k, d)) for k, d in defaults.items() if job.get(k, d) != twin.get(k, d)}
        check(f"TrainJob {rname}: completions, parallelism, backoffLimit and podFailurePolicy as jobs.yaml's",
              not differ, differ)
        twin_container = twin["template"]["spec"]["containers"][0]
        fields = ["command", "args", "ports", "resources", "volumeMounts"]
        check(f"TrainJob {rname}: its container runs as jobs.yaml's ({', '.join(fields)}; restartPolicy)",
              all(container.get(k) == twin_container.get(k) for k in fields)
              and pod["spec"].get("restartPolicy") == twin["template"]["spec"].get("restartPolicy"),
              {k: container.get(k) for k in fields if container.get(k) != twin_container.get(k)})
        if not in_cluster:
            continue
        env = env_of(container)
        twin_env = env_of(twin_container)
        sources = {k: env.get(k, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                   for k in ("PSCORO_JOB", "PSCORO_SERVICE", "PSCORO_JOBSET_JOB_INDEX")}
        check(f"TrainJob {rname}: PSCORO_JOB and PSCORO_SERVICE are the JobSet's name, PSCORO_JOBSET_JOB_INDEX "
              "its Job index (labels, downward API)",
              sources == {"PSCORO_JOB": from_label["jobset-name"], "PSCORO_SERVICE": from_label["jobset-name"],
                          "PSCORO_JOBSET_JOB_INDEX": from_label["job-index"]}, sources)
        rest = {k: v for k, v in env.items() if k not in sources}
        twin_rest = {k: v for k, v in twin_env.items() if k not in ("PSCORO_JOB", "PSCORO_SERVICE")}
        check(f"TrainJob {rname}: the rest of its environment is jobs.yaml's", rest == twin_rest,
              {"trainjob.yaml": rest, "jobs.yaml": twin_rest})


def dockerfile_stages(path):
    """[(base, alias, [(INSTRUCTION, text)])] of a Dockerfile: comments dropped, lines joined."""
    with open(path) as f:
        text = f.read()
    lines, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):  # Docker drops comment lines, inside continued ones too
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            lines.append(current.strip())
        current = ""
    stages = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append((words[0], alias, []))
        elif stages:
            stages[-1][2].append((instruction, rest.strip()))
    return stages


def run_commands(stage):
    """The simple commands of a stage's RUN instructions (split at &&)."""
    commands = []
    for instruction, text in stage[2]:
        if instruction == "RUN":
            commands += [shlex.split(c) for c in text.split("&&")]
    return commands


def apt_packages(stage):
    packages = []
    for words in run_commands(stage):
        if "apt-get" in words and "install" in words:
            packages += [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
    return packages


def meson_options(stage):
    for words in run_commands(stage):
        if words[:2] == ["meson", "setup"]:
            return [w for w in words[2:] if w.startswith("-")]
    return []


def run_sh_packages(run_sh):
    with open(run_sh) as f:
        text = f.read()
    body = re.search(r"^packages=\((.*?)\)", text, re.S | re.M).group(1)
    return [w for line in body.splitlines() for w in line.split("#")[0].split()]


def check_dockerfile(path, run_sh, image):
    stages = dockerfile_stages(path)
    check("Dockerfile: a build and a runtime stage, both FROM debian:bookworm",
          len(stages) == 2 and all(s[0] == "debian:bookworm" for s in stages), [s[:2] for s in stages])
    if len(stages) != 2:
        return
    build, runtime = stages
    instructions = [i for s in stages for i in s[2]]
    fetching = [t for i, t in instructions
                if (i == "RUN" and re.search(r"\b(git|curl|wget|pip3?|npm)\b", t)) or (i == "ADD" and "://" in t)]
    check("Dockerfile: no network but Debian's packages (no git, curl, wget, pip, ADD of a URL)", not fetching,
          fetching)
    wanted = [p for p in run_sh_packages(run_sh) if p not in NOT_FOR_BUILDING]
    check("Dockerfile: the build stage installs scripts/run.sh's packages but the tests', benchmarks' and data",
          sorted(apt_packages(build)) == sorted(wanted),
          f"missing {sorted(set(wanted) - set(apt_packages(build)))}, "
          f"extra {sorted(set(apt_packages(build)) - set(wanted))}")
    options = meson_options(build)
    check("Dockerfile: meson builds a release, no tests or benchmarks, and installs the examples",
          {"-Dbuildtype=release", "-Dtests=false", "-Dbenchmarks=false", "-Dinstall_examples=true"} <= set(options),
          options)
    installs = [w for w in run_commands(build) if w[:2] == ["meson", "install"]]
    copies = [t for i, t in runtime[2] if i == "COPY"]
    check("Dockerfile: meson install into a --destdir, which the runtime stage copies",
          len(installs) == 1 and "--destdir" in installs[0]
          and any(t.startswith(f"--from={build[1]} {option(installs[0], '--destdir')}/") for t in copies),
          (installs, copies))
    check("Dockerfile: tf_config_from_pod.sh goes onto the runtime's PATH",
          "examples/deploy/tf_config_from_pod.sh /usr/local/bin/" in copies, copies)
    check("Dockerfile: the runtime stage installs the dataset", "dataset-fashion-mnist" in apt_packages(runtime),
          apt_packages(runtime))
    users = [t for i, t in runtime[2] if i == "USER"]
    check(f"Dockerfile: the runtime stage ends as the fixed, numeric, non-root uid {IMAGE_USER} (runAsUser)",
          users[-1:] == [f"{IMAGE_USER}:{IMAGE_USER}"], users)
    entrypoints = [t for i, t in runtime[2] if i == "ENTRYPOINT"]
    check("Dockerfile: ENTRYPOINT [\"fashion_mnist\"] (exec form, no shell)", entrypoints == ['["fashion_mnist"]'],
          entrypoints)
    with open(path) as f:
        text = f.read()
    check(f"Dockerfile: the build command names the manifests' image ({image})", f"-t {image} " in text, image)


def tfjob_tf_configs(path, namespace, domain):
    (tfjob,) = documents(path)
    name = tfjob["metadata"]["name"]
    replicas = tfjob["spec"]["tfReplicaSpecs"]

    def port(replica):  # GetPortFromTFJob
        for container in replica["template"]["spec"]["containers"]:
            if container["name"] == "tensorflow":
                for p in container.get("ports", []):
                    if p.get("name") == "tfjob-port":
                        return p["containerPort"]
        return 2222

    if sum(r.get("replicas", 1) for r in replicas.values()) == 1:  # isDistributed
        return
    svc = ".svc" + (f".{domain}" if domain else "")
    cluster = {}
    for rtype, replica in replicas.items():  # genClusterSpec: the Evaluator too
        rt = rtype.lower()
        cluster[rt] = [f"{name}-{rt}-{i}.{namespace}{svc}:{port(replica)}".replace("/", "-")
                       for i in range(replica.get("replicas", 1))]
    for rtype, replica in replicas.items():
        for i in range(replica.get("replicas", 1)):
            tf_config = {"cluster": dict(sorted(cluster.items())), "task": {"type": rtype.lower(), "index": i},
                         "environment": "cloud"}
            print(f"{rtype.lower()}\t{i}\t{json.dumps(tf_config, separators=(',', ':'))}")


def job_pods(path, namespace):
    for job in documents(path)[1:]:
        spec = job["spec"]
        container = spec["template"]["spec"]["containers"][0]
        env = []
        for entry in container.get("env", []):
            field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env.append(f"{entry['name']}={namespace if field == 'metadata.namespace' else entry['value']}")
        task_type = next((e.split("=", 1)[1] for e in env if e.startswith("PSCORO_TASK_TYPE=")), None)
        if task_type is None:
            continue  # the evaluator: no TF_CONFIG
        for i in range(spec.get("completions", 1)):
            pod_env = [f"HOSTNAME={job['metadata']['name']}-{i}", f"JOB_COMPLETION_INDEX={i}"] + env
            print("\t".join([task_type, str(i)] + pod_env))


def trainjob_pods(path, namespace):
    runtime, trainjob = documents(path)
    jobset = trainjob["metadata"]["name"]
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        spec = rjob["template"]["spec"]
        container = spec["template"]["spec"]["containers"][0]
        for job_index in range(rjob.get("replicas", 1)):
            labels = {"jobset.sigs.k8s.io/jobset-name": jobset, "jobset.sigs.k8s.io/job-index": str(job_index)}
            env = []
            for entry in container.get("env", []):
                field = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                if field is None:
                    value = entry["value"]
                elif field == "metadata.namespace":
                    value = namespace
                else:
                    label = re.fullmatch(r"metadata\.labels\['(.+)'\]", field)
                    value = labels[label.group(1)]  # a label JobSet does not set is a KeyError: a failed check
                env.append(f"{entry['name']}={value}")
            task_type = next((e.split("=", 1)[1] for e in env if e.startswith("PSCORO_TASK_TYPE=")), None)
            if task_type is None:
                continue  # the evaluator: no TF_CONFIG
            for i in range(spec.get("completions", 1)):
                pod_env = [f"HOSTNAME={jobset}-{rjob['name']}-{job_index}-{i}", f"JOB_COMPLETION_INDEX={i}"] + env
                print("\t".join([task_type, str(i)] + pod_env))


def main():
    command = sys.argv[1]
    if command == "check":
        try:
            check_manifests(sys.argv[2], sys.argv[3])
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            check("the manifests have the structure the checks read", False, f"{type(e).__name__}: {e}")
        print("\n".join(results))
    elif command == "tfjob-tf-configs":
        tfjob_tf_configs(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
    elif command == "job-pods":
        job_pods(sys.argv[2], sys.argv[3])
    elif command == "trainjob-pods":
        trainjob_pods(sys.argv[2], sys.argv[3])
    elif command == "dockerfile":
        build, runtime = dockerfile_stages(sys.argv[2])
        field = sys.argv[3]
        if field == "meson-options":
            print("\n".join(meson_options(build)))
        elif field == "entrypoint":
            entrypoint = [t for i, t in runtime[2] if i == "ENTRYPOINT"][-1]
            print(json.loads(entrypoint)[0])
        elif field == "runtime-packages":
            print("\n".join(apt_packages(runtime)))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
