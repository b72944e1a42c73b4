#!/bin/sh
# run.sh AGENT LIB: the Python package's tests (pytest) against that agent binary and
# libcoll. Exits 77 (skipped) where the interpreter lacks pytest or numpy.
py=${PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
    echo "skipped: $py lacks pytest or numpy (apt-get install python3-pytest python3-numpy)"
    exit 77
fi
export COLL_AGENT="$1" COLL_LIB="$2" PYTHONDONTWRITEBYTECODE=1
exec "$py" -m pytest -q -p no:cacheprovider "$(dirname "$0")"
