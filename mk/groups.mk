# make bench-groups: bench_groups (a sub-ring's all-reduce vs a ring made directly; allgatherv
# with uneven blocks) next to OpenMPI's MPI_Allgatherv (bench/mpi_allgatherv.c, built where
# mpicc is; bench_groups says so when it is not).
.PHONY: bench-groups
$(B)/mpi_allgatherv: bench/mpi_allgatherv.c | $(B) deps
	$(MPICC) -O2 -Wall -Wextra $< -o $@
bench-groups: $(B)/bench_groups $(if $(shell command -v $(MPICC) 2>/dev/null),$(B)/mpi_allgatherv)
	$(B)/bench_groups --repeat 5
