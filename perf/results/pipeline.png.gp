if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 900,600 noenhanced } else { set terminal png size 900,600 noenhanced }
set output "perf/results/pipeline.png"
set title "sluice-perf pipeline: elements/s vs worker processes"
set xlabel 'worker processes'
set ylabel 'elements/s'
set key left top
set grid
set xtics 1
set yrange [0:*]
$d0 << EOD
1 941.515
2 1584.04
3 1628.92
4 1707.13
EOD
$d1 << EOD
1 893.542
2 1349.45
3 1466.78
4 1453.32
EOD
$d2 << EOD
1 927.939
2 1403.38
3 1451.72
4 1451.19
EOD
plot $d0 using 1:2 with linespoints lw 2 title "max_outstanding_requests=1", \
     $d1 using 1:2 with linespoints lw 2 title "max_outstanding_requests=4", \
     $d2 using 1:2 with linespoints lw 2 title "max_outstanding_requests=16", \
     1007.18*(x < 2 ? x : 2) with lines dt 2 title 'ideal: local rate x min(workers, 2 cpus)'
