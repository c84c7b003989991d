#!/usr/bin/env bash
# Real installs: `meson install` of this build into a scratch root, then an out-of-tree program (the
# hello_cluster example: a chief, ps and workers that co_await) built against the installed files
# three ways -- pkg-config, CMake find_package, meson dependency() -- with g++ and with clang++,
# under -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror and no pscoro-specific flag, and run
# as a cluster by the installed pscoro-launch. Also: the SONAME, that no protobuf or internal symbol
# is exported; that pscoro.pc needs only the .pc files of the public headers' packages (fmt,
# xtensor, xtl), not those of the library's own dependencies; that a program which includes Asio
# before pscoro builds with the Asio settings pscoro.pc and pscoro::pscoro carry, and that without
# them it is an #error that says why.
# usage: install_test.sh BUILD_DIR HELLO_CLUSTER_CPP
set -uo pipefail
build=$1
program=$2
source "$(dirname "$0")/checks.sh"

root="$work/root"
if ! meson install -C "$build" --no-rebuild --destdir "$root" > "$work/install.log" 2>&1; then
  cat "$work/install.log"
  check "meson install into a scratch root succeeds" false
  finish
fi
option() {  # option NAME: a meson option of the build (prefix, libdir, includedir)
  meson introspect "$build" --buildoptions |
    /usr/bin/python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == '$1'))"
}
prefix="$root$(option prefix)"
libdir="$prefix/$(option libdir)"
includedir="$prefix/$(option includedir)"
version=$(meson introspect "$build" --projectinfo | /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['version'])")
IFS=. read -r major minor _ <<< "$version"
soname="libpscoro.so.$major"
[ "$major" = 0 ] && soname="libpscoro.so.0.$minor"

echo "--- the installed files"
check "pscoro.pc is installed in $libdir/pkgconfig" test -f "$libdir/pkgconfig/pscoro.pc"
check "the CMake package is installed in $libdir/cmake/pscoro" \
  test -f "$libdir/cmake/pscoro/pscoroConfig.cmake" -a -f "$libdir/cmake/pscoro/pscoroConfigVersion.cmake"
check "the generated <pscoro/config.hpp> is installed" grep -q "PSCORO_VERSION_STRING \"$version\"" "$includedir/pscoro/config.hpp"
check "no build template is installed with the headers" test ! -e "$includedir/pscoro/config.hpp.in" -a ! -e "$includedir/pscoro/meson.build"
readelf -d "$libdir/libpscoro.so" > "$work/dynamic.txt"
check "the library's SONAME is $soname" grep -qF "Library soname: [$soname]" "$work/dynamic.txt"
nm -DC --defined-only "$libdir/libpscoro.so" > "$work/exported.txt"
private=$(grep -cE 'google::|pscoro::(wire|runtime|tf)::' "$work/exported.txt")
check "the library exports no symbol of protobuf or of its internals (found $private)" test "$private" -eq 0
check "the library exports pscoro's API (parameter_server_strategy)" \
  grep -q 'pscoro::parameter_server_strategy::parameter_server_strategy' "$work/exported.txt"

export PKG_CONFIG_PATH="$libdir/pkgconfig"
export LD_LIBRARY_PATH="$libdir"

echo "--- pscoro.pc with only the public headers' packages"
# A machine with pscoro's runtime and the -dev packages of its public headers only: pkg-config's
# default search path is replaced by a directory holding just fmt.pc, xtensor.pc and xtl.pc.
public_pc="$work/public-pc"
mkdir -p "$public_pc"
for package in fmt xtensor xtl; do
  cp "$(pkg-config --variable=pcfiledir "$package")/$package.pc" "$public_pc/"
done
only_public() { PKG_CONFIG_LIBDIR="$public_pc" pkg-config "$@"; }
check "the private dependencies' .pc files are out of sight there (protobuf, openssl, zlib, libisal, nlohmann_json)" \
  bash -c "! PKG_CONFIG_LIBDIR='$public_pc' pkg-config --exists protobuf openssl zlib libisal nlohmann_json"
only_public --cflags --libs pscoro > "$work/flags.txt" 2>&1
code=$?
check "pkg-config --cflags --libs pscoro works with them alone (exit $code: $(tr '\n' ' ' < "$work/flags.txt"))" \
  test "$code" -eq 0
for definition in ASIO_DISABLE_STD_ALIGNED_ALLOC ASIO_HAS_CO_AWAIT=1 ASIO_HAS_STD_COROUTINE=1; do
  check "pscoro.pc's Cflags define $definition" grep -qwF -- "-D$definition" "$work/flags.txt"
done
# A static library's consumer links the library's own dependencies too: Libs.private names them as
# plain -l flags, so their .pc files are not needed either.
only_public --static --libs pscoro > "$work/static.txt" 2>&1
code=$?
check "pkg-config --static --libs pscoro works with them alone (exit $code)" test "$code" -eq 0
for library in -lprotobuf -lssl -lcrypto -lz -lisal; do
  check "pkg-config --static --libs pscoro links $library" grep -qwF -- "$library" "$work/static.txt"
done
warnings=(-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)
cp "$program" "$work/hello_cluster.cpp"
# Asio first, then pscoro: builds only with the Asio settings the package carries.
cat > "$work/asio_first.cpp" << 'EOF'
#include <asio.hpp>
#include <pscoro/pscoro.hpp>

#include <cstdio>

asio::awaitable<std::size_t> count_workers() {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  co_await timer.async_wait(asio::use_awaitable);
  co_return pscoro::cluster_spec::from_json(R"({"worker": ["w0:1", "w1:1"]})").num_tasks("worker");
}

int main() {
  asio::io_context io;
  asio::co_spawn(io, count_workers(), [](std::exception_ptr e, std::size_t n) {
    if (!e) std::printf("asio first: %zu workers\n", n);
  });
  io.run();
}
EOF

# runs LABEL BINARY: the program trains on a cluster of 1 ps and 2 workers under the installed launcher.
runs() {
  "$prefix/bin/pscoro-launch" --ps 1 --workers 2 -- "$2" 4 > "$work/run.log" 2>&1
  local code=$?
  check "$1: the cluster exits 0 (got $code)" test "$code" -eq 0
  check "$1: the chief prints the four results" \
    grep -qE "$(line_of chief:0)chief: 4 closures on 2 workers returned 6 12 18 24\$" "$work/run.log"
  [ "$code" -eq 0 ] || tail -n 20 "$work/run.log"
}

# build_with COMPILER WAY [PROGRAM]: builds PROGRAM (hello_cluster, the default, or asio_first) from
# $work/PROGRAM.cpp with COMPILER the WAY way (pkg-config, cmake, meson) in $work/WAY-COMPILER[-PROGRAM];
# prints the binary's path, or fails with the build's log in build.log there.
build_with() {
  local compiler=$1 way=$2 name=${3:-hello_cluster}
  local dir="$work/$2-$1${3:+-$3}"
  mkdir -p "$dir"
  case $way in
    pkg-config)
      # shellcheck disable=SC2046  # pkg-config's flags are words
      $compiler -std=c++20 -O0 "${warnings[@]}" "$work/$name.cpp" $(pkg-config --cflags --libs pscoro) \
        -o "$dir/$name" > "$dir/build.log" 2>&1 || return 1
      echo "$dir/$name"
      ;;
    cmake)
      cat > "$dir/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.16)
project(hello_consumer CXX)
find_package(pscoro $major.$minor CONFIG REQUIRED)
add_executable($name ../$name.cpp)
target_compile_options($name PRIVATE ${warnings[*]})
target_link_libraries($name PRIVATE pscoro::pscoro)
EOF
      { cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_BUILD_TYPE=Debug \
          -DCMAKE_CXX_FLAGS=-g0 -DCMAKE_PREFIX_PATH="$prefix" && cmake --build "$dir/build"; } > "$dir/build.log" 2>&1 ||
        return 1
      echo "$dir/build/$name"
      ;;
    meson)
      cat > "$dir/meson.build" << EOF
project('hello_consumer', 'cpp', default_options: ['cpp_std=c++20', 'warning_level=3', 'werror=true', 'debug=false'])
executable('hello_cluster', '../hello_cluster.cpp', dependencies: dependency('pscoro', version: '>=$major.$minor'),
  cpp_args: ['-Wshadow', '-Wconversion'])
EOF
      { CXX=$compiler meson setup "$dir/build" "$dir" && meson compile -C "$dir/build"; } > "$dir/build.log" 2>&1 ||
        return 1
      echo "$dir/build/hello_cluster"
      ;;
  esac
}

# The ten builds are most of this test's time and share nothing: they run at once, the checks after.
ways=(pkg-config cmake meson)
declare -A how=([pkg-config]="with pkg-config's flags only" [cmake]="with find_package(pscoro) and pscoro::pscoro"
                [meson]="with dependency('pscoro')")
declare -A builder
for compiler in g++ clang++; do
  for way in "${ways[@]}"; do
    build_with "$compiler" "$way" > "$work/$way-$compiler.path" &
    builder[$way-$compiler]=$!
  done
  for way in pkg-config cmake; do
    build_with "$compiler" "$way" asio_first > "$work/$way-$compiler-asio_first.path" &
    builder[$way-$compiler-asio_first]=$!
  done
done

for compiler in g++ clang++; do
  for way in "${ways[@]}"; do
    echo "--- $compiler, $way"
    wait "${builder[$way-$compiler]}"
    built=$?
    check "$compiler builds the program ${how[$way]} (exit $built)" test "$built" -eq 0
    if [ "$built" -eq 0 ]; then
      runs "$compiler, $way" "$(cat "$work/$way-$compiler.path")"
    else
      tail -n 40 "$work/$way-$compiler/build.log"
    fi
  done

  for way in pkg-config cmake; do
    echo "--- $compiler, $way, Asio included before pscoro"
    wait "${builder[$way-$compiler-asio_first]}"
    built=$?
    check "$compiler builds a program that includes <asio.hpp> before <pscoro/pscoro.hpp> ${how[$way]} (exit $built)" \
      test "$built" -eq 0
    if [ "$built" -eq 0 ]; then
      check "$compiler, $way: the Asio-first program runs" \
        grep -qxF "asio first: 2 workers" <("$(cat "$work/$way-$compiler-asio_first.path")" 2>&1)
    else
      tail -n 40 "$work/$way-$compiler-asio_first/build.log"
    fi
  done

  echo "--- $compiler, Asio included before pscoro without pscoro's Asio settings"
  printf '#include <string>\n#include <asio/io_context.hpp>\n#include <pscoro/error.hpp>\nint main() {}\n' > "$work/asio_bare.cpp"
  $compiler -std=c++20 -fsyntax-only -I"$includedir" "$work/asio_bare.cpp" > "$work/error.log" 2>&1
  code=$?
  check "$compiler: the translation unit fails (got $code)" test "$code" -ne 0
  check "$compiler: the #error says Asio was included before pscoro" grep -q "Asio was included before pscoro" "$work/error.log"
done

finish
