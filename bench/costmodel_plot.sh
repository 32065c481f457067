#!/usr/bin/env bash
# bench/costmodel_plot.sh - charts of build/costmodel --tables' data files, with gnuplot.
# usage: bench/costmodel_plot.sh [DIR]   (DIR: bench/results/costmodel)
# Writes bench/results/costmodel_auto.png (AUTO's predicted time / the model's best, per ranks and
# size, 10 and 100 Gbit/s, one rank a host and 8 a host) and bench/results/costmodel_validation.png
# (predicted against measured time, loopback and the emulated 1 Gbit/s link).
set -u
cd "$(dirname "$0")/.." || exit 2
dir=${1:-bench/results/costmodel}
command -v gnuplot >/dev/null || { echo "costmodel_plot.sh: gnuplot is missing: apt-get install -y gnuplot-nox" >&2; exit 2; }
for f in auto_10g.dat auto_100g.dat auto_10g_q8.dat auto_100g_q8.dat validation.dat; do
    [ -f "$dir/$f" ] || { echo "costmodel_plot.sh: no $dir/$f (build/costmodel --tables $dir)" >&2; exit 2; }
done
gnuplot <<GP || exit 1
set terminal pngcairo size 1400,1000 font ",10"
set output "bench/results/costmodel_auto.png"
set multiplot layout 2,2 title "kvps AUTO vs the cost model's best all-reduce: predicted time(AUTO) / time(best)\n(cell text: AUTO > best where they differ; alpha 20 us, gamma, kappa, mu measured here)"
set xtics ("4K" 0, "16K" 1, "64K" 2, "256K" 3, "1M" 4, "4M" 5, "16M" 6, "64M" 7, "256M" 8, "1G" 9)
set ytics ("16" 0, "32" 1, "48" 2, "64" 3, "128" 4, "192" 5, "256" 6, "512" 7, "768" 8, "1024" 9)
set xlabel "bytes per rank"; set ylabel "ranks"
set cbrange [1:3]; set palette defined (1 "#f7fbff", 1.25 "#fdd49e", 2 "#ef6548", 3 "#7f0000")
set cblabel "penalty"
names = "auto ring biring rd hier rhd"
lab(a, b, p) = (p > 1.0001 ? sprintf("%s>%s\n%.2f", word(names, int(a) + 1), word(names, int(b) + 1), p) : word(names, int(a) + 1))
do for [f in "auto_10g auto_100g auto_10g_q8 auto_100g_q8"] {
    set title (f eq "auto_10g" ? "10 Gbit/s, one rank a host" : f eq "auto_100g" ? "100 Gbit/s, one rank a host" : \
               f eq "auto_10g_q8" ? "10 Gbit/s, 8 ranks a host (groups)" : "100 Gbit/s, 8 ranks a host (groups)")
    plot "$dir/".f.".dat" using 2:1:5 with image notitle, \
         "" using 2:1:(lab(\$6, \$7, \$5)) with labels font ",7" notitle
}
unset multiplot
set output "bench/results/costmodel_validation.png"
set terminal pngcairo size 1200,550 font ",10"
set multiplot layout 1,2 title "cost model: predicted (link model and CPU bound, the larger) vs measured all-reduce / PS time"
set logscale xy; set xlabel "measured (s)"; set ylabel "predicted (s)"; set key left top
set xrange [2e-5:5]; set yrange [2e-5:5]; unset xtics; unset ytics; set xtics; set ytics; set format xy "%.0e"
do for [net in "lo eth"] {
    set title (net eq "lo" ? "loopback (2 vCPUs; 4 and 8 ranks oversubscribed)" : "emulated 1 Gbit/s (namespaces, tbf)")
    plot for [a in "ring biring rd rhd hier ps1 ps16"] "$dir/validation.dat" using (strcol(1) eq net && strcol(2) eq a ? \$5 : 1/0):7 \
         pointsize 1.2 title a, x title "y = x" lc rgb "black", 2*x dt 2 lc rgb "gray" title "2x", 0.5*x dt 2 lc rgb "gray" title "0.5x"
}
unset multiplot
GP
echo "bench/results/costmodel_auto.png bench/results/costmodel_validation.png"
