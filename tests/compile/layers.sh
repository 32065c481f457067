#!/bin/sh
# The headers' layers (issue 28), run by `make compile-test`:
#   1. every header alone, with KVPS_IMPLEMENTATION and with its own switch, as C99 -pedantic
#      -Werror and as C++;
#   2. a program that includes only kvps_codec.h builds with no zmq.h to be found (nozmq/zmq.h
#      errors) and links without libzmq;
#   3. a program that includes only kvps_ring.h holds no parameter-server code.
# Usage: tests/compile/layers.sh BUILD_DIR "ZMQ_CFLAGS" "LIBS"
set -eu
B=$1
ZCF=$2
LIBS=$3
CC=${CC:-cc}
CXX=${CXX:-c++}
dir=$B/ct_layers
mkdir -p "$dir"
fail=0

# 1. alone
for pair in kvps_core.h:CORE kvps_codec.h:CODEC kvps_launch.h:LAUNCH kvps.h:PS kvps_ring.h:RING kvps_fuse.h:FUSE kvps_abi.h:ABI; do
    h=${pair%%:*}
    sw=KVPS_${pair##*:}_IMPLEMENTATION
    for def in KVPS_IMPLEMENTATION "$sw"; do
        printf '#define %s\n#include "%s"\nint kvps_ct_alone(void);\nint kvps_ct_alone(void) { return 0; }\n' "$def" "$h" > "$dir/alone.c"
        $CC -std=c99 -Wall -Wextra -pedantic -Werror -I. $ZCF -c "$dir/alone.c" -o "$dir/alone.o" ||
            { echo "compile-test: FAIL $h alone with $def (C99)"; fail=1; }
        if command -v "$CXX" >/dev/null; then
            $CXX -x c++ -std=c++11 -Wall -Wextra -Werror -I. $ZCF -c "$dir/alone.c" -o "$dir/alone_cxx.o" ||
                { echo "compile-test: FAIL $h alone with $def (C++)"; fail=1; }
        fi
    done
done
[ $fail = 0 ] && echo "compile-test: every header alone, each switch, C99 -pedantic and C++: ok"

# 2. codec without ZeroMQ: no pkg-config flags, a zmq.h that errors, no -lzmq
$CC -std=c99 -Wall -Wextra -pedantic -Werror -Itests/compile/nozmq -I. tests/compile/codec_only.c \
    -o "$dir/codec_only" -lm -pthread || { echo "compile-test: FAIL kvps_codec.h alone needs ZeroMQ"; fail=1; }
if [ -x "$dir/codec_only" ]; then
    if nm "$dir/codec_only" | grep -q ' U zmq_'; then echo "compile-test: FAIL codec_only references zmq_*"; fail=1; fi
    "$dir/codec_only" || { echo "compile-test: FAIL codec_only ran wrong"; fail=1; }
fi

# 3. ring without the parameter server
$CC -std=c99 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -pedantic -Werror -I. $ZCF tests/compile/ring_only.c \
    -o "$dir/ring_only" $LIBS || { echo "compile-test: FAIL ring_only does not build"; fail=1; }
if [ -x "$dir/ring_only" ]; then
    "$dir/ring_only" || { echo "compile-test: FAIL ring_only ran wrong"; fail=1; }
    ps=$(nm "$dir/ring_only" | grep -E ' [TtDdBb] (kvps_server_|kvps_worker_|kvps__handle|kvps__repl_|kvps__ckpt|kvps_ring_rendezvous)' || true)
    if [ -n "$ps" ]; then
        echo "compile-test: FAIL a kvps_ring.h-only program holds parameter-server code:"
        echo "$ps" | head -5
        fail=1
    else
        echo "compile-test: kvps_ring.h alone holds no parameter-server code ($(nm "$dir/ring_only" | grep -c ' [Tt] kvps') kvps functions, none of the server's or worker's)"
    fi
fi
exit $fail
