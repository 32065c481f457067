# make bench-p2p: point-to-point latency and bandwidth between 2 processes on loopback, kvps next
# to raw ZeroMQ and OpenMPI's MPI_Send / MPI_Recv in the same run (bench/bench_p2p.c; the MPI
# side, bench/mpi_p2p.c, is built where mpicc is, else bench_p2p says it did not run).
# BENCH_P2P_ARGS: e.g. --repeat 5 --time 0.3, or --quick.
.PHONY: bench-p2p
BENCH_P2P_ARGS ?=
$(B)/mpi_p2p: bench/mpi_p2p.c bench/p2p_method.h bench/bench_cpu.h examples/clock.h | $(B) deps
	$(MPICC) -O2 -Wall -Wextra $< -o $@
bench-p2p: $(B)/bench_p2p $(if $(shell command -v $(MPICC) 2>/dev/null),$(B)/mpi_p2p)
	$(B)/bench_p2p $(BENCH_P2P_ARGS)
