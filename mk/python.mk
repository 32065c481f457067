# make python-check: the torch layer (python/kvps/torch) against PyTorch: tests/python/test_torch_*.py
# (tests/python_check.sh). Optional, like slurm-check: installs python3-torch when root, else
# prints the apt-get line and skips (exit 77).
.PHONY: python-check
python-check: $(B)/libkvps.so
	@tests/python_check.sh $(B) || [ $$? -eq 77 ]
