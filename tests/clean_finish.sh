# tests/clean_finish.sh - sourced by tests/mpi_check.sh and tests/slurm_check.sh (which define ok
# and bad): runs the starting points (examples/hello_ps.c, examples/hello_ring.c) under a real
# launcher and checks that the job ends by itself (issue 17, "clean finish").
#
#   timed LIMIT_S CMD...   runs CMD under `timeout LIMIT_S` (a hang check, nothing else: no other
#                          time is asserted), stdin from /dev/null, stdout and stderr together,
#                          stamping each line as it arrives. Sets rc (124: killed by the timeout),
#                          out (the lines), wall_s (start to exit) and tail_s (from the last
#                          result line, "hello_ps: worker ..." or "hello_ring: rank ...", to the
#                          exit; -1 when there is none).
#   check_finish NAME RESULTS SERVERS
#                          ok or bad: exit 0; RESULTS result lines, each ending in ": ok" (the
#                          known weights); SERVERS lines "hello_ps: server I: every worker
#                          finished" (kvps_server_run returned by itself: a server stopped by a
#                          signal never says it); no line with "lost" in any case (no process lost
#                          a peer on the way out). Prints the times either way.

timed() { # LIMIT_S CMD...
    local limit=$1 stamped t0 t_end
    shift
    t0=$EPOCHREALTIME
    stamped=$({ timeout "$limit" "$@" </dev/null 2>&1; echo "exit $?"; } |
        while IFS= read -r line || [ -n "$line" ]; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done)
    t_end=$(awk 'END { print $1 }' <<<"$stamped")
    rc=$(awk 'END { print $3 }' <<<"$stamped")
    out=$(sed '$d; s/^[^ ]* //' <<<"$stamped")
    wall_s=$(awk -v a="$t0" -v b="$t_end" 'BEGIN { printf "%.2f", b - a }')
    tail_s=$(awk -v b="$t_end" '/^[^ ]* (\[worker [0-9]+\] |\[default[0-9]+\]:)?hello_(ps: worker|ring: rank) / { t = $1 }
        END { if (t == "") print -1; else printf "%.2f", b - t }' <<<"$stamped")
}

check_finish() { # NAME RESULTS SERVERS
    local name=$1 want=$2 servers=$3 got fin why=""
    got=$(grep -cE 'hello_(ps: worker|ring: rank) [0-9]+ of [0-9]+: .*: ok$' <<<"$out")
    fin=$(grep -cE 'hello_ps: server [0-9]+: every worker finished$' <<<"$out")
    [ "$rc" = 0 ] || why="$why exit $rc$([ "$rc" = 124 ] && echo " (still running: killed, a hang)");"
    [ "$got" = "$want" ] || why="$why $got of $want result lines end in ': ok';"
    [ "$fin" = "$servers" ] || why="$why $fin of $servers servers returned by themselves;"
    grep -qi lost <<<"$out" && why="$why a process lost a peer: '$(grep -i -m 1 lost <<<"$out")';"
    local times="exit $rc after ${wall_s} s, ${tail_s} s after the last result line"
    if [ -z "$why" ]; then
        ok "$name: ended by itself ($times)"
    else
        bad "$name:$why ($times)"
        echo "$out" | tail -n 30 | sed 's/^/  /'
    fi
}
