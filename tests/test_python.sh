#!/bin/sh
# The Python package (python/kvps over build/libkvps.so) with real processes on loopback:
# tests/python/test_kvps.py (what it checks is said at its top). `make test` copies this script
# into the build directory as test_python, beside the libkvps.so it tests. The tests need a
# python3 that imports numpy: /usr/bin/python3 first (Debian's, with python3-numpy), then the
# python3 on PATH (PY_CANDIDATES overrides the list); as root, scripts/deps.sh python installs
# python3-numpy where neither imports it; else it says so and counts one skipped test.
dir=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$dir/.." && pwd)
[ -f "$root/tests/python/test_kvps.py" ] || root=$(pwd)
[ -f "$root/tests/python/test_kvps.py" ] || { echo "test_python: cannot find tests/python/test_kvps.py"; echo "0 passed, 1 failed"; exit 1; }
[ -f "$dir/libkvps.so" ] || { echo "test_python: no $dir/libkvps.so (make $dir/libkvps.so)"; echo "0 passed, 1 failed"; exit 1; }
PY_CANDIDATES=${PY_CANDIDATES:-/usr/bin/python3 python3}
find_py() {
    py=
    for c in $PY_CANDIDATES; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import numpy' >/dev/null 2>&1; then py=$c; return; fi
    done
}
find_py
# as root, python3-numpy (and python3-venv) are installed as make's other packages are
if [ -z "$py" ] && [ "$(id -u)" = 0 ] && [ -x "$root/scripts/deps.sh" ]; then "$root/scripts/deps.sh" python && find_py; fi
if [ -z "$py" ]; then
    echo "skipped: no python3 that imports numpy (tried: $PY_CANDIDATES; apt-get install python3-numpy)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
echo "test_python: $py ($("$py" -c 'import sys, numpy; print("Python %d.%d, numpy %s" % (sys.version_info[0], sys.version_info[1], numpy.__version__))'))"
cd "$root" && KVPS_LIB="$dir/libkvps.so" PYTHONPATH="$root/python" exec "$py" tests/python/test_kvps.py
