#!/usr/bin/env python3
# timeline_check.py - test_timeline's checks of timeline files, with Python's strict json module
# (a file that is not whole JSON fails). Prints "check: ok" or one "check: FAIL ..." line per
# failed check, exit 0 / 1.
#
#   timeline_check.py ps DIR SPEC.json     a parameter-server job: SPEC names its workers,
#                                          servers, steps, tensors (slice keys and their servers)
#                                          and raw keys; every worker's requests and every
#                                          server's rounds are checked against it
#   timeline_check.py ring DIR SPEC.json   a ring job: SPEC lists each collective with its
#                                          algorithm and phases, per rank
#   timeline_check.py merged FILE N        a merged file: N processes, each its own pid
#   timeline_check.py events FILE SPEC.json  one file: SPEC {"count": {NAME: N}, "names": [...]}
import glob
import json
import os
import sys
import time

fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
    return cond


def load(path):
    with open(path, encoding="utf-8") as f:  # strict: invalid UTF-8 or JSON fails
        return json.load(f)


def load_dir(d, n_expected):
    """process name -> events, for every kvps-*.json in d (each must be whole JSON)."""
    files = sorted(glob.glob(os.path.join(d, "kvps-*.json")))
    check(len(files) == n_expected, f"{len(files)} timeline files in {d}, expected {n_expected}: {files}")
    out = {}
    for f in files:
        try:
            data = load(f)
        except ValueError as e:
            check(False, f"{f}: not JSON: {e}")
            continue
        check(data.get("otherData", {}).get("kvps") == "timeline", f"{f}: no closing otherData (not closed?)")
        ev = data["traceEvents"]
        names = [e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"]
        if check(len(names) == 1, f"{f}: {len(names)} process_name events"):
            out[names[0]] = ev
        nesting(os.path.basename(f), ev)
        now = time.time() * 1e6
        for e in ev:
            if e.get("ph") == "X":
                check(e["dur"] >= 0, f"{f}: negative duration: {e}")
                check(abs(e["ts"] - now) < 3600e6, f"{f}: ts {e['ts']} is not wall-clock microseconds")
    return out


def nesting(name, ev, tol=1.0):
    """On each (pid, tid), two complete events are disjoint or one holds the other (what viewers
    need); tol: microseconds of rounding (ts of ~1.8e15 us keep a quarter of a microsecond)."""
    by = {}
    for e in ev:
        if e.get("ph") == "X":
            by.setdefault((e["pid"], e["tid"]), []).append(e)
    for (pid, tid), es in by.items():
        es.sort(key=lambda e: (e["ts"], -e["dur"]))
        ends = []
        for e in es:
            while ends and ends[-1] <= e["ts"] + tol:
                ends.pop()
            end = e["ts"] + e["dur"]
            if ends and end > ends[-1] + tol:
                check(False, f"{name}: tid {tid}: '{e['name']}' [{e['ts']}, {end}] overlaps an event it is not inside")
                break
            ends.append(end)


def xs(ev, **kw):
    return [e for e in ev if e.get("ph") == "X" and all(e.get("args", {}).get(k) == v if k != "cat" else e.get("cat") == v
                                                        for k, v in kw.items())]


def check_ps(d, spec):
    W, S, steps = spec["workers"], spec["servers"], spec["steps"]
    procs = load_dir(d, W + S)
    for r in range(W):
        ev = procs.get(f"worker {r}")
        if not check(ev is not None, f"no file of worker {r}"):
            continue
        for t in spec["tensors"]:
            want_srv = sorted(set(t["servers"]))
            pp = xs(ev, cat="worker", op="pushpull", tensor=t["name"])
            check(len(pp) == steps, f"worker {r}: {len(pp)} pushpulls of tensor {t['name']!r}, expected {steps}")
            for e in pp:
                a = e["args"]
                check(e["name"] == "pushpull " + t["name"], f"worker {r}: event name {e['name']!r}")
                check(a["bytes"] == 4 * t["len"], f"worker {r}: pushpull {t['name']!r}: bytes {a['bytes']}, expected {4 * t['len']}")
                check(a["servers"] == want_srv, f"worker {r}: pushpull {t['name']!r}: servers {a['servers']}, expected {want_srv}")
                check(a["slices"] == len(t["keys"]), f"worker {r}: slices {a['slices']}")
                check(a["result"] == "ok", f"worker {r}: result {a['result']}")
            ini = xs(ev, cat="worker", op="init", tensor=t["name"])
            check(len(ini) == (1 if r == 0 else 0), f"worker {r}: {len(ini)} inits of {t['name']!r}")
            for e in ini:
                check(e["args"]["bytes"] == 4 * t["len"] and e["args"]["servers"] == want_srv, f"worker {r}: init {e['args']}")
        bar = xs(ev, cat="worker", op="barrier")
        check(len(bar) == spec["barriers"], f"worker {r}: {len(bar)} barriers, expected {spec['barriers']}")
        check(all(e["args"]["servers"] == [0] and e["args"]["result"] == "ok" for e in bar), f"worker {r}: barrier args")
        raw_srv = sorted({k["server"] for k in spec["raw_keys"]})
        for op in ("push", "pull"):
            rk = xs(ev, cat="worker", op=op)
            rk = [e for e in rk if "keys" in e["args"]]
            if check(len(rk) == 1, f"worker {r}: {len(rk)} raw-key {op}es, expected 1"):
                a = rk[0]["args"]
                check(a["keys"] == len(spec["raw_keys"]) and a["servers"] == raw_srv and
                      a["bytes"] == 4 * spec["raw_len"] * len(spec["raw_keys"]) and rk[0]["name"] == op + " keys",
                      f"worker {r}: raw {op}: {rk[0]['name']!r} {a}, expected keys {len(spec['raw_keys'])} servers {raw_srv}")
    for s in range(S):
        ev = procs.get(f"server {s}")
        if not check(ev is not None, f"no file of server {s}"):
            continue
        rounds = [e for e in xs(ev, cat="server") if "round" in e["args"]]
        want = {}
        for t in spec["tensors"]:
            for i, (k, srv) in enumerate(zip(t["keys"], t["servers"])):
                if srv == s:
                    want[k] = (list(range(1, steps + 1)), i)  # rounds count from 1 (kvps.h, CONSISTENCY)
        for k in spec["raw_keys"]:
            if k["server"] == s:
                want[k["key"]] = ([1], None)
        got = {}
        for e in rounds:
            got.setdefault(e["args"]["key"], []).append(e)
        check(sorted(got) == sorted(want), f"server {s}: rounds of keys {sorted(got)}, expected {sorted(want)}")
        for k, (rs, sl) in want.items():
            es = got.get(k, [])
            check(sorted(e["args"]["round"] for e in es) == rs, f"server {s}: key {k}: rounds {[e['args']['round'] for e in es]}, expected {rs}")
            for e in es:
                a = e["args"]
                check(a["contributions"] == W, f"server {s}: key {k} round {a['round']}: {a['contributions']} contributions")
                check(0 <= a["straggler_wait_us"] <= e["dur"] + 1 and a["apply_us"] >= 0,
                      f"server {s}: key {k}: straggler_wait_us {a['straggler_wait_us']} outside [0, dur {e['dur']}]")
                if sl is not None:
                    # named by the tensor when the server knows its name (NAME), else by the slice
                    want_name = f"round {a['tensor']}[{sl}]" if "tensor" in a else f"round slice {sl}"
                    check(a.get("slice") == sl and e["name"] == want_name, f"server {s}: key {k}: {e['name']!r} {a}")


def check_ring(d, spec):
    R = spec["ranks"]
    procs = load_dir(d, R)
    for r in range(R):
        ev = procs.get(f"ring rank {r}")
        if not check(ev is not None, f"no file of ring rank {r}"):
            continue
        colls = sorted(xs(ev, cat="ring"), key=lambda e: e["args"]["seq"])
        check(len(colls) == len(spec["colls"]), f"rank {r}: {len(colls)} collectives, expected {len(spec['colls'])}")
        phases = xs(ev, cat="ring-phase")
        for c, want in zip(colls, spec["colls"]):
            a = c["args"]
            what = f"rank {r}: collective {a['seq']} ({want['coll']})"
            check(c["name"] == want["coll"] and a["coll"] == want["coll"], f"{what}: is {c['name']!r}")
            check(a["algorithm"] == want["algorithm"], f"{what}: algorithm {a['algorithm']!r}, expected {want['algorithm']!r}")
            check(a["result"] == "ok", f"{what}: result {a['result']}")
            if want["coll"] != "barrier":
                check(a["count"] == want["count"] and a["bytes"] == 4 * want["count"] and a["dtype"] == "float32",
                      f"{what}: count {a.get('count')} bytes {a.get('bytes')} dtype {a.get('dtype')}")
            check(("queued_us" in a) == want.get("posted", False), f"{what}: queued_us {'missing' if want.get('posted') else 'present'}")
            ph = want["phases"][r] if isinstance(want["phases"], list) else want["phases"]
            mine = [p for p in phases if p["args"]["seq"] == a["seq"]]
            names = sorted(p["name"] for p in mine)
            check(names == sorted(ph), f"{what}: phases {names}, expected {sorted(ph)}")
            for p in mine:
                check(p["tid"] == c["tid"], f"{what}: phase {p['name']!r} not on its collective's lane")
                check(p["ts"] >= c["ts"] - 1 and p["ts"] + p["dur"] <= c["ts"] + c["dur"] + 1,
                      f"{what}: phase {p['name']!r} outside its collective")
                if p["name"] in ph:
                    check(p["args"]["depth"] == ph[p["name"]], f"{what}: phase {p['name']!r} at depth {p['args']['depth']}")


def check_merged(path, n):
    data = load(path)
    ev = data["traceEvents"]
    names = {}
    for e in ev:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            check(e["pid"] not in names, f"merged: pid {e['pid']} named twice")
            names[e["pid"]] = e["args"]["name"]
    check(len(names) == n, f"merged: {len(names)} processes, expected {n}: {names}")
    check(len(set(names.values())) == len(names), f"merged: process names repeat: {names}")
    check(all(e.get("pid") in names for e in ev), "merged: an event's pid has no process")
    nesting("merged", ev)
    print("processes:", ", ".join(names[p] for p in sorted(names)))
    rounds = [e for e in ev if e.get("cat") == "server" and "round" in e.get("args", {})]
    named = [e for e in rounds if "tensor" in e["args"]]
    print(f"rounds: {len(rounds)}, named after their tensor: {len(named)}")
    for e in named:
        check(e["name"] == f"round {e['args']['tensor']}[{e['args']['slice']}]", f"merged: round named {e['name']!r}")


def check_events(path, spec):
    data = load(path)
    ev = data["traceEvents"]
    nesting(os.path.basename(path), ev)
    for name, n in spec.get("count", {}).items():
        got = sum(1 for e in ev if e.get("ph") in ("X", "i") and e["name"] == name)
        check(got == n, f"{path}: {got} events named {name!r}, expected {n}")
    for name in spec.get("names", []):
        check(any(e["name"] == name or e.get("args", {}).get("name") == name for e in ev), f"{path}: nothing named {name!r}")
    for key, total in spec.get("sum", {}).items():  # "NAME.ARG": the sum of ARG over events NAME
        name, arg = key.rsplit(".", 1)
        got = sum(e["args"].get(arg, 0) for e in ev if e["name"] == name)
        check(got == total, f"{path}: sum of {arg} over {name!r} is {got}, expected {total}")
    for key, lim in spec.get("max_dur", {}).items():
        worst = max([e["dur"] for e in ev if e["name"] == key] or [0])
        check(worst <= lim, f"{path}: an event {key!r} lasts {worst} us, more than {lim}")
    for key, n in spec.get("min_count", {}).items():
        got = sum(1 for e in ev if e["name"] == key)
        check(got >= n, f"{path}: {got} events {key!r}, expected at least {n}")


def main():
    mode = sys.argv[1]
    try:
        if mode == "ps":
            check_ps(sys.argv[2], load(sys.argv[3]))
        elif mode == "ring":
            check_ring(sys.argv[2], load(sys.argv[3]))
        elif mode == "merged":
            check_merged(sys.argv[2], int(sys.argv[3]))
        elif mode == "events":
            check_events(sys.argv[2], load(sys.argv[3]))
        else:
            check(False, f"unknown mode {mode}")
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        check(False, f"{type(e).__name__}: {e}")
    for f in fails[:40]:
        print("check: FAIL", f)
    if len(fails) > 40:
        print(f"check: FAIL ... and {len(fails) - 40} more")
    if not fails:
        print("check: ok")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
