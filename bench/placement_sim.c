/* placement_sim - issue 18 ("a server set that can grow and shrink"): where would the bytes of a
   realistic workload sit, and how many of them move when one server joins or leaves, under
   kvps's placement today and under placements that do not depend on n?

   C99, single-threaded. It includes kvps.h and runs kvps's own placement code where it can: the
   hashes (kvps__mix64, kvps__fnv1a) and RESHARD's planners ("kvps-vshard": kvps__vmap_plan;
   "kvps-vshard-counts": the rule kvps__vmap_change that planned RESHARD before). What lives in
   a worker (kvps__server_of, kvps_worker_tensor's slicing, kvps__vshard_of) is modelled here
   ("kvps-mod") and checked against a real worker by --check-kvps. (Issue 28: the planner was a
   line-for-line copy while kvps.h could not be included; it links libzmq now, as every kvps
   program does.)

     make placement-sim                           # builds, runs, writes bench/results/placement.csv
     build/placement_sim [--csv FILE] [--pieces P1,P2,...] [--sweep-n N] [--quick] [--check-kvps]
     make placement-check   # --check-kvps: kvps-mod's slices and servers == a kvps worker's;
                            # kvps-vshard's V, hv and shards' bytes == kvps's, and every change of
                            # both rules, recorded as a placement, replays (kvps__vmap_of) to its map

   WORKLOAD (fixed, deterministic)
   - 10^6 raw keys k = 0 .. 999999; length by k mod 4: 0,1 -> 1 float, 2 -> 16 floats, 3 -> 64
     floats (half 1, a quarter 16, a quarter 64: 20.5 floats = 82 bytes a key on average, 82 MB).
   - the parameter tensors (trainable parameters only; BatchNorm running statistics are buffers,
     not parameters) of four published models, generated from their architectures below:
       ResNet-50     He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
                     table 1 (50-layer, bottleneck blocks [3,4,6,3]); torchvision's tensor list:
                     161 tensors, 25,557,032 parameters.
       BERT-base     Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for
                     Language Understanding", NAACL 2019 (L=12, H=768, A=12, vocab 30522, 512
                     positions, FFN 4H); 199 tensors, 109,482,240 parameters.
       GPT-2 medium  Radford et al., "Language Models are Unsupervised Multitask Learners", 2019,
                     table 2 (24 layers, d_model 1024, vocab 50257, context 1024; output layer tied
                     to the token embedding); 292 tensors, 354,823,168 parameters.
       VGG-16        Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
                     Recognition", ICLR 2015, table 1 config D (13 conv 3x3 + 3 FC); 32 tensors,
                     138,357,544 parameters, fc6 alone 25088 x 4096 = 102,760,448.
     684 tensors, 628,219,984 floats (2.51 GB). The program checks these totals.
   Bytes = floats x 4. Total 648.7 M floats (2.59 GB); raw keys are 3% of the bytes.

   SERVERS: endpoint e is "tcp://10.1.<e/256>.<e%256>:7070"; its id is mix64(fnv1a(endpoint)).
   Server sets: n servers = endpoints 0..n-1 in that order. Join: endpoint n appended (n+1).
   Leave: endpoint n/2 (a middle one) removed, the others keep their order (n-1; kvps-vshard: the
   last one). A byte "moves" when the endpoint holding it differs before and after (kvps-mod:
   element by element, since its slices are cut again). Shares are of all bytes; ideal is
   1/(n+1) for a join, 1/n for a leave (only the newcomer's share, resp. the leaver's, changes
   hands).

   SCHEMES (all deterministic from the server list and the keys/tensors alone, except as noted)
   kvps-mod     kvps today: raw key k on mix64(k) mod n; a tensor of len floats cut into
                min(n, ceil(len/min_slice)) slices (min_slice 1024), cut again into the next
                multiple of n slices where slices would exceed max_slice (262144), at most 65536
                and at most len; slice i on (fnv1a(name) + i) mod n.
   kvps-vshard  kvps with RESHARD (kvps.h, section 4): a job begun on n0 = n servers has V = 256 n0
                virtual shards, vmap[v] = v mod n0 at first (so it starts as kvps-mod, bit for bit:
                checked); raw key k in virtual shard mix64(k) mod V, slice i of a tensor (cut for
                n0 servers as kvps-mod cuts it, and never cut again) in (fnv1a(name) mod V + i) mod V;
                its server is vmap[v]. A change of the map is vmap_plan, kvps__vmap_plan, fed each
                shard's bytes (4 x its floats: the keys' and slices' lengths in it, as worker 0
                adds them up from the servers' KEYS answers): a grow fills each new server with the
                largest shards that fit under the mean, from the fullest old servers, then with
                empty shards up to V / n'; a shrink deals the leaving servers' shards, largest
                first, to the servers with the fewest bytes. kvps adds and removes servers at the
                END of the list, so its leave removes the LAST server (n-1), not the middle one.
                Measured per n: the join n -> n+1 and the leave n -> n-1 (max/mean after; moved =
                bytes whose shard changes server), and n -> n + ceil(n/10) one server at a time
                (+10%). For the leave, a bound: no map that deals the last server's whole shards
                and keeps the others' does better than max(the fullest other, the emptiest other +
                the leaver's largest shard) / the mean after (or 1).
   kvps-vshard-counts  the same with the rule kvps used before ("kvps-vshard by counts (before)"
                in the tables): vmap_change, kvps__vmap_change (kvps__vmap_of still replays it for
                changes recorded without moves): a grow gives each new server V / n' whole
                shards, one at a time from the fullest server by shard COUNT (ties: the lowest
                index), in the order of mix64(v), highest first; a shrink deals the leaving
                server's shards, ascending, to the one with the fewest shards.
   Fixed pieces (the schemes below): a tensor is cut into ceil(len/P) pieces of equal size (+-1
   float), P = "piece" in the tables, the same whatever n is. Piece i of tensor t is the item
   mix64(mix64(fnv1a(name)) + i + 1); raw key k is the item mix64(k). Items are placed one by one.
   hrw          rendezvous (highest random weight): item x on the server s maximising
                mix64(x ^ id(s)). Exact for all 10^6 keys and every piece (no sampling): a join
                moves exactly the items whose weight on the newcomer beats their current best,
                a leave exactly the leaver's items.
   ring-V       consistent hashing: V virtual nodes per server at mix64(id(s) ^ mix64(v + 1)),
                v < V; item x on the owner of the first virtual node at or after x (wrapping).
   bounded-eps  consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent
                Hashing with Bounded Loads", SODA 2018) by bytes, on ring-100: tensor pieces are
                placed in a fixed pseudo-random order (by mix64(x ^ C)); each goes to the first
                server clockwise from x whose tensor bytes so far are below (1+eps) x (tensor
                bytes / n) -- so no server exceeds that by more than one piece. Raw keys are not
                known to the workers in advance (the servers learn them as they are pushed), so
                they are placed by plain ring-100 and do not count against the capacity.
                Deterministic given the server list and the set of registered tensors (every
                worker registers the same ones; kvps checks that): placement is a function of
                both, computed again when either changes.

   OUTPUT: a table per piece size P (default P = 262144 floats = kvps's max_slice, 1 MiB; 16384
   floats = 64 KiB; 1024 floats = 4 KiB, kvps's min_slice) for n in {10,30,100,300,1000}: max/mean bytes per server, share of
   bytes moved at a join and at a leave. Then, at n = 1000 (--sweep-n), max/mean for P = 2^18 down
   to 2^8 (kvps-mod: min_slice = P, max_slice = max(P, 262144)), and per scheme the largest P with
   max/mean <= 1.1; last, the tables again in Markdown (as in BENCHMARKS.md). All rows go to the
   CSV (kind = table, grow10 or sweep; piece_floats 0 = kvps's cut by n (n0); the sweep has no
   moves). kvps-vshard and kvps-vshard-counts "table" rows: max_mean before (= kvps-mod's),
   join_max_mean and leave_max_mean after, leave_* for the last server, leave_bound the bound
   above. "grow10" rows (both, n -> n_end one server at a time): max_mean and min_mean (the
   emptiest server) at n_end, join_max_mean the worst max/mean after any step, join_moved the
   bytes moved summed over the steps (join_ideal: the sum of 1/(k+1)), leave_moved the bytes on
   another server at the end than at the start (leave_ideal: 1 - n/n_end).
   No sampling anywhere: every key and piece is placed at every n (about 40 s on one core). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define KVPS_IMPLEMENTATION
#include "kvps.h" /* its own hashes and RESHARD planners: kvps__mix64, kvps__fnv1a, kvps__vmap_plan, kvps__vmap_change */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NRAW 1000000u
#define NMAXS 1001 /* endpoints: up to 1000 servers + 1 joining */
#define KVPS_MIN_SLICE 1024u
#define KVPS_MAX_SLICE 262144u

static uint64_t mix64(uint64_t x) { return kvps__mix64(x); }
static uint64_t fnv1a(const char *s) { return kvps__fnv1a(s); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "placement_sim: out of memory (%zu bytes)\n", n); exit(1); }
    return p;
}

static double now_s(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* ---------------------------------------------------------------- the tensors */

typedef struct { char name[72]; uint64_t len; uint64_t h; } tensor;
static tensor *TS;
static int nt, cap_t;

static void tadd(uint64_t len, const char *fmt, ...) {
    if (nt == cap_t) {
        cap_t = cap_t ? 2 * cap_t : 256;
        tensor *nt_ = (tensor *)realloc(TS, (size_t)cap_t * sizeof *TS);
        if (!nt_) { fprintf(stderr, "placement_sim: out of memory\n"); exit(1); }
        TS = nt_;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(TS[nt].name, sizeof TS[nt].name, fmt, ap);
    va_end(ap);
    TS[nt].len = len;
    TS[nt].h = fnv1a(TS[nt].name);
    nt++;
}

/* ResNet-50 (He et al. 2016, table 1): conv1 7x7/64, four stages of bottleneck blocks
   (1x1 w, 3x3 w, 1x1 4w; a 1x1 projection on each stage's first block), widths 64..512,
   [3,4,6,3] blocks, fc 2048 -> 1000. Each conv is followed by BatchNorm (weight, bias). */
static void resnet50(void) {
    const char *m = "resnet50";
    static const int blocks[4] = {3, 4, 6, 3}, width[4] = {64, 128, 256, 512};
    uint64_t in = 64;
    tadd(3 * 64 * 7 * 7, "%s.conv1.weight", m);
    tadd(64, "%s.bn1.weight", m); tadd(64, "%s.bn1.bias", m);
    for (int l = 0; l < 4; l++)
        for (int b = 0; b < blocks[l]; b++) {
            uint64_t w = (uint64_t)width[l];
            tadd(in * w, "%s.layer%d.%d.conv1.weight", m, l + 1, b);
            tadd(w, "%s.layer%d.%d.bn1.weight", m, l + 1, b); tadd(w, "%s.layer%d.%d.bn1.bias", m, l + 1, b);
            tadd(w * w * 9, "%s.layer%d.%d.conv2.weight", m, l + 1, b);
            tadd(w, "%s.layer%d.%d.bn2.weight", m, l + 1, b); tadd(w, "%s.layer%d.%d.bn2.bias", m, l + 1, b);
            tadd(w * 4 * w, "%s.layer%d.%d.conv3.weight", m, l + 1, b);
            tadd(4 * w, "%s.layer%d.%d.bn3.weight", m, l + 1, b); tadd(4 * w, "%s.layer%d.%d.bn3.bias", m, l + 1, b);
            if (b == 0) {
                tadd(in * 4 * w, "%s.layer%d.0.downsample.0.weight", m, l + 1);
                tadd(4 * w, "%s.layer%d.0.downsample.1.weight", m, l + 1);
                tadd(4 * w, "%s.layer%d.0.downsample.1.bias", m, l + 1);
            }
            in = 4 * w;
        }
    tadd(2048 * 1000, "%s.fc.weight", m); tadd(1000, "%s.fc.bias", m);
}

/* BERT-base (Devlin et al. 2019): token/position/segment embeddings + LayerNorm; 12 layers of
   self-attention (Q, K, V, output: 768x768 + bias), LayerNorm, FFN 768->3072->768, LayerNorm;
   pooler 768x768. (The pre-training heads are not counted: 110 M is the encoder's size.) */
static void bert_base(void) {
    const char *m = "bert";
    const uint64_t H = 768, F = 3072;
    tadd(30522 * H, "%s.embeddings.word_embeddings.weight", m);
    tadd(512 * H, "%s.embeddings.position_embeddings.weight", m);
    tadd(2 * H, "%s.embeddings.token_type_embeddings.weight", m);
    tadd(H, "%s.embeddings.LayerNorm.weight", m); tadd(H, "%s.embeddings.LayerNorm.bias", m);
    for (int l = 0; l < 12; l++) {
        static const char *qkv[3] = {"query", "key", "value"};
        for (int j = 0; j < 3; j++) {
            tadd(H * H, "%s.encoder.layer.%d.attention.self.%s.weight", m, l, qkv[j]);
            tadd(H, "%s.encoder.layer.%d.attention.self.%s.bias", m, l, qkv[j]);
        }
        tadd(H * H, "%s.encoder.layer.%d.attention.output.dense.weight", m, l);
        tadd(H, "%s.encoder.layer.%d.attention.output.dense.bias", m, l);
        tadd(H, "%s.encoder.layer.%d.attention.output.LayerNorm.weight", m, l);
        tadd(H, "%s.encoder.layer.%d.attention.output.LayerNorm.bias", m, l);
        tadd(H * F, "%s.encoder.layer.%d.intermediate.dense.weight", m, l);
        tadd(F, "%s.encoder.layer.%d.intermediate.dense.bias", m, l);
        tadd(F * H, "%s.encoder.layer.%d.output.dense.weight", m, l);
        tadd(H, "%s.encoder.layer.%d.output.dense.bias", m, l);
        tadd(H, "%s.encoder.layer.%d.output.LayerNorm.weight", m, l);
        tadd(H, "%s.encoder.layer.%d.output.LayerNorm.bias", m, l);
    }
    tadd(H * H, "%s.pooler.dense.weight", m); tadd(H, "%s.pooler.dense.bias", m);
}

/* GPT-2 medium (Radford et al. 2019): token embedding 50257 x d (tied output layer), learned
   positions 1024 x d; 24 pre-LayerNorm blocks: ln_1, fused QKV d -> 3d, projection d -> d, ln_2,
   MLP d -> 4d -> d (all with biases); final ln_f. d = 1024. */
static void gpt2_medium(void) {
    const char *m = "gpt2-medium";
    const uint64_t d = 1024;
    tadd(50257 * d, "%s.wte.weight", m);
    tadd(1024 * d, "%s.wpe.weight", m);
    for (int l = 0; l < 24; l++) {
        tadd(d, "%s.h.%d.ln_1.weight", m, l); tadd(d, "%s.h.%d.ln_1.bias", m, l);
        tadd(d * 3 * d, "%s.h.%d.attn.c_attn.weight", m, l); tadd(3 * d, "%s.h.%d.attn.c_attn.bias", m, l);
        tadd(d * d, "%s.h.%d.attn.c_proj.weight", m, l); tadd(d, "%s.h.%d.attn.c_proj.bias", m, l);
        tadd(d, "%s.h.%d.ln_2.weight", m, l); tadd(d, "%s.h.%d.ln_2.bias", m, l);
        tadd(d * 4 * d, "%s.h.%d.mlp.c_fc.weight", m, l); tadd(4 * d, "%s.h.%d.mlp.c_fc.bias", m, l);
        tadd(4 * d * d, "%s.h.%d.mlp.c_proj.weight", m, l); tadd(d, "%s.h.%d.mlp.c_proj.bias", m, l);
    }
    tadd(d, "%s.ln_f.weight", m); tadd(d, "%s.ln_f.bias", m);
}

/* VGG-16 (Simonyan & Zisserman 2015, config D): 3x3 convs 64,64 | 128,128 | 256 x3 | 512 x3 |
   512 x3 (max-pool between groups), then fc6 25088 -> 4096 (7x7x512 in), fc7 4096 -> 4096,
   fc8 4096 -> 1000. Names as torchvision's vgg16 (features.<index>, classifier.<index>). */
static void vgg16(void) {
    const char *m = "vgg16";
    static const int out[13] = {64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512};
    static const int idx[13] = {0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28};
    uint64_t in = 3;
    for (int i = 0; i < 13; i++) {
        tadd(in * (uint64_t)out[i] * 9, "%s.features.%d.weight", m, idx[i]);
        tadd((uint64_t)out[i], "%s.features.%d.bias", m, idx[i]);
        in = (uint64_t)out[i];
    }
    tadd(25088ull * 4096, "%s.classifier.0.weight", m); tadd(4096, "%s.classifier.0.bias", m);
    tadd(4096ull * 4096, "%s.classifier.3.weight", m); tadd(4096, "%s.classifier.3.bias", m);
    tadd(4096ull * 1000, "%s.classifier.6.weight", m); tadd(1000, "%s.classifier.6.bias", m);
}

static int check_model(const char *what, int t0, int count, uint64_t params) {
    uint64_t s = 0;
    for (int i = t0; i < nt; i++) s += TS[i].len;
    printf("  %-13s %4d tensors %12llu parameters  largest ", what, nt - t0, (unsigned long long)s);
    uint64_t big = 0;
    for (int i = t0; i < nt; i++) if (TS[i].len > big) big = TS[i].len;
    printf("%llu\n", (unsigned long long)big);
    if (nt - t0 != count || s != params) {
        fprintf(stderr, "placement_sim: %s has %d tensors / %llu parameters, the paper's architecture %d / %llu\n",
                what, nt - t0, (unsigned long long)s, count, (unsigned long long)params);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- servers */

static uint64_t sid[NMAXS]; /* id of endpoint e */

static void endpoints(void) {
    char buf[64];
    for (int e = 0; e < NMAXS; e++) {
        snprintf(buf, sizeof buf, "tcp://10.1.%d.%d:7070", e / 256, e % 256);
        sid[e] = mix64(fnv1a(buf));
    }
}

/* the three lists of one experiment: base (n), join (n+1), leave (n-1, endpoint n/2 gone) */
typedef struct { int n, base[NMAXS], join[NMAXS], leave[NMAXS], mid; } lists;

static void make_lists(lists *L, int n) {
    L->n = n;
    L->mid = n / 2;
    for (int i = 0; i < n; i++) L->base[i] = L->join[i] = i;
    L->join[n] = n;
    for (int i = 0, j = 0; i < n; i++) if (i != L->mid) L->leave[j++] = i;
}

/* ---------------------------------------------------------------- results */

typedef struct {
    const char *kind, *scheme;
    uint64_t piece, pieces;
    int n;
    double maxmean, join, leave;
    double jmm, lmm, minmm, join_ideal, leave_ideal; /* kvps-vshard only (else NAN; the ideals 1/(n+1), 1/n) */
    double lbound;                             /* kvps-vshard "table": leave_bound's max/mean (else NAN) */
    int n_end;                                 /* kind "grow10": the server count at the end */
} row;
static row *R;
static int nr, cap_r;

static void add_row(const char *kind, const char *scheme, uint64_t piece, uint64_t pieces, int n, double mm,
                    double join, double leave) {
    if (nr == cap_r) {
        cap_r = cap_r ? 2 * cap_r : 64;
        row *nr_ = (row *)realloc(R, (size_t)cap_r * sizeof *R);
        if (!nr_) { fprintf(stderr, "placement_sim: out of memory\n"); exit(1); }
        R = nr_;
    }
    row r = {kind, scheme, piece, pieces, n, mm, join, leave, NAN, NAN, NAN, 1.0 / (n + 1), 1.0 / n, NAN, 0};
    R[nr++] = r;
}

static double max_over_mean(const double *load, const int *list, int n) {
    double sum = 0, mx = 0;
    for (int i = 0; i < n; i++) { sum += load[list[i]]; if (load[list[i]] > mx) mx = load[list[i]]; }
    return mx / (sum / n);
}

/* ---------------------------------------------------------------- raw keys */

static uint32_t raw_len(uint64_t k) { static const uint32_t l[4] = {1, 1, 16, 64}; return l[k & 3]; }

/* ---------------------------------------------------------------- kvps today */

/* kvps_worker_tensor's cut (kvps.h), with min_slice / max_slice as parameters */
static uint64_t kvps_nslices(uint64_t len, uint64_t n, uint64_t mins, uint64_t maxs) {
    uint64_t ns = (len + mins - 1) / mins;
    if (ns > n) ns = n;
    if (ns < 1) ns = 1;
    uint64_t pieces = (len + maxs - 1) / maxs;
    if (pieces > ns) ns = (pieces + n - 1) / n * n;
    if (ns > 65536) ns = 65536 - 65536 % n;
    if (ns > len) ns = len;
    return ns;
}

static void kvps_loads(const int *list, int n, uint64_t mins, uint64_t maxs, double *load, uint64_t *slices) {
    for (int i = 0; i < n; i++) load[list[i]] = 0;
    for (uint64_t k = 0; k < NRAW; k++) load[list[mix64(k) % (uint64_t)n]] += raw_len(k);
    uint64_t tot = 0;
    for (int t = 0; t < nt; t++) {
        uint64_t len = TS[t].len, ns = kvps_nslices(len, (uint64_t)n, mins, maxs), first = TS[t].h % (uint64_t)n;
        for (uint64_t i = 0; i < ns; i++) load[list[(first + i) % (uint64_t)n]] += (double)(len * (i + 1) / ns - len * i / ns);
        tot += ns;
    }
    if (slices) *slices = tot;
}

/* floats whose endpoint differs between list a (na servers) and list b (nb) */
static double kvps_moved(const int *a, int na, const int *b, int nb) {
    double moved = 0;
    for (uint64_t k = 0; k < NRAW; k++) {
        uint64_t x = mix64(k);
        if (a[x % (uint64_t)na] != b[x % (uint64_t)nb]) moved += raw_len(k);
    }
    for (int t = 0; t < nt; t++) {
        uint64_t len = TS[t].len;
        uint64_t sa = kvps_nslices(len, (uint64_t)na, KVPS_MIN_SLICE, KVPS_MAX_SLICE), fa = TS[t].h % (uint64_t)na;
        uint64_t sb = kvps_nslices(len, (uint64_t)nb, KVPS_MIN_SLICE, KVPS_MAX_SLICE), fb = TS[t].h % (uint64_t)nb;
        uint64_t i = 0, j = 0, at = 0;
        while (at < len) { /* walk both cuts' boundaries together */
            uint64_t ea = len * (i + 1) / sa, eb = len * (j + 1) / sb, e = ea < eb ? ea : eb;
            if (a[(fa + i) % (uint64_t)na] != b[(fb + j) % (uint64_t)nb]) moved += (double)(e - at);
            at = e;
            if (ea == e) i++;
            if (eb == e) j++;
        }
    }
    return moved;
}

/* ---------------------------------------------------------------- kvps-vshard: kvps.h's RESHARD */

/* The two rules are kvps.h's own: kvps__vmap_change, the rule by shard COUNTS that kvps used
   before it planned by bytes (kvps__vmap_of still replays it for changes recorded without
   moves), here the "kvps-vshard-counts" scheme, the before of the tables; and kvps__vmap_plan,
   the plan by bytes that kvps_worker_reshard makes now. */

/* floats in each virtual shard of a job begun on n0 servers (V = 256 n0, as kvps_worker_create):
   raw key k in mix64(k) mod V (kvps__vshard_of), slice i of a tensor, cut for n0 servers as
   kvps-mod cuts it, in (fnv1a(name) mod V + i) mod V (kvps_worker_tensor's hv). Returns the
   slice count. */
static uint64_t vshard_floats(int n0, double *vf) {
    uint32_t V = 256u * (uint32_t)n0;
    for (uint32_t v = 0; v < V; v++) vf[v] = 0;
    for (uint64_t k = 0; k < NRAW; k++) vf[mix64(k) % V] += raw_len(k);
    uint64_t tot = 0;
    for (int t = 0; t < nt; t++) {
        uint64_t len = TS[t].len, ns = kvps_nslices(len, (uint64_t)n0, KVPS_MIN_SLICE, KVPS_MAX_SLICE), hv = TS[t].h % V;
        for (uint64_t i = 0; i < ns; i++) vf[(hv + i) % V] += (double)(len * (i + 1) / ns - len * i / ns);
        tot += ns;
    }
    return tot;
}

/* bytes (load[0..n)) and shard counts per server under vmap: max/mean of the bytes; of the shard
   counts in *cmm, min/mean of the bytes in *minmm (each where not NULL) */
static double vshard_loads(const uint32_t *vmap, uint32_t V, const double *vf, int n, double *load, double *cmm,
                           double *minmm) {
    uint32_t *cnt = (uint32_t *)xmalloc((size_t)n * sizeof *cnt);
    for (int i = 0; i < n; i++) { load[i] = 0; cnt[i] = 0; }
    for (uint32_t v = 0; v < V; v++) { load[vmap[v]] += vf[v]; cnt[vmap[v]]++; }
    double sum = 0, mx = 0, mn = load[0];
    uint32_t cmx = 0;
    for (int i = 0; i < n; i++) {
        sum += load[i];
        if (load[i] > mx) mx = load[i];
        if (load[i] < mn) mn = load[i];
        if (cnt[i] > cmx) cmx = cnt[i];
    }
    if (cmm) *cmm = cmx / ((double)V / n);
    if (minmm) *minmm = mn / (sum / n);
    free(cnt);
    return mx / (sum / n);
}

/* floats whose virtual shard is on another server under b than under a */
static double vshard_moved(const uint32_t *a, const uint32_t *b, uint32_t V, const double *vf) {
    double m = 0;
    for (uint32_t v = 0; v < V; v++) if (a[v] != b[v]) m += vf[v];
    return m;
}

typedef struct {
    int n, m;                                 /* start; end of the +10% sequence */
    uint64_t slices;
    double mm0, jmm, jcmm, jnew, jmoved, lmm, lcmm, lmoved; /* jnew: the newcomer's bytes / the mean */
    double lbound;                                    /* leave_bound: the least max/mean a leave can reach */
    uint32_t jlo, jhi, jcnt;                          /* the newcomer's shards: lowest, highest, how many */
    double gmm, gmin, gcmm, gworst, gsum, gsum_ideal, gnet; /* +10% one at a time: at the end, worst step, moved */
} vres;

/* a lower bound on max/mean after the last of n servers leaves, over every map that keeps the
   others' shards and deals the leaver's whole: no server left holds less than it did, and the
   leaver's largest shard lands on one of them, so max >= max(the fullest, the emptiest + it),
   and max >= the mean */
static double leave_bound(const uint32_t *vmap, uint32_t V, const double *vf, int n, double tot) {
    double *load = (double *)xmalloc((size_t)n * sizeof *load), big = 0, mx = 0, mn;
    for (int i = 0; i < n; i++) load[i] = 0;
    for (uint32_t v = 0; v < V; v++) {
        load[vmap[v]] += vf[v];
        if (vmap[v] == (uint32_t)n - 1 && vf[v] > big) big = vf[v];
    }
    mn = load[0];
    for (int i = 0; i < n - 1; i++) {
        if (load[i] > mx) mx = load[i];
        if (load[i] < mn) mn = load[i];
    }
    free(load);
    double b = (mn + big > mx ? mn + big : mx) / (tot / (n - 1));
    return b > 1 ? b : 1;
}

/* bytes[v] = 4 x the floats of shard v: what kvps__reshard_plan adds up from the servers' KEYS
   answers (a key's length x sizeof(float)) and feeds kvps__vmap_plan */
static void vshard_bytes(const double *vf, uint32_t V, uint64_t *bytes) {
    for (uint32_t v = 0; v < V; v++) bytes[v] = (uint64_t)vf[v] * sizeof(float);
}

/* one reshard n -> n2 of vmap: by the rule by counts (kvps-vshard-counts, before) or planned by
   bytes (kvps-vshard, what kvps does now; its moves are dropped, vmap holds their result) */
static void vmap_step(uint32_t *vmap, uint32_t V, int n, int n2, const uint64_t *bytes, int counts) {
    uint32_t *mv = NULL;
    uint64_t nmv = 0;
    if (counts ? kvps__vmap_change(vmap, V, n, n2) != 0 : kvps__vmap_plan(vmap, V, n, n2, bytes, &mv, &nmv) != 0) {
        fprintf(stderr, "placement_sim: out of memory\n");
        exit(1);
    }
    free(mv);
}

/* kvps-vshard for a job begun on n servers: the join n -> n+1, the leave of the last server
   n -> n-1, and n -> n + ceil(n/10) one server at a time, each change by the rule by counts
   (counts = 1) or planned by the bytes of each shard (0). kload: kvps-mod's loads at n (the
   start must be it exactly). */
static int run_vshard(int n, const double *kload, double tot, int counts, vres *o) {
    uint32_t V = 256u * (uint32_t)n;
    int m = n + (n + 9) / 10;
    double *vf = (double *)xmalloc(V * sizeof *vf), *load = (double *)xmalloc((size_t)(m + 1) * sizeof *load);
    uint32_t *v0 = (uint32_t *)xmalloc(V * sizeof *v0), *v1 = (uint32_t *)xmalloc(V * sizeof *v1),
             *v2 = (uint32_t *)xmalloc(V * sizeof *v2);
    uint64_t *vb = (uint64_t *)xmalloc(V * sizeof *vb);
    memset(o, 0, sizeof *o);
    o->n = n;
    o->m = m;
    o->slices = vshard_floats(n, vf);
    vshard_bytes(vf, V, vb);
    for (uint32_t v = 0; v < V; v++) v0[v] = v % (uint32_t)n; /* kvps_worker_create's map */
    o->mm0 = vshard_loads(v0, V, vf, n, load, NULL, NULL);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += load[i] != kload[i]; /* today's placement, bit for bit */
    memcpy(v1, v0, V * sizeof *v1);
    vmap_step(v1, V, n, n + 1, vb, counts);
    o->jmm = vshard_loads(v1, V, vf, n + 1, load, &o->jcmm, NULL);
    o->jnew = load[n] / (tot / (n + 1));
    o->jlo = V;
    for (uint32_t v = 0; v < V; v++)
        if (v1[v] == (uint32_t)n) {
            if (v < o->jlo) o->jlo = v;
            o->jhi = v;
            o->jcnt++;
        }
    o->jmoved = vshard_moved(v0, v1, V, vf) / tot;
    memcpy(v1, v0, V * sizeof *v1);
    vmap_step(v1, V, n, n - 1, vb, counts);
    o->lmm = vshard_loads(v1, V, vf, n - 1, load, &o->lcmm, NULL);
    o->lmoved = vshard_moved(v0, v1, V, vf) / tot;
    o->lbound = leave_bound(v0, V, vf, n, tot);
    memcpy(v1, v0, V * sizeof *v1);
    for (int k = n; k < m; k++) {
        memcpy(v2, v1, V * sizeof *v2);
        vmap_step(v1, V, k, k + 1, vb, counts);
        o->gsum += vshard_moved(v2, v1, V, vf) / tot;
        o->gsum_ideal += 1.0 / (k + 1);
        double mm = vshard_loads(v1, V, vf, k + 1, load, k + 1 == m ? &o->gcmm : NULL, k + 1 == m ? &o->gmin : NULL);
        if (mm > o->gworst) o->gworst = mm;
        if (k + 1 == m) o->gmm = mm;
    }
    o->gnet = vshard_moved(v0, v1, V, vf) / tot;
    free(vf); free(load); free(v0); free(v1); free(v2); free(vb);
    if (bad) fprintf(stderr, "placement_sim: kvps-vshard at n = %d is not kvps-mod's placement (%d servers differ)\n", n, bad);
    return bad;
}

/* ---------------------------------------------------------------- fixed pieces: items */

typedef struct { uint64_t x; uint32_t len; uint32_t raw; } item;
typedef struct {
    item *v;
    size_t n, npieces;
    uint64_t piece;
    double raw_floats, tensor_floats;
    uint32_t *order; /* tensor items in bounded-load order */
    size_t norder;
} itemset;

static int cmp_item(const void *a, const void *b) {
    uint64_t x = ((const item *)a)->x, y = ((const item *)b)->x;
    return x < y ? -1 : x > y;
}

/* sort by key: an LSD radix sort (qsort of 10^6 items per piece size costs more than the rest) */
static void sort_items(item *v, size_t n) {
    if (n < 4096) { qsort(v, n, sizeof *v, cmp_item); return; }
    item *tmp = (item *)xmalloc(n * sizeof *tmp);
    size_t *cnt = (size_t *)xmalloc(65536 * sizeof *cnt);
    for (int shift = 0; shift < 64; shift += 16) {
        memset(cnt, 0, 65536 * sizeof *cnt);
        for (size_t i = 0; i < n; i++) cnt[(v[i].x >> shift) & 0xffff]++;
        size_t s = 0;
        for (size_t d = 0; d < 65536; d++) { size_t c = cnt[d]; cnt[d] = s; s += c; }
        for (size_t i = 0; i < n; i++) tmp[cnt[(v[i].x >> shift) & 0xffff]++] = v[i];
        item *sw = v; v = tmp; tmp = sw;
    }
    free(cnt);
    free(tmp); /* 4 passes: the sorted data is back in the caller's array */
}

static const uint64_t ORDER_SALT = 0x6a09e667f3bcc909ull;

typedef struct { uint64_t key; uint32_t idx; } okey;
static int cmp_okey(const void *a, const void *b) {
    uint64_t x = ((const okey *)a)->key, y = ((const okey *)b)->key;
    return x < y ? -1 : x > y;
}

static void make_items(itemset *S, uint64_t P) {
    size_t np = 0;
    for (int t = 0; t < nt; t++) np += (size_t)((TS[t].len + P - 1) / P);
    S->n = NRAW + np;
    S->npieces = np;
    S->piece = P;
    S->v = (item *)xmalloc(S->n * sizeof *S->v);
    S->raw_floats = S->tensor_floats = 0;
    size_t j = 0;
    for (uint64_t k = 0; k < NRAW; k++) {
        item it = {mix64(k), raw_len(k), 1};
        S->v[j++] = it;
        S->raw_floats += it.len;
    }
    for (int t = 0; t < nt; t++) {
        uint64_t len = TS[t].len, ns = (len + P - 1) / P, base = mix64(TS[t].h);
        for (uint64_t i = 0; i < ns; i++) {
            item it = {mix64(base + i + 1), (uint32_t)(len * (i + 1) / ns - len * i / ns), 0};
            S->v[j++] = it;
        }
        S->tensor_floats += (double)len;
    }
    sort_items(S->v, S->n);
    /* the bounded-load order of the tensor items: by mix64(x ^ salt) */
    okey *ok = (okey *)xmalloc(np * sizeof *ok);
    size_t m = 0;
    for (size_t i = 0; i < S->n; i++)
        if (!S->v[i].raw) { ok[m].key = mix64(S->v[i].x ^ ORDER_SALT); ok[m].idx = (uint32_t)i; m++; }
    qsort(ok, m, sizeof *ok, cmp_okey);
    S->order = (uint32_t *)xmalloc((m ? m : 1) * sizeof *S->order);
    for (size_t i = 0; i < m; i++) S->order[i] = ok[i].idx;
    S->norder = m;
    free(ok);
}

static void free_items(itemset *S) { free(S->v); free(S->order); }

static double share(double moved, const itemset *S) { return moved / (S->raw_floats + S->tensor_floats); }

/* ---------------------------------------------------------------- rendezvous */

/* owner (endpoint) and best weight of every item on list[0..n) */
static void hrw_place(const itemset *S, const int *list, int n, int *owner, uint64_t *best) {
    uint64_t ids[NMAXS];
    for (int i = 0; i < n; i++) ids[i] = sid[list[i]];
    for (size_t i = 0; i < S->n; i++) {
        uint64_t x = S->v[i].x, bw = 0;
        int bo = 0;
        for (int s = 0; s < n; s++) {
            uint64_t w = mix64(x ^ ids[s]);
            if (w > bw) { bw = w; bo = s; }
        }
        owner[i] = list[bo];
        if (best) best[i] = bw;
    }
}

static void run_hrw(const itemset *S, const lists *L, int *owner, uint64_t *best, double *load, const char *kind) {
    int n = L->n;
    hrw_place(S, L->base, n, owner, best);
    for (int i = 0; i < n; i++) load[L->base[i]] = 0;
    for (size_t i = 0; i < S->n; i++) load[owner[i]] += S->v[i].len;
    double mm = max_over_mean(load, L->base, n), jm = 0, lm = 0;
    uint64_t idn = sid[L->join[n]];
    int gone = L->mid;
    for (size_t i = 0; i < S->n; i++) {
        if (mix64(S->v[i].x ^ idn) > best[i]) jm += S->v[i].len; /* the newcomer wins it */
        if (owner[i] == gone) lm += S->v[i].len;                 /* the leaver's items, no others */
    }
    add_row(kind, "hrw", S->piece, S->npieces, n, mm, share(jm, S), share(lm, S));
}

/* ---------------------------------------------------------------- ring, bounded loads */

typedef item vnode; /* a virtual node: x = its position on the ring, len = its endpoint */

static size_t ring_build(vnode *vn, const int *list, int n, int V) {
    size_t m = 0;
    for (int i = 0; i < n; i++)
        for (int v = 0; v < V; v++) {
            vnode a = {mix64(sid[list[i]] ^ mix64((uint64_t)v + 1)), (uint32_t)list[i], 0};
            vn[m++] = a;
        }
    sort_items(vn, m);
    return m;
}

/* start[i]: index of the first virtual node at or after item i (items sorted by x) */
static void ring_starts(const itemset *S, const vnode *vn, size_t nv, uint32_t *start) {
    size_t j = 0;
    for (size_t i = 0; i < S->n; i++) {
        while (j < nv && vn[j].x < S->v[i].x) j++;
        start[i] = (uint32_t)(j < nv ? j : 0);
    }
}

/* plain ring (eps < 0) or bounded loads (eps >= 0): owner of every item */
static void ring_place(const itemset *S, const vnode *vn, size_t nv, int n, double eps, uint32_t *start, int *owner,
                       double *tload) {
    ring_starts(S, vn, nv, start);
    for (size_t i = 0; i < S->n; i++) owner[i] = (int)vn[start[i]].len;
    if (eps < 0) return;
    double cap = (1 + eps) * S->tensor_floats / n;
    for (size_t i = 0; i < nv; i++) tload[vn[i].len] = 0;
    for (size_t k = 0; k < S->norder; k++) {
        size_t i = S->order[k], j = start[i];
        while (tload[vn[j].len] >= cap) j = j + 1 < nv ? j + 1 : 0; /* some server is below cap */
        owner[i] = (int)vn[j].len;
        tload[vn[j].len] += S->v[i].len;
    }
}

static double moved_between(const itemset *S, const int *a, const int *b) {
    double m = 0;
    for (size_t i = 0; i < S->n; i++) if (a[i] != b[i]) m += S->v[i].len;
    return m;
}

typedef struct { int *o0, *o1, *o2; uint32_t *start; vnode *vj, *vb, *vl; double *tload; } ringbuf;

/* eps < 0: ring-V; else bounded-eps on ring-V */
static double run_ring(const itemset *S, const lists *L, int V, double eps, ringbuf *B, double *load, int moves,
                       const char *kind, const char *name) {
    int n = L->n;
    /* the joined ring holds every virtual node; the others are it without endpoint n (and n/2) */
    size_t nj = ring_build(B->vj, L->join, n + 1, V), nb = 0, nl = 0;
    for (size_t i = 0; i < nj; i++) {
        if (B->vj[i].len == (uint32_t)n) continue;
        B->vb[nb++] = B->vj[i];
        if (B->vj[i].len != (uint32_t)L->mid) B->vl[nl++] = B->vj[i];
    }
    ring_place(S, B->vb, nb, n, eps, B->start, B->o0, B->tload);
    for (int i = 0; i < n; i++) load[L->base[i]] = 0;
    for (size_t i = 0; i < S->n; i++) load[B->o0[i]] += S->v[i].len;
    double mm = max_over_mean(load, L->base, n), jm = NAN, lm = NAN;
    if (moves) {
        ring_place(S, B->vj, nj, n + 1, eps, B->start, B->o1, B->tload);
        ring_place(S, B->vl, nl, n - 1, eps, B->start, B->o2, B->tload);
        jm = share(moved_between(S, B->o0, B->o1), S);
        lm = share(moved_between(S, B->o0, B->o2), S);
    }
    add_row(kind, name, S->piece, S->npieces, n, mm, jm, lm);
    return mm;
}

/* ---------------------------------------------------------------- tables */

static const int NSET[] = {10, 30, 100, 300, 1000};
#define NNSET ((int)(sizeof NSET / sizeof NSET[0]))

/* kvps-vshard's two rules for a change of the map: the CSV's scheme, the tables' label */
typedef struct { const char *scheme, *label; int counts; } vscheme;
static const vscheme VS[] = {{"kvps-vshard-counts", "kvps-vshard by counts (before)", 1},
                             {"kvps-vshard", "kvps-vshard by bytes (now)", 0}};
#define NVS ((int)(sizeof VS / sizeof VS[0]))

static const vscheme *vs_find(const char *scheme) {
    for (int k = 0; k < NVS; k++)
        if (!strcmp(VS[k].scheme, scheme)) return &VS[k];
    return NULL;
}

typedef struct { const char *name; int V; double eps; } ringscheme;
static const ringscheme RS[] = {{"ring-100", 100, -1}, {"ring-1000", 1000, -1}, {"bounded-0.05", 100, 0.05},
                                {"bounded-0.1", 100, 0.1}};
#define NRS ((int)(sizeof RS / sizeof RS[0]))

static void print_table(int from, int to) {
    printf("%-13s %7s %5s %8s %9s %10s %7s %10s %7s\n", "scheme", "piece", "n", "pieces", "max/mean", "join moved",
           "ideal", "leave moved", "ideal");
    for (int i = from; i < to; i++) {
        const row *r = &R[i];
        char piece[24];
        if (strcmp(r->scheme, "kvps-mod") == 0) snprintf(piece, sizeof piece, "by n");
        else snprintf(piece, sizeof piece, "%llu", (unsigned long long)r->piece);
        printf("%-13s %7s %5d %8llu %9.3f %9.2f%% %6.2f%% %10.2f%% %6.2f%%\n", r->scheme, piece, r->n,
               (unsigned long long)r->pieces, r->maxmean, 100 * r->join, 100.0 / (r->n + 1), 100 * r->leave,
               100.0 / r->n);
    }
}

static const row *find_row(const char *kind, const char *scheme, uint64_t piece, int n) {
    for (int i = 0; i < nr; i++)
        if (!strcmp(R[i].kind, kind) && !strcmp(R[i].scheme, scheme) && R[i].piece == piece && R[i].n == n) return &R[i];
    return NULL;
}

/* the "table" rows again as two Markdown tables (scheme x n), as BENCHMARKS.md shows them */
static void print_markdown(int nmax) {
    for (int part = 0; part < 2; part++) {
        printf(part ? "\nbytes moved, %% of all bytes: one server joins (n -> n+1) / the middle one (kvps-vshard: the last) leaves (n -> n-1)\n\n"
                    : "\nmax/mean bytes per server\n\n");
        printf("| scheme | piece (floats) |");
        for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) printf(" n = %d |", NSET[a]);
        printf("\n|---|---:|");
        for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) printf("---:|");
        printf("\n");
        if (part) {
            printf("| ideal (1/(n+1) / 1/n) | |");
            for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) printf(" %.2f / %.2f |", 100.0 / (NSET[a] + 1), 100.0 / NSET[a]);
            printf("\n");
        }
        for (int i = 0; i < nr; i++) {
            if (strcmp(R[i].kind, "table")) continue;
            int seen = 0; /* one line per (scheme, piece), at its first row */
            for (int j = 0; j < i; j++)
                if (!strcmp(R[j].kind, "table") && !strcmp(R[j].scheme, R[i].scheme) && R[j].piece == R[i].piece) seen = 1;
            if (seen) continue;
            const vscheme *vs = vs_find(R[i].scheme);
            int lines = vs && !part ? (vs->counts ? 2 : 3) : 1; /* kvps-vshard: after the join, the leave (its bound) */
            for (int line = 0; line < lines; line++) {
                if (vs && part) printf("| %s (leave: the last server) | cut for n0 = n |", vs->label);
                else if (vs && line == 2) printf("| bound: any leave of the last server's whole shards | cut for n0 = n |");
                else if (vs) printf("| %s, after %s | cut for n0 = n |", vs->label, line ? "the last leaves" : "a join");
                else if (R[i].piece) printf("| %s | %llu |", R[i].scheme, (unsigned long long)R[i].piece);
                else printf("| %s | cut by n |", R[i].scheme);
                for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) {
                    const row *r = find_row("table", R[i].scheme, R[i].piece, NSET[a]);
                    if (!r) printf(" |");
                    else if (part) printf(vs ? " %.3f / %.3f |" : " %.2f / %.2f |", 100 * r->join, 100 * r->leave);
                    else printf(" %.3f |", vs ? (line == 2 ? r->lbound : line ? r->lmm : r->jmm) : r->maxmean);
                }
                printf("\n");
            }
        }
    }
}

/* kvps-vshard's +10% sequences as a Markdown table, both rules */
static void print_markdown_grow(void) {
    printf("\nkvps-vshard, n -> m = n + n/10 one server at a time (moved: %% of all bytes)\n\n| rule | n -> m | max/mean at m "
           "| min/mean at m | worst max/mean, any step | moved, summed over the steps (ideal) | net moved, start to end "
           "(ideal) |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < nr; i++)
        if (!strcmp(R[i].kind, "grow10"))
            printf("| %s | %d -> %d | %.3f | %.3f | %.3f | %.2f (%.2f) | %.2f (%.2f) |\n", vs_find(R[i].scheme)->label, R[i].n,
                   R[i].n_end, R[i].maxmean, R[i].minmm, R[i].jmm, 100 * R[i].join, 100 * R[i].join_ideal, 100 * R[i].leave,
                   100 * R[i].leave_ideal);
}

/* the sweep as a Markdown table: P down the side, the schemes across */
static void print_markdown_sweep(const char *const *names, int nn) {
    int n = 0;
    for (int i = 0; i < nr && !n; i++) if (!strcmp(R[i].kind, "sweep")) n = R[i].n;
    printf("\nmax/mean bytes per server at n = %d by piece size P (floats; kvps-mod: min_slice = P)\n\n| P | fixed pieces |", n);
    for (int k = 0; k < nn; k++) printf(" %s |", names[k]);
    printf("\n|---:|---:|");
    for (int k = 0; k < nn; k++) printf("---:|");
    printf("\n");
    for (int i = 0; i < nr; i++) {
        if (strcmp(R[i].kind, "sweep") || strcmp(R[i].scheme, "hrw")) continue;
        printf("| %llu | %llu |", (unsigned long long)R[i].piece, (unsigned long long)R[i].pieces);
        for (int k = 0; k < nn; k++) {
            const row *r = find_row("sweep", names[k], R[i].piece, n);
            if (r) printf(" %.3f |", r->maxmean);
            else printf(" |");
        }
        printf("\n");
    }
}

/* One rule's changes recorded as kvps__reshard_plan records them (a placement: the server counts
   and each change's moves, or none for the rule by counts) must replay (kvps__vmap_of) into the
   maps the rule made: from v mod n over V shards with bytes vb, the leave of the last server, then
   n -> n + n/10 one server at a time, up to KVPS__PLACE_MAX server counts. Adds the differences
   to *bad; returns the number of values compared. */
static long check_vmap_rule(uint32_t V, int n, const uint64_t *vb, int counts, long *bad) {
    uint32_t *mb = (uint32_t *)xmalloc(V * sizeof *mb);
    long checked = 0;
    kvps__place pk; /* the changes, as a placement */
    memset(&pk, 0, sizeof pk);
    for (int step = -1, k = n; step < (n + 9) / 10 && (step < 0 || pk.count < KVPS__PLACE_MAX); step++) {
        int from = step < 0 ? n : k, to = step < 0 ? n - 1 : k + 1;
        if (step <= 0) {
            for (uint32_t v = 0; v < V; v++) mb[v] = v % (uint32_t)n;
            kvps__place_free(&pk);
            pk.V = V;
            pk.count = 1;
            pk.n[0] = (uint32_t)n;
        }
        uint64_t before = pk.nmv;
        if (counts ? kvps__vmap_change(mb, V, from, to) != 0 : kvps__vmap_plan(mb, V, from, to, vb, &pk.mv, &pk.nmv) != 0) {
            fprintf(stderr, "check: out of memory\n");
            exit(1);
        }
        pk.n[pk.count] = (uint32_t)to;
        pk.m[pk.count++] = (uint32_t)(pk.nmv - before);
        if (step >= 0) k++;
        const char *why;
        uint32_t *rv = kvps__vmap_of(&pk, &why);
        if (!rv) { fprintf(stderr, "check: kvps__vmap_of: %s\n", why); (*bad)++; continue; }
        for (uint32_t v = 0; v < V; v++, checked++) *bad += rv[v] != mb[v];
        free(rv);
    }
    kvps__place_free(&pk);
    free(mb);
    return checked;
}

/* every tensor registered with a real kvps worker at each n: its slices' count, lengths and
   servers must be kvps-mod's, every raw key's server too, and kvps-vshard's as above */
static int check_kvps(void) {
    void *ctx = zmq_ctx_new(); /* a worker holds 3 sockets a server: 1000 servers pass zmq's default 1023 */
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 8192);
    long bad = 0, checked = 0, nbytes = 0, by_counts = 0, by_bytes = 0; /* values compared */
    for (int a = 0; a < NNSET; a++) {
        int n = NSET[a];
        char *servers = (char *)xmalloc((size_t)n * 40);
        size_t at = 0;
        /* inproc endpoints nobody binds: no server answers (a tcp port could be another job's server),
           and the worker's first keyed call goes on after timeout_ms */
        for (int i = 0; i < n; i++) at += (size_t)sprintf(servers + at, "%sinproc://placement-check-%d", i ? "," : "", i);
        kvps_worker_desc d;
        memset(&d, 0, sizeof d);
        d.servers = servers;
        d.zmq_ctx = ctx;
        d.timeout_ms = 100;
        kvps_worker *w;
        long bad_n = bad;
        if (kvps_worker_create(&d, &w) != KVPS_OK) { fprintf(stderr, "check: no worker for %d servers\n", n); return 1; }
        for (int t = 0; t < nt; t++) {
            kvps_tensor id;
            if (kvps_worker_tensor(w, TS[t].name, TS[t].len, &id) != KVPS_OK) { fprintf(stderr, "check: %s refused\n", TS[t].name); return 1; }
            const kvps__tensor_info *ti = &w->tensors[id];
            uint64_t len = TS[t].len, ns = kvps_nslices(len, (uint64_t)n, KVPS_MIN_SLICE, KVPS_MAX_SLICE), first = TS[t].h % (uint64_t)n;
            bad += ti->nslices != ns;
            for (uint64_t i = 0; i < ns && i < ti->nslices; i++, checked++)
                bad += ti->server[i] != (int)((first + i) % (uint64_t)n) || ti->slen[i] != len * (i + 1) / ns - len * i / ns;
        }
        for (uint64_t k = 0; k < NRAW; k++, checked++) bad += kvps__server_of(w, k) != (int)(mix64(k) % (uint64_t)n);
        /* kvps-vshard: the worker's V, map and tensors' first virtual shards; each shard's bytes as
           kvps__reshard_plan adds them up (kvps__vshard_of of every key a server would list, its
           length x 4) against vshard_bytes'; then both rules' changes, recorded as a placement,
           replayed (check_vmap_rule) */
        uint32_t V = 256u * (uint32_t)n;
        bad += w->V != V;
        for (uint32_t v = 0; v < V && w->V == V; v++, checked++) bad += w->vmap[v] != v % (uint32_t)n;
        for (int t = 0; t < nt; t++, checked++) bad += w->tensors[t].hv != (uint32_t)(TS[t].h % V);
        double *vf = (double *)xmalloc(V * sizeof *vf);
        uint64_t *vb = (uint64_t *)xmalloc(V * sizeof *vb), *kb = (uint64_t *)xmalloc(V * sizeof *kb);
        vshard_floats(n, vf);
        vshard_bytes(vf, V, vb);
        memset(kb, 0, V * sizeof *kb);
        for (uint64_t k = 0; k < NRAW; k++) {
            uint32_t v;
            if (kvps__vshard_of(w, k, &v)) kb[v] += raw_len(k) * sizeof(float);
            else bad++;
        }
        for (int t = 0; t < nt; t++)
            for (uint32_t i = 0; i < w->tensors[t].nslices; i++) {
                uint32_t v;
                if (kvps__vshard_of(w, w->tensors[t].keys[i], &v)) kb[v] += w->tensors[t].slen[i] * sizeof(float);
                else bad++;
            }
        for (uint32_t v = 0; v < V; v++, nbytes++) bad += kb[v] != vb[v];
        by_counts += check_vmap_rule(V, n, vb, 1, &bad);
        by_bytes += check_vmap_rule(V, n, vb, 0, &bad);
        free(vf);
        free(vb);
        free(kb);
        kvps_worker_destroy(&w);
        free(servers);
        printf("kvps.h, %4d servers: %d tensors and %u raw keys placed as kvps-mod places them; V, each virtual shard's\n"
               "                     bytes, and kvps-vshard's leave and +10%% steps replayed from their records: %s\n",
               n, nt, NRAW, bad > bad_n ? "NO" : "yes");
    }
    zmq_ctx_term(ctx);
    printf("%ld values checked: %ld of kvps-mod's slices and keys and kvps-vshard's V, first map and first shards,\n"
           "%ld shards' bytes, %ld replays of the rule by counts, %ld of the planner's moves; %ld differ\n",
           checked + nbytes + by_counts + by_bytes, checked, nbytes, by_counts, by_bytes, bad);
    return bad != 0;
}


static int parse_list(const char *s, uint64_t *out, int max) {
    int k = 0;
    while (*s && k < max) {
        char *e;
        unsigned long long v = strtoull(s, &e, 10);
        if (e == s || v == 0 || v > (1ull << 30)) return -1;
        out[k++] = v;
        s = *e == ',' ? e + 1 : e;
        if (*e && *e != ',') return -1;
    }
    return k;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    const char *csv = "bench/results/placement.csv";
    uint64_t pieces[8] = {KVPS_MAX_SLICE, 16384, 1024};
    int npieces = 3, sweep_n = 1000, quick = 0, check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else if (!strcmp(argv[i], "--pieces") && i + 1 < argc) {
            if ((npieces = parse_list(argv[++i], pieces, 8)) <= 0) { fprintf(stderr, "--pieces: P1,P2,... floats\n"); return 2; }
        } else if (!strcmp(argv[i], "--sweep-n") && i + 1 < argc) {
            sweep_n = atoi(argv[++i]);
            if (sweep_n < 2 || sweep_n >= NMAXS) { fprintf(stderr, "--sweep-n: 2..%d\n", NMAXS - 1); return 2; }
        } else if (!strcmp(argv[i], "--quick")) quick = 1; /* n <= 300 and a shorter sweep */
        else if (!strcmp(argv[i], "--check-kvps")) check = 1;
        else {
            fprintf(stderr, "usage: %s [--csv FILE] [--pieces P1,P2,...] [--sweep-n N] [--quick] [--check-kvps]\n", argv[0]);
            return 2;
        }
    }
    double t0 = now_s();
    endpoints();
    printf("placement_sim (issue 18): workload\n");
    printf("  raw keys      %7u keys   lengths 1/1/16/64 floats by k mod 4 (20.5 floats a key)\n", NRAW);
    int bad = 0, t;
    t = nt; resnet50(); bad |= check_model("ResNet-50", t, 161, 25557032);
    t = nt; bert_base(); bad |= check_model("BERT-base", t, 199, 109482240);
    t = nt; gpt2_medium(); bad |= check_model("GPT-2 medium", t, 292, 354823168);
    t = nt; vgg16(); bad |= check_model("VGG-16", t, 32, 138357544);
    if (bad) return 1;
    if (check) return check_kvps();
    for (int i = 0; i < nt; i++)
        for (int j = 0; j < i; j++)
            if (TS[i].h == TS[j].h) { fprintf(stderr, "placement_sim: name hash collision %s / %s\n", TS[i].name, TS[j].name); return 1; }
    uint64_t tf = 0;
    for (int i = 0; i < nt; i++) tf += TS[i].len;
    double rawf = 0;
    for (uint64_t k = 0; k < NRAW; k++) rawf += raw_len(k);
    printf("  all tensors   %4d tensors %12llu floats; with the raw keys %.1f M floats = %.2f GB\n\n", nt,
           (unsigned long long)tf, (tf + rawf) / 1e6, (tf + rawf) * 4 / 1e9);

    double *load = (double *)xmalloc(NMAXS * sizeof *load);
    lists *L = (lists *)xmalloc(sizeof *L);
    int nmax = quick ? 300 : 1000;

    /* 1. kvps today */
    int r0 = nr;
    for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) {
        make_lists(L, NSET[a]);
        int n = NSET[a];
        uint64_t slices;
        kvps_loads(L->base, n, KVPS_MIN_SLICE, KVPS_MAX_SLICE, load, &slices);
        double mm = max_over_mean(load, L->base, n), tot = tf + rawf;
        double jm = kvps_moved(L->base, n, L->join, n + 1) / tot, lm = kvps_moved(L->base, n, L->leave, n - 1) / tot;
        add_row("table", "kvps-mod", 0, slices, n, mm, jm, lm);
    }
    printf("kvps today (mod n; tensors cut by n: min_slice 1024, max_slice 262144 floats)\n");
    print_table(r0, nr);

    /* 1b. kvps-vshard: kvps.h's RESHARD on a job begun at n0 = n, each change by the rule by
       counts (before) and planned by bytes (kvps__vmap_plan, now) */
    vres *VR = (vres *)xmalloc(NNSET * sizeof *VR);
    for (int sc = 0; sc < NVS; sc++) {
        printf("\n%s (%s): V = 256 n0 virtual shards, vmap[v] = v mod n0 at first; tensors keep the\n"
               "slices cut for n0 = n; the join appends server n, the LEAVE REMOVES THE LAST server, n-1; max/mean after;\n"
               "'shards' = max/mean of the virtual-shard counts; new/mean = the newcomer's bytes / the mean;\n"
               "newcomer's shards: how many, in which range of 0..V-1; bound: the least max/mean of any leave that deals\n"
               "the last server's whole shards and keeps the others')\n",
               VS[sc].label, VS[sc].counts ? "kvps.h's RESHARD before: kvps__vmap_change" : "kvps.h's RESHARD: kvps__vmap_plan");
        printf("%5s %7s %7s %8s | %7s %9s %9s %9s %6s %21s | %7s %9s %6s %9s %6s\n", "n", "V", "slices", "before", "shards",
               "join m/m", "new/mean", "moved", "ideal", "newcomer's shards", "shards", "leave m/m", "bound", "moved",
               "ideal");
        int nv = 0;
        for (int a = 0; a < NNSET && NSET[a] <= nmax; a++, nv++) {
            int n = NSET[a];
            make_lists(L, n);
            kvps_loads(L->base, n, KVPS_MIN_SLICE, KVPS_MAX_SLICE, load, NULL);
            if (run_vshard(n, load, tf + rawf, VS[sc].counts, &VR[a])) return 1;
            const vres *o = &VR[a];
            add_row("table", VS[sc].scheme, 0, o->slices, n, o->mm0, o->jmoved, o->lmoved);
            R[nr - 1].jmm = o->jmm;
            R[nr - 1].lmm = o->lmm;
            R[nr - 1].lbound = o->lbound;
            char rng[48];
            snprintf(rng, sizeof rng, "%u in %u..%u", o->jcnt, o->jlo, o->jhi);
            printf("%5d %7d %7llu %8.3f | %7.3f %9.3f %9.3f %8.3f%% %5.2f%% %21s | %7.3f %9.3f %6.3f %8.3f%% %5.2f%%\n", n,
                   256 * n, (unsigned long long)o->slices, o->mm0, o->jcmm, o->jmm, o->jnew, 100 * o->jmoved, 100.0 / (n + 1),
                   rng, o->lcmm, o->lmm, o->lbound, 100 * o->lmoved, 100.0 / n);
            fflush(stdout);
        }
        printf("\n%s, n -> n + n/10 one server at a time (one reshard each): max/mean at the end and at the worst\n"
               "step; bytes moved summed over the steps (ideal: sum of 1/(k+1)) and net, start to end (ideal: 1 - n/m)\n",
               VS[sc].label);
        printf("%5s %5s %8s %8s %8s %8s | %9s %6s | %7s %6s\n", "n", "m", "shards", "end m/m", "min/mean", "worst", "summed",
               "ideal", "net", "ideal");
        for (int a = 0; a < nv; a++) {
            const vres *o = &VR[a];
            add_row("grow10", VS[sc].scheme, 0, o->slices, o->n, o->gmm, o->gsum, o->gnet);
            row *r = &R[nr - 1];
            r->jmm = o->gworst;
            r->minmm = o->gmin;
            r->n_end = o->m;
            r->join_ideal = o->gsum_ideal;
            r->leave_ideal = 1.0 - (double)o->n / o->m;
            printf("%5d %5d %8.3f %8.3f %8.3f %8.3f | %8.2f%% %5.2f%% | %6.2f%% %5.2f%%\n", o->n, o->m, o->gcmm, o->gmm,
                   o->gmin, o->gworst, 100 * o->gsum, 100 * r->join_ideal, 100 * o->gnet, 100 * r->leave_ideal);
        }
    }
    free(VR);

    /* 2-4. fixed pieces */
    size_t maxitems = 0;
    uint64_t minp = 256;
    for (int p = 0; p < npieces; p++) if (pieces[p] < minp) minp = pieces[p];
    for (int i = 0; i < nt; i++) maxitems += (size_t)((TS[i].len + minp - 1) / minp);
    maxitems += NRAW;
    ringbuf B;
    B.o0 = (int *)xmalloc(maxitems * sizeof(int));
    B.o1 = (int *)xmalloc(maxitems * sizeof(int));
    B.o2 = (int *)xmalloc(maxitems * sizeof(int));
    B.start = (uint32_t *)xmalloc(maxitems * sizeof(uint32_t));
    B.vj = (vnode *)xmalloc((size_t)NMAXS * 1000 * sizeof(vnode));
    B.vb = (vnode *)xmalloc((size_t)NMAXS * 1000 * sizeof(vnode));
    B.vl = (vnode *)xmalloc((size_t)NMAXS * 1000 * sizeof(vnode));
    B.tload = (double *)xmalloc(NMAXS * sizeof(double));
    uint64_t *best = (uint64_t *)xmalloc(maxitems * sizeof *best);
    for (int p = 0; p < npieces; p++) {
        itemset S;
        make_items(&S, pieces[p]);
        r0 = nr;
        for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) {
            make_lists(L, NSET[a]);
            run_hrw(&S, L, B.o0, best, load, "table");
        }
        for (int k = 0; k < NRS; k++)
            for (int a = 0; a < NNSET && NSET[a] <= nmax; a++) {
                make_lists(L, NSET[a]);
                run_ring(&S, L, RS[k].V, RS[k].eps, &B, load, 1, "table", RS[k].name);
            }
        printf("\nfixed pieces of at most %llu floats (%.0f KiB): %zu tensor pieces + %u raw keys\n",
               (unsigned long long)pieces[p], pieces[p] * 4 / 1024.0, S.npieces, NRAW);
        print_table(r0, nr);
        free_items(&S);
        fflush(stdout);
    }

    /* sweep: max/mean at n = sweep_n for P = 2^18 .. 2^8 (kvps-mod: min_slice = P) */
    make_lists(L, sweep_n);
    int n = sweep_n;
    const char *names[2 + NRS];
    names[0] = "kvps-mod"; names[1] = "hrw";
    for (int k = 0; k < NRS; k++) names[2 + k] = RS[k].name;
    uint64_t need[2 + NRS] = {0};
    printf("\nmax/mean bytes per server at n = %d by piece size P (floats; kvps-mod: min_slice = P, max_slice = max(P, 262144))\n",
           n);
    printf("%7s %9s", "P", "pieces");
    for (int k = 0; k < 2 + NRS; k++) printf(" %12s", names[k]);
    printf("\n");
    int pmin = quick ? 12 : 8;
    for (int lg = 18; lg >= pmin; lg--) {
        uint64_t P = 1ull << lg, slices;
        double mm[2 + NRS];
        kvps_loads(L->base, n, P, P > KVPS_MAX_SLICE ? P : KVPS_MAX_SLICE, load, &slices);
        mm[0] = max_over_mean(load, L->base, n);
        add_row("sweep", "kvps-mod", P, slices, n, mm[0], NAN, NAN);
        itemset S;
        make_items(&S, P);
        hrw_place(&S, L->base, n, B.o0, NULL);
        for (int i = 0; i < n; i++) load[L->base[i]] = 0;
        for (size_t i = 0; i < S.n; i++) load[B.o0[i]] += S.v[i].len;
        mm[1] = max_over_mean(load, L->base, n);
        add_row("sweep", "hrw", P, S.npieces, n, mm[1], NAN, NAN);
        for (int k = 0; k < NRS; k++) mm[2 + k] = run_ring(&S, L, RS[k].V, RS[k].eps, &B, load, 0, "sweep", RS[k].name);
        printf("%7llu %9zu", (unsigned long long)P, S.npieces);
        for (int k = 0; k < 2 + NRS; k++) {
            printf(" %12.3f", mm[k]);
            if (mm[k] <= 1.1 && !need[k]) need[k] = P;
        }
        printf("\n");
        fflush(stdout);
        free_items(&S);
    }
    printf("\nlargest P (a power of two) with max/mean <= 1.1 at n = %d:\n", n);
    for (int k = 0; k < 2 + NRS; k++) {
        if (!need[k]) { printf("  %-13s none down to %d floats\n", names[k], 1 << pmin); continue; }
        uint64_t np = 0;
        if (k == 0) {
            kvps_loads(L->base, n, need[k], need[k] > KVPS_MAX_SLICE ? need[k] : KVPS_MAX_SLICE, load, &np);
            printf("  %-13s min_slice %llu floats (%llu B): %llu slices at n = %d\n", names[k], (unsigned long long)need[k],
                   (unsigned long long)need[k] * 4, (unsigned long long)np, n);
        } else {
            for (int i = 0; i < nt; i++) np += (TS[i].len + need[k] - 1) / need[k];
            uint64_t fc6 = (102760448 + need[k] - 1) / need[k];
            printf("  %-13s %llu floats (%llu B): %llu pieces, %.0f a server; VGG-16 fc6 alone %llu pieces%s\n", names[k],
                   (unsigned long long)need[k], (unsigned long long)need[k] * 4, (unsigned long long)np,
                   (double)np / n, (unsigned long long)fc6, fc6 > 65536 ? " (over kvps's 16-bit slice index)" : "");
        }
    }

    print_markdown(nmax);
    print_markdown_grow();
    print_markdown_sweep(names, 2 + NRS);

    FILE *f = fopen(csv, "w");
    if (!f) { perror(csv); return 1; }
    fprintf(f, "kind,scheme,piece_floats,n,pieces,max_mean,join_moved,join_ideal,leave_moved,leave_ideal,join_max_mean,"
               "leave_max_mean,n_end,min_mean,leave_bound\n");
    for (int i = 0; i < nr; i++) {
        const row *r = &R[i];
        fprintf(f, "%s,%s,%llu,%d,%llu,%.4f,", r->kind, r->scheme, (unsigned long long)r->piece, r->n,
                (unsigned long long)r->pieces, r->maxmean);
        if (isnan(r->join)) fprintf(f, ",,,,");
        else fprintf(f, "%.5f,%.5f,%.5f,%.5f,", r->join, r->join_ideal, r->leave, r->leave_ideal);
        if (isnan(r->jmm)) fprintf(f, ",");
        else fprintf(f, "%.4f,", r->jmm);
        if (isnan(r->lmm)) fprintf(f, ",");
        else fprintf(f, "%.4f,", r->lmm);
        if (r->n_end) fprintf(f, "%d,", r->n_end);
        else fprintf(f, ",");
        if (isnan(r->minmm)) fprintf(f, ",");
        else fprintf(f, "%.4f,", r->minmm);
        if (isnan(r->lbound)) fprintf(f, "\n");
        else fprintf(f, "%.4f\n", r->lbound);
    }
    fclose(f);
    printf("\nwrote %s (%d rows); %.1f s CPU\n", csv, nr, now_s() - t0);
    free(load); free(L); free(best);
    free(B.o0); free(B.o1); free(B.o2); free(B.start); free(B.vj); free(B.vb); free(B.vl); free(B.tload);
    free(TS); free(R);
    return 0;
}
