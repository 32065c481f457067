# Which algorithm, at what scale (issue 19): the alpha-beta-gamma cost model of the all-reduce
# algorithms and the parameter server (bench/costmodel.h, bench/costmodel.c), its measurements
# (bench/costmodel.sh: loopback and, as root, the emulated 1 Gbit/s link; about 5 minutes), the
# tables and charts. `make cost-model` measures and fits afresh; `make cost-model-tables` only
# re-fits and re-prints from the CSVs already in $(CM_DIR); `make cost-model-check` compares the
# model's copy of AUTO with kvps_ring.h's own choice (also in tests/test_costmodel.c).
.PHONY: cost-model cost-model-tables cost-model-check
CM_DIR ?= bench/results/costmodel
$(B)/costmodel $(B)/test_costmodel: bench/costmodel.h
cost-model: $(B)/costmodel $(B)/bench_ring $(B)/ring_peer $(B)/ps_peer
	bench/costmodel.sh --out $(CM_DIR)
	$(MAKE) --no-print-directory cost-model-tables
cost-model-tables: $(B)/costmodel
	$(B)/costmodel --fit $(CM_DIR)
	$(B)/costmodel --tables $(CM_DIR) >$(CM_DIR)/tables.txt && cat $(CM_DIR)/tables.txt
	@# sensitivity: alpha 5 and 50 us; a faster inside of a host (10 GB/s, 5 us); a CPU bound of 2 CPUs a rank
	$(B)/costmodel --tables $(CM_DIR) --alpha-us 5 >$(CM_DIR)/tables_alpha5.txt
	$(B)/costmodel --tables $(CM_DIR) --alpha-us 50 >$(CM_DIR)/tables_alpha50.txt
	$(B)/costmodel --tables $(CM_DIR) --intra-gbs 10 --intra-us 5 >$(CM_DIR)/tables_intra10.txt
	$(B)/costmodel --tables $(CM_DIR) --cpus 2 >$(CM_DIR)/tables_cpus2.txt
	@grep -H "AUTO differs" $(CM_DIR)/tables*.txt
	bench/costmodel_plot.sh $(CM_DIR)
cost-model-check: $(B)/costmodel
	$(B)/costmodel --check-kvps
