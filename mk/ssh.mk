# make ssh-check: kvps-run --host-file and bench/ethernet.sh --host-file over real ssh, with an
# OpenSSH server in each of five network namespaces. Needs root (installs openssh-server when
# missing); elsewhere, where it cannot be installed, or where namespaces cannot be made, it says
# "skipped" and succeeds.
.PHONY: ssh-check
ssh-check: all $(B)/ps_peer $(B)/ring_peer
	@if [ "$$(id -u)" != 0 ]; then echo "skipped: ssh-check needs root"; \
	elif ! scripts/deps.sh ssh; then echo "skipped: ssh-check: openssh-server is not installed"; \
	else tests/ssh_check.sh || [ $$? -eq 77 ]; fi
