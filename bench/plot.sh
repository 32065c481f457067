#!/usr/bin/env bash
# bench/plot.sh - charts of bench/ethernet.sh's results, one PNG per claim, with gnuplot.
#
# usage: bench/plot.sh [DIR]        (DIR: where ethernet.sh wrote; default bench/results)
#
# Reads DIR/ethernet_<rate>_claimN.csv for every rate run so far and writes DIR/ethernet_claimN.png,
# each rate one line (or bar), times divided by that run's T = S / B_link (one model over one
# link) so runs at different rates share an axis, next to the ideal of the design notes.
set -u
cd "$(dirname "$0")/.." || exit 2
dir=${1:-bench/results}
command -v gnuplot >/dev/null || {
    echo "bench/plot.sh: gnuplot is missing: apt-get install -y gnuplot-nox" >&2
    exit 2
}
[ -d "$dir" ] || { echo "bench/plot.sh: no directory $dir (run bench/ethernet.sh first)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/kvps-plot.XXXXXX) || exit 2
trap 'rm -rf "$tmp"' EXIT

# files_for N: the claim-N CSVs, lowest rate first ("real-" host-file runs last)
files_for() {
    local f
    for f in "$dir"/ethernet_*_claim$1.csv; do
        [ -f "$f" ] || continue
        [ "$(wc -l <"$f")" -ge 2 ] || continue
        r=${f##*/ethernet_}; r=${r%_claim$1.csv}
        awk -v r="$r" -v f="$f" 'BEGIN { n = r + 0; u = tolower(r); sub(/^real-/, "", u); sub(/^[0-9.]+/, "", u)
            m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["bit"] = 1
            printf "%d %020.0f %s\n", (r ~ /^real-/), n * (u in m ? m[u] : 1), f }'
    done | sort | awk '{ print $3 }'
}
rate_of() { local r=${1##*/ethernet_}; echo "${r%_claim*.csv}"; }
# per_file PROGRAM FILES: awk -F, over FILES past their header lines, with nf = how many files and
# k = which one (1..nf) the line is from
per_file() { local prog=$1; shift; awk -F, -v nf=$# 'FNR == 1 { k++; next }'"$prog" "$@"; }
heads_of() { local f h=""; for f in "$@"; do h+="$(rate_of "$f") "; done; echo "$h"; } # FILES -> "rate rate "
t_of() { awk -F, -v c="$2" 'NR == 2 { print $c; exit }' "$1"; }

# gnuplot word lists: files and their key titles
lists() { # N T_COLUMN -> sets FILES TITLES
    FILES="" TITLES=""
    local f
    for f in $(files_for "$1"); do
        FILES+="$f "
        TITLES+="$(rate_of "$f")(T=$(t_of "$f" "$2")ms) "
    done
}

common='set terminal pngcairo size 900,560 font "DejaVu Sans,11"
set datafile separator ","
set grid lc rgb "#dddddd"
set key top left box opaque
set termoption noenhanced'
# clustered bars (claims 4 and 5)
bars='set style data histograms; set style histogram clustered gap 1; set style fill solid 0.8 border -1
set boxwidth 0.9'
made=()
# chart N [LINE...]: gnuplot on $common, the LINEs (a terminal of another size), claim N's
# output file and then its standard input (the chart); the PNG is counted as made
chart() {
    local png="$dir/ethernet_claim$1.png"
    shift
    { printf '%s\n' "$common" "$@"; printf 'set output "%s"\n' "$png"; cat; } | gnuplot
    made+=("$png")
}

# ---- claim 1 -----------------------------------------------------------------------------
lists 1 7
if [ -n "$FILES" ]; then
    chart 1 <<EOF
set title "Claim 1: one server, m workers - sync time grows linearly with m\n(BSP push+pull of S; T = S / link; bars: min..max over steps)"
set xlabel "workers m (server on a host of its own)"; set ylabel "sync time per step / T"
set xrange [0:9]; set yrange [0:*]; set xtics (1, 2, 4, 8)
files = "$FILES"; titles = "$TITLES"
plot 2*x title "ideal 2 m T (the server's link carries m S each way)" lw 2 dt 2 lc rgb "#888888", \
     for [i=1:words(files)] word(files, i) every ::1 using 1:(\$2/\$7):(\$3/\$7):(\$4/\$7) with yerrorlines lw 2 pt 7 title word(titles, i)
EOF
fi

# ---- claim 2 -----------------------------------------------------------------------------
lists 2 7
if [ -n "$FILES" ]; then
    chart 2 <<EOF
set title "Claim 2: n sharded servers, n workers (one of each per host) - sync time per step\n(T = S / link; bars: min..max over steps; dotted: the model as one tensor)"
set xlabel "hosts n"; set ylabel "sync time per step / T"
set xrange [1:9]; set yrange [0:*]; set xtics (2, 4, 8)
files = "$FILES"; titles = "$TITLES"
plot 2*(x-1)/x title "ideal 2 (n-1)/n T" lw 2 dt 2 lc rgb "#888888", \
     2*x title "one server instead: 2 n T" lw 1 dt 3 lc rgb "#bbbbbb", \
     for [i=1:words(files)] word(files, i) every ::1 using 1:(\$2/\$7):(\$3/\$7):(\$4/\$7) with yerrorlines lw 2 pt 7 lc i title word(titles, i), \
     for [i=1:words(files)] word(files, i) every ::1 using 1:(\$9/\$7) with linespoints lw 1 dt 3 pt 6 lc i title word(titles, i)." one tensor"
EOF
fi

# ---- claim 3 -----------------------------------------------------------------------------
lists 3 8
if [ -n "$FILES" ]; then
    chart 3 'set terminal pngcairo size 1200,520 font "DejaVu Sans,11"' <<EOF
files = "$FILES"; titles = "$TITLES"
set multiplot layout 1,2 title "Claim 3: ring all-reduce of S over n hosts"
set title "time / T (T = S / link)"
set xlabel "ranks n"; set ylabel "all-reduce time / T"
set xrange [1:9]; set yrange [0:2.5]; set xtics (2, 4, 8)
plot 2*(x-1)/x title "ideal 2 (n-1)/n T" lw 2 dt 2 lc rgb "#888888", \
     for [i=1:words(files)] word(files, i) every ::1 using 1:(\$2/\$8):(\$3/\$8):(\$4/\$8) with yerrorlines lw 2 pt 7 title word(titles, i)
set title "bus bandwidth / nominal link rate"
set ylabel "busbw / link"; set yrange [0:1.1]; set key bottom left
plot 0.9 title "criterion 0.90" lw 2 dt 2 lc rgb "#cc4444", \
     for [i=1:words(files)] word(files, i) every ::1 using 1:6 with linespoints lw 2 pt 7 title word(titles, i)
unset multiplot
EOF
fi

# ---- claim 4: predictions and each rate's measurement, in units of T ------------------------
set -- $(files_for 4)
if [ $# -gt 0 ]; then
    # columns: label, notes' prediction (one tensor), measured one tensor per rate, prediction with
    # tensors in flight, measured with tensors in flight per rate
    # shellcheck disable=SC2016 # an awk program: its $ are awk's
    per_file '
        { m = $2 == 1 ? 1 : 2; key[$1] = 1; pred[$1, m] = $5; v[$1, m, k] = $7 / $11; if (m == 2) kt = $2 }
        END { for (s = 1; s <= 3; s++) { name = s == 1 ? "gpu" : s == 2 ? "cpu" : "split"
                  label = s == 1 ? "one GPU" : s == 2 ? "CPU" : "split"
                  if (!(name in key)) continue
                  printf "\"%s\"", label
                  for (m = 1; m <= 2; m++) {
                      printf ",%s", ((name, m) in pred) ? pred[name, m] : "NaN"
                      for (i = 1; i <= nf; i++) printf ",%s", ((name, m, i) in v) ? v[name, m, i] : "NaN" }
                  printf "\n" }
              print kt > "/dev/stderr" }' "$@" >"$tmp/c4.csv" 2>"$tmp/c4.k"
    heads=$(heads_of "$@")
    kt=$(cat "$tmp/c4.k")
    chart 4 'set terminal pngcairo size 900,640 font "DejaVu Sans,11"' <<EOF
set title "Claim 4: the notes' aggregation thought experiment, hosts for GPUs\n(notes: 60 / 80 / 15 ms at T = 10 ms; here T = S / measured link)"
set ylabel "sync time / T"; set yrange [0:10.5]
$bars; set key below maxrows 3 width -2
heads = "$heads"; nf = words(heads)
plot "$tmp/c4.csv" using 2:xtic(1) title "notes: all pushes then all pulls (6T / 8T / 1.5T)" lc rgb "#777777", \
     for [i=1:nf] "" using (column(2+i)) title "measured, one tensor, ".word(heads, i) lc i, \
     "" using (column(3+nf)) title "tensors in flight (3T / 4T / 1.5T)" lc rgb "#cccccc", \
     for [i=1:nf] "" using (column(3+nf+i)) title "measured, $kt tensors, ".word(heads, i) fs pattern 4 lc i
EOF
fi

# ---- claim 5: bytes ratio and time ratio per codec ----------------------------------------
set -- $(files_for 5)
if [ $# -gt 0 ]; then
    # shellcheck disable=SC2016 # an awk program: its $ are awk's
    per_file '
        { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1; bytes[$1] = $4 } t[$1, k] = $8 }
        END { for (j = 1; j <= n; j++) { c = order[j]; printf "%s,%s", c, bytes[c]
                  for (i = 1; i <= nf; i++) printf ",%s", ((c, i) in t) ? t[c, i] : "NaN"; printf "\n" } }' "$@" >"$tmp/c5.csv"
    heads=$(heads_of "$@")
    chart 5 <<EOF
set title "Claim 5: compression cuts sync time in proportion to bytes\n(1 server, 4 workers; ratios to uncompressed float32)"
set ylabel "ratio to uncompressed"; set yrange [0:1.15]
$bars; set key top right
heads = "$heads"
plot "$tmp/c5.csv" using 2:xtic(1) title "bytes on the wire" lc rgb "#999999", \
     for [i=1:words(heads)] "" using (column(2+i)) title "sync time, ".word(heads, i)
EOF
fi

[ ${#made[@]} -gt 0 ] || { echo "bench/plot.sh: no ethernet_*_claimN.csv in $dir (run bench/ethernet.sh first)" >&2; exit 1; }
printf "%s\n" "${made[@]}"
