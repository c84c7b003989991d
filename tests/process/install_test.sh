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

for compiler in g++ clang++; do
  echo "--- $compiler, pkg-config"
  out="$work/pkg-config-$compiler"
  # shellcheck disable=SC2046  # pkg-config's flags are words
  if $compiler -std=c++20 -O0 "${warnings[@]}" "$work/hello_cluster.cpp" $(pkg-config --cflags --libs pscoro) \
      -o "$out" > "$work/build.log" 2>&1; then
    check "$compiler builds the program with pkg-config's flags only" true
    runs "$compiler, pkg-config" "$out"
  else
    head -n 40 "$work/build.log"
    check "$compiler builds the program with pkg-config's flags only" false
  fi

  echo "--- $compiler, CMake find_package"
  mkdir -p "$work/cmake-$compiler"
  cat > "$work/cmake-$compiler/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.16)
project(hello_consumer CXX)
find_package(pscoro $major.$minor CONFIG REQUIRED)
add_executable(hello_cluster ../hello_cluster.cpp)
target_compile_options(hello_cluster PRIVATE ${warnings[*]})
target_link_libraries(hello_cluster PRIVATE pscoro::pscoro)
EOF
  if cmake -S "$work/cmake-$compiler" -B "$work/cmake-$compiler/build" -G Ninja -DCMAKE_CXX_COMPILER="$compiler" \
      -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-g0 -DCMAKE_PREFIX_PATH="$prefix" > "$work/build.log" 2>&1 &&
     cmake --build "$work/cmake-$compiler/build" >> "$work/build.log" 2>&1; then
    check "$compiler builds the program with find_package(pscoro) and pscoro::pscoro" true
    runs "$compiler, CMake" "$work/cmake-$compiler/build/hello_cluster"
  else
    tail -n 40 "$work/build.log"
    check "$compiler builds the program with find_package(pscoro) and pscoro::pscoro" false
  fi

  echo "--- $compiler, meson dependency()"
  mkdir -p "$work/meson-$compiler"
  cat > "$work/meson-$compiler/meson.build" << EOF
project('hello_consumer', 'cpp', default_options: ['cpp_std=c++20', 'warning_level=3', 'werror=true', 'debug=false'])
executable('hello_cluster', '../hello_cluster.cpp', dependencies: dependency('pscoro', version: '>=$major.$minor'),
  cpp_args: ['-Wshadow', '-Wconversion'])
EOF
  if CXX=$compiler meson setup "$work/meson-$compiler/build" "$work/meson-$compiler" > "$work/build.log" 2>&1 &&
     meson compile -C "$work/meson-$compiler/build" >> "$work/build.log" 2>&1; then
    check "$compiler builds the program with dependency('pscoro')" true
    runs "$compiler, meson" "$work/meson-$compiler/build/hello_cluster"
  else
    tail -n 40 "$work/build.log"
    check "$compiler builds the program with dependency('pscoro')" false
  fi

  echo "--- $compiler, Asio included before pscoro with other settings"
  printf '#include <string>\n#include <asio/io_context.hpp>\n#include <pscoro/error.hpp>\nint main() {}\n' > "$work/asio_first.cpp"
  $compiler -std=c++20 -fsyntax-only -I"$includedir" "$work/asio_first.cpp" > "$work/error.log" 2>&1
  code=$?
  check "$compiler: the translation unit fails (got $code)" test "$code" -ne 0
  check "$compiler: the #error says Asio was included before pscoro" grep -q "Asio was included before pscoro" "$work/error.log"
done

finish
