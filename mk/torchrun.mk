# make torchrun-check: hello_ring (4 ranks) and hello_ps (2 servers, 3 workers) launched by
# PyTorch's torchrun with no kvps variable but KVPS_NUM_SERVERS (kvps_launch.h's rendezvous at
# MASTER_ADDR / MASTER_PORT); installs python3-torch when root. Exit 77: skipped.
.PHONY: torchrun-check
torchrun-check: $(B)/hello_ps $(B)/hello_ring
	@tests/torchrun_check.sh $(B) || [ $$? -eq 77 ]
