#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then builds examples/consumer against it with
# find_package(chorus CONFIG) (shared and static) and a C program with pkg-config, and runs them.
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -e "$work/prefix/lib/libchorus.so.0" || { echo "missing versioned SONAME libchorus.so.0"; exit 1; }
# Link-time optimised builds (CHORUS_LTO) install an archive of machine code only.
if readelf -S -W "$work/prefix/lib/libchorus.a" | grep -q '\.gnu\.lto_'; then
  echo "the installed libchorus.a holds GCC's LTO intermediate code"
  exit 1
fi
cmake -S "$source_dir/examples/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/consumer"
"$work/build/consumer_static"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
cc -std=c99 -Wall -Werror "$source_dir/examples/consumer/main.c" $(pkg-config --cflags --libs chorus) -o "$work/c_consumer"
LD_LIBRARY_PATH="$work/prefix/lib" "$work/c_consumer"
echo "install test passed"
