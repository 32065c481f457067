"""kt - what the Python test drivers share (tests/python/test_*.py import it from beside them):
the check lines and their tally, a free loopback port, and an environment without a launcher's
variables for a job's children."""
import os
import socket

results = {"pass": 0, "fail": 0, "skip": 0}


def say(ok, name, why=""):
    """A check's line; names hold no ": " (the driver splits a FAIL line there)."""
    print(("ok %s" % name) if ok else ("FAIL %s: %s" % (name, why)), flush=True)


def check(ok, name, why=""):
    results["pass" if ok else "fail"] += 1
    say(ok, name, why)


def skip(name, why):
    results["skip"] += 1
    print("skip %s: %s" % (name, why), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def clean_env():
    """This environment less any launcher's or kvps's variables (a job's children get their own)."""
    drop = ("KVPS_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_", "GROUP_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop) or k == "KVPS_LIB"}
