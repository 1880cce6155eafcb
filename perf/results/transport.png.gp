if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 1100,700 noenhanced } else { set terminal png size 1100,700 noenhanced }
set output "perf/results/transport.png"
set title "sluice-perf transport: 2 cpus, AMD EPYC"
set logscale x 2
set logscale y 10
set xlabel 'element size (bytes)'
set ylabel 'GB/s (1e9 bytes/s) into client buffers'
set key right bottom
set grid
set xtics ("64 B" 64, "4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "4 MiB" 4194304, "16 MiB" 16777216, "64 MiB" 67108864)
set xrange [42.6667:1.00663e+08]
$d0 << EOD
64 0.0341884
4096 0.694603
65536 0.514827
1048576 2.23283
4194304 2.55083
16777216 2.29223
67108864 2.74233
EOD
$d1 << EOD
64 0.00789578
4096 0.411881
65536 1.12226
1048576 2.66106
4194304 2.41284
16777216 2.63778
67108864 2.87932
EOD
$d2 << EOD
64 0.036634
4096 0.68626
65536 0.485953
1048576 2.65005
4194304 2.76353
16777216 2.69979
67108864 2.66626
EOD
$d3 << EOD
64 0.00729809
4096 0.391045
65536 1.17087
1048576 3.11329
4194304 2.47275
16777216 1.62166
67108864 1.81413
EOD
$d4 << EOD
64 0.00037049
4096 0.0244649
65536 0.267855
1048576 0.693541
4194304 0.696194
16777216 0.728391
67108864 0.485001
EOD
$d5 << EOD
64 4.10275
4096 5.06023
65536 5.23506
1048576 4.53605
4194304 4.86676
16777216 3.89389
67108864 3.38907
EOD
plot $d0 using 1:2 with linespoints lw 2 pt 7 lc 1 title "sluice ucx-tcp", \
     $d1 using 1:2 with linespoints dt 2 pt 6 lc 1 title "ucx_perftest, ucx-tcp's UCX_TLS", \
     $d2 using 1:2 with linespoints lw 2 pt 7 lc 2 title "sluice ucx-shm", \
     $d3 using 1:2 with linespoints dt 2 pt 6 lc 2 title "ucx_perftest, ucx-shm's UCX_TLS", \
     $d4 using 1:2 with linespoints lw 2 pt 7 lc 3 title "sluice grpc", \
     $d5 using 1:2 with linespoints dt 3 pt 4 lc 0 title "memcpy, 1 thread"
