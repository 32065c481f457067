# make mpi-check: hello_ps (2 servers, 3 workers) and hello_ring (3 ranks) under Open MPI's mpirun
# on loopback, checking that each job ends by itself (tests/mpi_check.sh; make test runs it from
# test_examples). Installs Open MPI when root and missing (scripts/deps.sh mpi), else prints the
# apt-get line; exit 77 from the script: skipped.
.PHONY: mpi-check
mpi-check: $(B)/hello_ps $(B)/hello_ring
	@tests/mpi_check.sh $(B) || [ $$? -eq 77 ]
