#!/usr/bin/env python3
# bench/ab_summary.py DIR - summarises bench/ab.sh's runs in DIR: bench_pushpull's kvps/zmq ratios
# (measured in each run against the raw ZeroMQ peer of that run) before and after, and
# bench_ring's time after / before for each pair of runs made next to each other.
import csv,glob,statistics as st,collections,sys
D=sys.argv[1] if len(sys.argv) > 1 else '.'
def load(f): return list(csv.DictReader(open(f)))
print("bench_pushpull: kvps / raw ZeroMQ in the same run (x), before and after (range over the runs)")
rows=collections.defaultdict(lambda: {'old':[], 'new':[]})
for v in ('old','new'):
    for f in sorted(glob.glob(f'{D}/pp_{v}_*.csv')):
        for r in load(f):
            if r['peer']!='kvps': continue
            k=(r['update'],int(r['servers']),int(r['bytes']))
            rows[k][v].append(r)
def rng(xs): return f"{min(xs):.2f}-{max(xs):.2f}"
print(f"{'update':6} {'srv':>3} {'bytes':>9} | {'push_x old':>10} {'new':>10} | {'pull_x old':>10} {'new':>10} | {'view_x old':>10} {'new':>10} | {'p50_x old':>10} {'new':>10}")
for k in sorted(rows):
    d=rows[k]
    if not d['old'] or not d['new']: continue
    out=[]
    for m in ('push_x','pull_x','pull0_x','p50_x'):
        out.append(rng([float(r[m]) for r in d['old']])); out.append(rng([float(r[m]) for r in d['new']]))
    print(f"{k[0]:6} {k[1]:>3} {k[2]:>9} | {out[0]:>10} {out[1]:>10} | {out[2]:>10} {out[3]:>10} | {out[4]:>10} {out[5]:>10} | {out[6]:>10} {out[7]:>10}")
print()
print("bench_ring: time after / before per size (each pair of runs made next to each other), median and range over the pairs")
R=collections.defaultdict(dict)
for v in ('old','new'):
    for f in sorted(glob.glob(f'{D}/ring_{v}_*.csv')):
        i=f.split('_')[-1].split('.')[0]
        for r in load(f):
            if r['peer']!='kvps': continue
            k=(r['coll'],r['algo'],int(r['ranks']),int(r['bytes']))
            R[k].setdefault(v,{})[i]=float(r['time_us'])
bycoll=collections.defaultdict(list)
for k,d in sorted(R.items()):
    if 'old' not in d or 'new' not in d: continue
    rs=[d['new'][i]/d['old'][i] for i in d['old'] if i in d['new']]
    bycoll[(k[0],k[2])].append(st.median(rs))
    print(f"{k[0]:15} {k[1]:7} {k[2]} ranks {k[3]:>9} B: old {st.median(d['old'].values()):9.1f} us new {st.median(d['new'].values()):9.1f} us  new/old {st.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})")
print()
for k,v in sorted(bycoll.items()):
    print(f"{k[0]:15} {k[1]} ranks: median new/old over sizes and algorithms {st.median(v):.2f} (per-size medians {min(v):.2f}-{max(v):.2f})")
allr=[x for v in bycoll.values() for x in v]
print(f"all: median {st.median(allr):.3f}, {sum(1 for x in allr if x>1.1)} of {len(allr)} size/algorithm medians more than 10% slower, {sum(1 for x in allr if x<0.9)} more than 10% faster")
