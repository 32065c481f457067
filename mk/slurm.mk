# make slurm-check: hello_ps, hello_ring, ring_allreduce and fmnist under a real srun (rank from
# SLURM_PROCID; the starting points' jobs must end by themselves: tests/clean_finish.sh), on a
# one-node Slurm cluster started for the run from a temporary directory (root; installs
# slurmctld, slurmd, slurm-client and munge when missing). Exit 77: skipped.
.PHONY: slurm-check
slurm-check: $(B)/ring_allreduce $(B)/fmnist $(B)/hello_ps $(B)/hello_ring
	@tests/slurm_check.sh $(B) || [ $$? -eq 77 ]
