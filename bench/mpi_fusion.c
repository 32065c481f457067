/* mpi_fusion - the OpenMPI peer of bench_fusion: ResNet-50's 161 parameter tensors all-reduced
   (float32 sums) one by one with MPI_Allreduce, and as one concatenated buffer, timed as
   bench_fusion times kvps.

   usage: mpirun -np N [mpirun options] mpi_fusion [--iters I]
   Prints, from rank 0, "mpi,one_by_one,SECONDS" and "mpi,concatenated,SECONDS": seconds per
   step (all 161 tensors), the slowest rank's, after a warm-up step whose result is checked
   (every element must be N). bench_fusion runs it itself over TCP on loopback (pml ob1, btl
   tcp,self), as bench_ring runs mpi_allreduce. Build: mpicc -O2 bench/mpi_fusion.c -o
   build/mpi_fusion (make does it where mpicc is). */
#include <mpi.h>
#include "resnet50.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size, iters = 5;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[++i]);
    if (iters < 1) iters = 1;
    size_t cnt[RESNET50_TENSORS], total = 0;
    resnet50_sizes(cnt);
    float *buf[RESNET50_TENSORS];
    for (int t = 0; t < RESNET50_TENSORS; t++) {
        buf[t] = (float *)malloc(cnt[t] * sizeof(float));
        for (size_t i = 0; i < cnt[t]; i++) buf[t][i] = 1.0f;
        total += cnt[t];
    }
    float *cat = (float *)malloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) cat[i] = 1.0f;
    int bad = 0;
    /* warm-up, checked */
    for (int t = 0; t < RESNET50_TENSORS; t++) MPI_Allreduce(MPI_IN_PLACE, buf[t], (int)cnt[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, cat, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int t = 0; t < RESNET50_TENSORS; t++) bad |= buf[t][0] != (float)size || buf[t][cnt[t] - 1] != (float)size;
    bad |= cat[0] != (float)size || cat[total - 1] != (float)size;
    double sec[2];
    for (int m = 0; m < 2; m++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) {
            if (m == 0)
                for (int t = 0; t < RESNET50_TENSORS; t++)
                    MPI_Allreduce(MPI_IN_PLACE, buf[t], (int)cnt[t], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            else
                MPI_Allreduce(MPI_IN_PLACE, cat, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double mine = (MPI_Wtime() - t0) / iters;
        MPI_Reduce(&mine, &sec[m], 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    }
    int anybad = 0;
    MPI_Reduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi,one_by_one,%.6f,%s\n", sec[0], anybad ? "BAD" : "ok");
        printf("mpi,concatenated,%.6f,%s\n", sec[1], anybad ? "BAD" : "ok");
    }
    for (int t = 0; t < RESNET50_TENSORS; t++) free(buf[t]);
    free(cat);
    MPI_Finalize();
    return 0;
}
