#!/usr/bin/env bash
# The one entry point of the README's quick start:
#   scripts/run.sh example    install what is missing, build, run the Fashion-MNIST cluster
#   scripts/run.sh example ctr   the same for the CTR example (sharded embedding tables)
#   scripts/run.sh example dlrm  a DLRM-style model in libtorch on the CTR example's data, and its
#                                single-process libtorch reference
#   scripts/run.sh example hello_cluster   the smallest example: a variable, a worker function
#   scripts/run.sh test       install what is missing, build, run the whole test suite
#   scripts/run.sh sanitize   the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/run.sh bench      the cluster, variable, checkpoint, TLS, metrics and end-to-end benchmarks (print tables of ratios),
#                             and pscoro beside PyTorch's RPC parameter server when Debian's python3-torch is installed
#   scripts/run.sh fuzz SECONDS [TARGET...]   each libFuzzer target (tests/fuzz), or those named, for SECONDS under ASan + UBSan
#                                 (clang), from the seed corpus; prints a summary per target
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ meson ninja-build pkg-config cmake libasio-dev libprotobuf-dev protobuf-compiler
          libxtensor-dev xtl-dev libfmt-dev doctest-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libisal-dev
          libbenchmark-dev libssl-dev openssl dataset-fashion-mnist python3 python3-protobuf python3-crc32c python3-numpy
          python3-yaml  # the deploy test parses examples/deploy's manifests
          iproute2 nftables)  # the last two: test hosts in network namespaces with faulty links

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "pscoro needs these Debian packages; install them, then run this again:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}

# configure DIR OPTION=VALUE...: sets DIR up with these meson options, or switches an existing DIR
# over to them (one set up by hand, by an older run.sh, or before an option existed: `meson setup
# --reconfigure` reads the options file again, where `meson configure` refuses an option it does
# not know yet).
configure() {
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${@/#/-D}" >/dev/null
    return
  fi
  local wrong
  wrong=$(meson introspect "$dir" --buildoptions | /usr/bin/python3 -c '
import json, sys
def text(v):
    return " ".join(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)
have = {o["name"]: text(o["value"]) for o in json.load(sys.stdin)}
print(" ".join("-D" + o for o in sys.argv[1:] if have.get(o.split("=", 1)[0]) != o.split("=", 1)[1]))' "$@")
  # shellcheck disable=SC2086  # one word per option
  [ -z "$wrong" ] || meson setup --reconfigure "$dir" $wrong >/dev/null
}

# The one build of example, test and bench: release (-O3, what users run and benchmark) with the
# tests in it, so CI compiles the library once and sees every -O3 warning in what users run. The
# test programs are -O0: they are glue around the library, which is where they spend their time,
# and -O1 took half as long again to compile them; the benchmarks -O3 for bench, -O0 for test
# (which only compiles them). Failures are chased in build-sanitize (scripts/run.sh sanitize:
# ASan + UBSan, line tables). Arguments: more OPTION=VALUE (test: torch=enabled).
configure_build() {
  configure build buildtype=release tests_optimization=0 "$@"
}

# build DIR: compiles everything in DIR and says how long it took.
build() {
  local start=$SECONDS
  meson compile -C "$1"
  echo "scripts/run.sh: $1 built in $((SECONDS - start)) s"
}

# run_tests DIR: runs the suite and prints "N passed, N failed" over the test cases of every test
# executable; fails if anything failed. (Debian's python3 comes with meson.)
run_tests() {
  local dir=$1 status=0 start=$SECONDS
  meson test -C "$dir" --print-errorlogs --num-processes 2 || status=$?
  echo "scripts/run.sh: $dir tests ran in $((SECONDS - start)) s"
  /usr/bin/python3 scripts/count_tests.py "$dir/meson-logs/testlog.json" || status=1
  return "$status"
}

case "${1:-}" in
  example)
    example=fashion_mnist
    case "${2:-}" in ctr | dlrm | fashion_mnist | hello_cluster) example=$2; shift ;; esac
    options=()
    if [ "$example" = dlrm ]; then
      # libtorch, and OpenBLAS for its matrix products: Debian's libtorch calls libblas.so.3, the
      # reference BLAS unless an optimized one is installed (~20x slower for the MLPs; serial, as
      # every process runs libtorch on one thread: docs/design.md, The DLRM example).
      packages+=(libtorch-dev libopenblas0-serial)
      options=(torch=enabled)
    fi
    setup() { install_missing && configure_build "${options[@]}" && meson compile -C build pscoro-launch "$example"; }
    log_format=${PSCORO_LOG_FORMAT:-text}
    if [ "${log_format,,}" = json ]; then
      # Every line of a JSON run is a JSON log line: the setup's own output (packages, meson, ninja)
      # goes to a file, shown only when the setup fails.
      setup_log=$(mktemp)
      setup > "$setup_log" 2>&1 || { cat "$setup_log" >&2; rm -f "$setup_log"; exit 1; }
      rm -f "$setup_log"
    else
      setup
    fi
    extra=()
    # The generated training data: ctr's 1M lines (~1.2 GB as TSV and TFRecord); dlrm reads 2M
    # lines of the same generator as TSV (~500 MB more, a directory of their own).
    [ "$example" = ctr ] || [ "$example" = dlrm ] && extra=(--data-dir build/ctr-data)
    exec build/tools/pscoro-launch --ps 2 --workers 2 -- "build/examples/$example" "${extra[@]}" "${@:2}"
    ;;
  test)
    packages+=(slurm-wlm munge)  # the Slurm process test runs a real one-node Slurm
    packages+=(libtorch-dev libopenblas0-serial)  # the torch and dlrm tests (<pscoro/torch.hpp>)
    packages+=(curl)             # the metrics test scrapes /metrics (it installs promtool itself)
    packages+=(chromium chromium-driver python3-selenium)  # the cluster page in a real browser
    install_missing
    # torch=enabled, not the default auto: a build set up by `example` before libtorch was
    # installed is then reconfigured, and finds it (a fresh one would anyway).
    configure_build torch=enabled benchmarks_optimization=0  # benchmarks: a compile check
    build build
    run_tests build
    ;;
  sanitize)
    # clang++: it compiles this build in half the CPU time g++ takes under ASan + UBSan, and CI then
    # builds with both compilers, warnings as errors (docs/design.md, Build).
    packages+=(clang libclang-rt-dev)
    install_missing
    # meson cannot switch a build's compiler: a build-sanitize set up with g++ is set up anew.
    if [ -f build-sanitize/build.ninja ] && ! grep -q '^ command = clang++ ' build-sanitize/build.ninja; then
      rm -rf build-sanitize
    fi
    # -O1 (ASan's advice; at -O0 the process tests take minutes of pure xtensor) for the library,
    # tools and examples; the test programs at -O0, a third of the compile time under ASan + UBSan
    # (docs/design.md, Build). -g1: line tables, all a sanitizer's stack trace needs.
    CXX=clang++ configure build-sanitize b_sanitize=address,undefined b_lundef=false optimization=1 \
      debug=false cpp_args=-g1 tests_optimization=0 control_optimization=0 benchmarks=false
    build build-sanitize
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 run_tests build-sanitize
    ;;
  bench)
    install_missing
    configure_build benchmarks_optimization=build
    meson compile -C build cluster_bench variable_bench checkpoint_bench tls_bench metrics_bench \
      fashion_mnist_bench fashion_mnist pscoro-launch
    build/benchmarks/cluster_bench
    build/benchmarks/variable_bench
    build/benchmarks/checkpoint_bench
    build/benchmarks/tls_bench
    build/benchmarks/metrics_bench
    build/benchmarks/fashion_mnist_bench
    # The peer is no dependency of pscoro, so bench does not install it (python3-torch: ~130 MB
    # beyond libtorch); Debian's python3, the one that sees the package.
    if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
      /usr/bin/python3 benchmarks/torch_rpc_bench.py --build build
    else
      echo "scripts/run.sh: skipped pscoro beside PyTorch's RPC (benchmarks/torch_rpc_bench.py): /usr/bin/python3 cannot" \
        "import torch; to run it: sudo apt-get install -y python3-torch"
    fi
    ;;
  fuzz)
    seconds=${2:-60}
    packages+=(clang libclang-rt-dev)  # clang++ and libFuzzer: only this command needs them
    install_missing
    # The shared library, as every other build: meson 1.0.1 builds a static libpscoro.a from the
    # unity-built control code's objects, and names one more unit than it compiles when their
    # sources are a multiple of unity_size (36 now), so the targets on libpscoro.a did not link.
    CXX=clang++ configure build-fuzz fuzz=true b_sanitize=address,undefined b_lundef=false \
      default_library=shared examples=false benchmarks=false
    # Every target tests/fuzz has (a list kept here had fallen behind: cache and http never ran).
    targets=()
    for source in tests/fuzz/*_fuzz.cpp; do
      name=${source##*/}
      targets+=("${name%_fuzz.cpp}")
    done
    if [ $# -gt 2 ]; then targets=("${@:3}"); fi  # fuzz SECONDS TARGET...: only those
    meson compile -C build-fuzz "${targets[@]/%/_fuzzer}"
    # New inputs go to a scratch corpus, never into the committed one (copy a finding there by
    # hand, with the fix); crash files go to build-fuzz/fuzz-artifacts/.
    mkdir -p build-fuzz/fuzz-artifacts
    summary=()
    failed=0
    for t in "${targets[@]}"; do
      scratch=build-fuzz/fuzz-corpus/$t
      mkdir -p "$scratch"
      log=build-fuzz/fuzz-$t.log
      echo "fuzzing $t for ${seconds}s (log: $log)"
      status=0
      # -malloc_limit_mb: the targets' limits are far below it; an allocation past it is a finding.
      # -entropic=0: libFuzzer's entropic schedule spent 75% of the worker target's time updating
      # its feature frequencies (its own bookkeeping) once the scratch corpus had grown to ~700
      # inputs: 3 runs/s against 376 without it, and the plain schedule reached more coverage
      # (docs/design.md, Fuzzing).
      ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        "build-fuzz/tests/fuzz/${t}_fuzzer" -max_total_time="$seconds" -entropic=0 -malloc_limit_mb=512 -rss_limit_mb=2048 \
        -timeout=30 -print_final_stats=1 -artifact_prefix="build-fuzz/fuzz-artifacts/$t-" \
        "$scratch" "tests/fuzz/corpus/$t" >"$log" 2>&1 || status=$?
      runs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
      speed=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
      added=$(grep -oE '^stat::new_units_added: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
      cov=$(grep -oE '#[0-9]+[[:space:]]+(INITED|DONE)[[:space:]]+cov: [0-9]+ ft: [0-9]+' "$log" | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+)/\1 \2/' |
            tr '\n' ' ' || true)
      read -r cov0 ft0 cov1 ft1 _ <<<"$cov ? ? ? ?"  # _: the padding left over, not in ft1
      found="none"
      if [ "$status" -ne 0 ]; then
        found="CRASH (exit $status): $(grep -m1 -E 'ERROR: |==[0-9]+==|fuzz invariant broken|Assertion' "$log" || echo see log)"
        failed=$((failed + 1))
      fi
      # new units: libFuzzer's count of inputs it kept (reductions of kept ones too); the scratch
      # corpus outlives a run, so its file count is not what this run found
      summary+=("$(printf '%-13s execs %-9s exec/s %-6s cov %s -> %s  features %s -> %s  new units %s (scratch corpus %s files)  findings: %s' \
        "$t" "${runs:-?}" "${speed:-?}" "$cov0" "$cov1" "$ft0" "$ft1" "${added:-?}" "$(ls "$scratch" | wc -l)" "$found")")
    done
    printf '%s\n' "${summary[@]}"
    [ "$failed" -eq 0 ]
    ;;
  *)
    echo "usage: scripts/run.sh example [fashion_mnist|ctr|dlrm|hello_cluster] | test | sanitize | bench | fuzz SECONDS [TARGET...]" >&2
    exit 2
    ;;
esac
