/* mpi_p2p - the OpenMPI peer of bench_p2p: MPI_Send / MPI_Recv (latency) and MPI_Isend /
   MPI_Irecv / MPI_Waitall (bandwidth) between 2 ranks, through the same loops as kvps and raw
   ZeroMQ (p2p_method.h). bench_p2p runs it:
       mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none --mca pml ob1 --mca btl tcp,self \
              --mca btl_tcp_if_include lo build/mpi_p2p [--time S] [--quick]
   Build: `make bench-p2p`, or mpicc -O2 bench/mpi_p2p.c -o build/mpi_p2p. */
#include <mpi.h>
#include "p2p_method.h" /* beside this file, so a bare mpicc line finds it */

typedef struct mp_ctx { MPI_Request q[P2P_MAXW + 1]; int nq; } mp_ctx;
static void mp_send(void *c, const void *b, size_t n, int peer) { (void)c; MPI_Send(b, (int)n, MPI_INT, peer, 1, MPI_COMM_WORLD); }
static void mp_recv(void *c, void *b, size_t n, int peer) { (void)c; MPI_Recv(b, (int)n, MPI_INT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
static void mp_isend(void *c, const void *b, size_t n, int peer) {
    mp_ctx *m = (mp_ctx *)c;
    MPI_Isend(b, (int)n, MPI_INT, peer, 2, MPI_COMM_WORLD, &m->q[m->nq++]);
}
static void mp_irecv(void *c, void *b, size_t n, int peer) {
    mp_ctx *m = (mp_ctx *)c;
    MPI_Irecv(b, (int)n, MPI_INT, peer, 2, MPI_COMM_WORLD, &m->q[m->nq++]);
}
static void mp_waitall(void *c) {
    mp_ctx *m = (mp_ctx *)c;
    MPI_Waitall(m->nq, m->q, MPI_STATUSES_IGNORE);
    m->nq = 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    p2p_cfg cfg;
    p2p_cfg_default(&cfg);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--time") == 0 && i + 1 < argc) cfg.time_s = atof(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0) p2p_cfg_quick(&cfg);
    }
    if (size != 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np 2 mpi_p2p [--time S] [--quick]\n");
        MPI_Finalize();
        return 2;
    }
    mp_ctx m = {{0}, 0};
    p2p_ops ops = {&m, mp_send, mp_recv, mp_isend, mp_irecv, mp_waitall};
    p2p_run(&ops, rank, &cfg, rank == 0 ? stdout : NULL);
    MPI_Finalize();
    return 0;
}
