#!/usr/bin/env bash
# Real installs: `meson install` of this build into a scratch root, then an out-of-tree program (the
# hello_cluster example: a chief, ps and workers that co_await) built against the installed files
# three ways -- pkg-config, CMake find_package, meson dependency() -- with g++ and with clang++,
# under -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror and no pscoro-specific flag, and run
# as a cluster by the installed pscoro-launch. Also: the SONAME, that no protobuf or internal symbol
# is exported, and that including Asio first with other settings is an #error that says why.
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
warnings=(-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)
cp "$program" "$work/hello_cluster.cpp"

# runs LABEL BINARY: the program trains on a cluster of 1 ps and 2 workers under the installed launcher.
runs() {
  "$prefix/bin/pscoro-launch" --ps 1 --workers 2 -- "$2" 4 > "$work/run.log" 2>&1
  local code=$?
  check "$1: the cluster exits 0 (got $code)" test "$code" -eq 0
  check "$1: the chief prints the four results" \
    grep -qxF "[chief] chief: 4 closures on 2 workers returned 6 12 18 24" "$work/run.log"
  [ "$code" -eq 0 ] || tail -n 20 "$work/run.log"
}

# build_with COMPILER WAY: builds the program with COMPILER the WAY way (pkg-config, cmake, meson)
# in $work/WAY-COMPILER; prints the binary's path, or fails with the build's log in build.log there.
build_with() {
  local compiler=$1 way=$2 dir="$work/$2-$1"
  mkdir -p "$dir"
  case $way in
    pkg-config)
      # shellcheck disable=SC2046  # pkg-config's flags are words
      $compiler -std=c++20 -O0 "${warnings[@]}" "$work/hello_cluster.cpp" $(pkg-config --cflags --libs pscoro) \
        -o "$dir/hello_cluster" > "$dir/build.log" 2>&1 || return 1
      echo "$dir/hello_cluster"
      ;;
    cmake)
      cat > "$dir/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.16)
project(hello_consumer CXX)
find_package(pscoro $major.$minor CONFIG REQUIRED)
add_executable(hello_cluster ../hello_cluster.cpp)
target_compile_options(hello_cluster PRIVATE ${warnings[*]})
target_link_libraries(hello_cluster PRIVATE pscoro::pscoro)
EOF
      { cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_CXX_COMPILER="$compiler" -DCMAKE_BUILD_TYPE=Debug \
          -DCMAKE_CXX_FLAGS=-g0 -DCMAKE_PREFIX_PATH="$prefix" && cmake --build "$dir/build"; } > "$dir/build.log" 2>&1 ||
        return 1
      echo "$dir/build/hello_cluster"
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

# The six builds are most of this test's time and share nothing: they run at once, the checks after.
ways=(pkg-config cmake meson)
declare -A how=([pkg-config]="with pkg-config's flags only" [cmake]="with find_package(pscoro) and pscoro::pscoro"
                [meson]="with dependency('pscoro')")
declare -A builder
for compiler in g++ clang++; do
  for way in "${ways[@]}"; do
    build_with "$compiler" "$way" > "$work/$way-$compiler.path" &
    builder[$way-$compiler]=$!
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

  echo "--- $compiler, Asio included before pscoro with other settings"
  printf '#include <string>\n#include <asio/io_context.hpp>\n#include <pscoro/error.hpp>\nint main() {}\n' > "$work/asio_first.cpp"
  $compiler -std=c++20 -fsyntax-only -I"$includedir" "$work/asio_first.cpp" > "$work/error.log" 2>&1
  code=$?
  check "$compiler: the translation unit fails (got $code)" test "$code" -ne 0
  check "$compiler: the #error says Asio was included before pscoro" grep -q "Asio was included before pscoro" "$work/error.log"
done

finish
