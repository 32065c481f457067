/* mpi_allgatherv - the OpenMPI peer of bench_groups: MPI_Allgatherv of float32 on 4 ranks with
   blocks of 10/20/30/40% of the total, timed as bench_groups times kvps_ring_allgatherv (a
   checked warm-up, a barrier, ITERS calls; the per-call time averaged over ranks).

   usage: mpirun -np 4 mpi_allgatherv BYTES:ITERS[,BYTES:ITERS...]   (prints "bytes seconds" lines)
   Build: mpicc -O2 bench/mpi_allgatherv.c -o build/mpi_allgatherv (make bench-groups does). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 2 || n != 4) { if (!rank) fprintf(stderr, "usage: mpirun -np 4 mpi_allgatherv BYTES:ITERS,...\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
    char *list = strdup(argv[1]);
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
        size_t bytes = strtoull(t, NULL, 10), total = bytes / 4, used = 0;
        char *colon = strchr(t, ':');
        int iters = colon ? atoi(colon + 1) : 10, counts[4], displs[4];
        for (int i = 0; i < 4; i++) {
            counts[i] = (int)(i == 3 ? total - used : total * (size_t)(i + 1) / 10);
            displs[i] = (int)used;
            used += (size_t)counts[i];
        }
        float *a = (float *)malloc((size_t)counts[rank] * 4 + 4), *b = (float *)malloc(total * 4 + 4);
        for (int i = 0; i < counts[rank]; i++) a[i] = (float)(displs[rank] + i);
        MPI_Allgatherv(a, counts[rank], MPI_FLOAT, b, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        for (size_t i = 0; i < total; i++)
            if (b[i] != (float)i) { fprintf(stderr, "mpi_allgatherv: wrong at %zu\n", i); MPI_Abort(MPI_COMM_WORLD, 1); }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allgatherv(a, counts[rank], MPI_FLOAT, b, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / iters, sum = 0;
        MPI_Reduce(&t, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (!rank) printf("%zu %.9f\n", bytes, sum / n);
        free(a);
        free(b);
    }
    free(list);
    MPI_Finalize();
    return 0;
}
