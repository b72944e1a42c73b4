#!/usr/bin/env bash
# Install the build into a scratch prefix, then build a consumer with find_package(coll)
# and another with pkg-config, and run both. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
prefix=$(mktemp -d /tmp/coll-install-XXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/coll-agent bin/coll-demo bin/coll-bench include/coll/coll.h lib/pkgconfig/coll.pc lib/cmake/coll/collConfig.cmake; do
    [ -e "$prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
ls "$prefix"/lib/libcoll.so* >/dev/null
# only coll_* symbols leave the library
bad=$(nm -D --defined-only "$prefix"/lib/libcoll.so | awk '$2 ~ /[TDB]/ {print $3}' | grep -v '^coll_' || true)
[ -z "$bad" ] || { echo "libcoll exports non-coll symbols: $bad"; exit 1; }
cmake -S "$src/tests/install" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
LD_LIBRARY_PATH="$prefix/lib" "$prefix/consumer/consumer"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -o "$prefix/pc" "$src/tests/install/main.c" \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs coll)
LD_LIBRARY_PATH="$prefix/lib" "$prefix/pc"
"$prefix/bin/coll-agent" --version
# the Python package: it finds libcoll under its own prefix (no COLL_LIB, no loader path)
py=${PYTHON:-/usr/bin/python3}
if [ -x "$py" ]; then
    pydir=$(ls -d "$prefix"/lib/python3*/dist-packages)
    [ -f "$pydir/coll/__init__.py" ] || { echo "missing after install: the Python package"; exit 1; }
    got=$(cd / && env -u COLL_LIB -u LD_LIBRARY_PATH PYTHONPATH="$pydir" "$py" -c \
        'import coll; print(coll.version(), coll.lib().coll_path)')
    case "$got" in
    "0."*" $prefix/lib/libcoll.so.0") ;;
    *) echo "the installed package loads the wrong library: $got"; exit 1 ;;
    esac
    # pip, offline, from the source tree
    if "$py" -c 'import setuptools, pip' 2>/dev/null; then
        cp -r "$src/python" "$prefix/pysrc"
        "$py" -m pip install -q --no-index --no-build-isolation --no-deps \
            --target "$prefix/pip" "$prefix/pysrc" >"$prefix/pip.log" 2>&1 ||
            { cat "$prefix/pip.log"; exit 1; }
        (cd / && COLL_LIB="$prefix/lib/libcoll.so.0" PYTHONPATH="$prefix/pip" "$py" -c \
            'import coll, coll.collective; print("pip:", coll.version())')
    else
        echo "skipped: pip install (no pip or setuptools for $py)"
    fi
fi
LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/coll-bench" --help >/dev/null 2>&1 || [ $? -le 2 ]
LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/coll-demo" --help >/dev/null 2>&1 || [ $? -le 2 ]
echo "install test passed"
