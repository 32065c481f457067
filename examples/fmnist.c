/* fmnist.c - distributed training on Fashion-MNIST with kvps: servers hold the weights, workers
   push gradients and pull weights back (or, in allreduce mode, workers all-reduce gradients
   among themselves with kvps_ring.h and no server).

   What it shows: a whole kvps job. The parameters of a softmax regression (784x10 + 10) or of a
   one-hidden-layer MLP (784 -> H ReLU -> 10) are kvps tensors ("fc1.w", "fc1.b", "fc2.w",
   "fc2.b"). Worker 0 writes the initial weights (kvps_worker_init_tensor), everyone meets at a
   barrier and pulls them; then each step every worker computes the mean gradient of its share of
   the global batch (worker r takes positions r, r+M, ... of each shuffled batch). The workers
   apply a cosine learning-rate decay by scaling their gradients. --mode picks how they combine:
     bsp        every step pushpulls every tensor at once; the servers apply plain SGD
                (KVPS_UPDATE_SGD) to the sum of all M gradients, in rank order: deterministic
     ssp:K      the same rounds, but a worker's pull waits only for round t - K (KVPS_SSP): a
                worker runs at most K steps ahead of the slowest
     async      each push is applied on arrival (lr / M per push); pulls never wait
     easgd      elastic averaging: each worker trains its own copy with local SGD and every
                --tau steps exchanges alpha * (local - centre) with the centre on the servers
                (kvps_worker_easgd; the servers accumulate, KVPS_RULE_ACCUMULATE, async); the
                centre is the model evaluated
     allreduce  no server: the workers are the ranks of a kvps_ring, each step all-reduces the
                gradients (ring algorithm) and applies the same step locally (--optim: sgd, the
                servers' arithmetic, or momentum or adam); every rank holds the same weights and
                the whole optimizer state
     fsdp       fully sharded data parallel, no server: each rank holds 1/M of every layer's
                parameters (the layer's weights and biases as one vector, zero-padded to a
                multiple of M) and 1/M of their optimizer state (--optim, adam by default). Layer
                by layer: all-gather it (kvps_ring_allgather) before its forward pass and free it,
                again before its backward pass where its input's gradient is needed, reduce-
                scatter its gradient (kvps_ring_reduce_scatter); each rank updates its block with
                the same arithmetic as allreduce mode. Test accuracy is computed by every rank on
                its slice of the test set. Prints each rank's persistent bytes for parameters and
                optimizer state next to peak RSS (`fmnist: memory per rank: ...`; allreduce mode
                prints the same line)
   --codec compresses what goes on the wire: pushes to the servers (with error feedback per
   --ef), or in allreduce mode fp16/bf16 on the wire (kvps_ring_allreduce_wire) or top-k
   (kvps_ring_allreduce_topk, with error feedback per --ef).

   usage: fmnist [--model softmax|mlp] [--servers N] [--workers M] [--epochs E] [--batch B]
                 [--lr LR] [--hidden H] [--mode bsp|ssp:K|async|easgd|allreduce|fsdp] [--seed S]
                 [--data DIR] [--codec none|fp16|bf16|topk:FRACTION|sign] [--ef 1|0]
                 [--tau T] [--alpha A] [--decay cosine|none] [--target ACC] [--check]
                 [--timeout SECONDS] [--kill-primary-at ROUND] [--optim sgd|momentum|adam]

   Two ways to run it:
   - Standalone (default): the program forks N servers bound to tcp://127.0.0.1:* (each reports
     its port through a pipe), then M workers, and waits for them all (the servers leave once
     the workers have finished; a server still there 10 s later is stopped, and said so). Only
     worker 0 prints. In allreduce mode it forks M ranks, each bound to tcp://127.0.0.1:*; the
     parent collects their endpoints through pipes and hands every rank the list.
   - Under a launcher, one process per role, when KVPS_ROLE, KVPS_SERVERS, KVPS_RANK,
     KVPS_RING_PEERS or an MPI rank variable is set (see kvps_env_read in kvps.h), e.g.
     `scripts/kvps-run -s 2 -w 4 -- ./fmnist --model mlp`, or by hand for 2 servers and 4 workers:
         export KVPS_SERVERS=tcp://10.0.0.1:5555,tcp://10.0.0.2:5555 KVPS_NUM_WORKERS=4
         KVPS_ROLE=server KVPS_RANK=0 ./fmnist --model mlp      # on 10.0.0.1
         KVPS_ROLE=worker KVPS_RANK=3 ./fmnist --model mlp      # ... and so on
     or `mpirun -n 6 -x KVPS_SERVERS -x KVPS_NUM_WORKERS ./fmnist` (ranks 0..N-1 serve). Every
     process must get the same options. A server leaves by itself once every worker has
     finished (kvps_worker_finish: its kvps_server_run returns), or on SIGINT/SIGTERM.
     allreduce and fsdp modes read the ring from KVPS_RANK / KVPS_SIZE / KVPS_RING_PEERS (or the
     MPI and Slurm rank and size; kvps_ring_env_read): `kvps-run -s 0 -w 4 -- ./fmnist --mode allreduce`,
     or mpirun with -x KVPS_RING_PEERS=tcp://h1:7000,tcp://h2:7000,... (one per rank).
     Replicated shards: `kvps-run -s 2 --replicas 2 -w 4 -- ./fmnist` (KVPS_SERVERS entries list
     a shard's chain joined by '|'): each server is given its shard's chain, its place in it and
     whether it replaces a lost replica (kvps_env .replicas, .replica, .replacement; kvps.h,
     REPLICAS); the workers take KVPS_SERVERS as it is.

   Under BSP the run is deterministic: every worker pulls the same weights, and the servers sum
   the contributions in rank order. --check replays the same shards in one process and compares
   the final weights bit for bit (BSP only). A BSP run (--mode bsp, or ssp:0) ends with worker 0
   printing `final weights crc32 XXXXXXXX`: zlib's crc32 of the final weights the servers hold
   (pulled after the last step), every float of fc1.w, fc1.b (MLP: then fc2.w, fc2.b) in order, as
   the bytes in memory (little-endian on x86 and arm64). Runs that differ only in how they are
   launched (standalone, kvps-run, mpirun, replicas, a failover) must print the same line.
   allreduce and fsdp runs without a codec print the line too (every rank's weights, the ring's
   sums in a fixed order); with 2 workers the two modes print the same crc32 (a sum of two floats
   is the same in either order, and fsdp's update is allreduce's on a block), with more they differ
   in the last bits of the sums.

   Test hook: --kill-primary-at ROUND (give it to every process): the server of shard 0,
   replica 0, not started as a replacement, serves from a background thread and raises SIGKILL
   on itself once it has applied ROUND rounds (kvps_server_stats.rounds: one per slice of each
   tensor it holds, per step); every other process ignores it. With kvps-run --replicas 2 the
   job must carry on through the failover and end as it would have.

   Data: the gzip'd idx files of Debian's dataset-fashion-mnist package
   (/usr/share/datasets/fashion-mnist, or --data DIR).

   Exit codes: 0 done, 1 a process failed or timed out, 2 bad usage or data, 3 test accuracy
   below --target, 4 --check found a difference, 128 + n after signal n (standalone parent). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"      /* the parameter server (kvps_ring.h no longer includes it) */
#include "kvps_ring.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "examples/launch.h"
#include "examples/fmnist_data.h"
#include "examples/mlp.h"

#define MAX_TENSORS 4
#define WAIT_MS 60000       /* one step or barrier; a step takes milliseconds */
#define END_WAIT_MS 600000  /* async: the final barrier waits for the slowest worker */

/* ---------------------------------------------------------------------------------------------
   Options */
typedef enum sync_mode { MODE_BSP, MODE_SSP, MODE_ASYNC, MODE_EASGD, MODE_ALLREDUCE, MODE_FSDP } sync_mode;

typedef struct opts {
    int mlp;         /* 0 softmax regression, 1 MLP */
    int servers, workers, epochs, batch, hidden;
    float lr;
    sync_mode mode;
    int staleness;   /* ssp:K */
    int tau;         /* easgd: local steps between exchanges */
    float alpha;     /* easgd: elastic coefficient; 0 = 0.9 / workers */
    uint64_t seed;
    const char *data;
    double target;   /* 0 = none */
    int check;
    int decay;       /* 1 cosine, 0 none */
    int timeout_s;
    int set_servers, set_workers;
    kvps_codec_id codec; /* gradient compression on the pushes */
    double topk_frac;
    int ef;              /* error feedback for lossy codecs */
    uint64_t kill_at;    /* --kill-primary-at: 0, or the rounds after which shard 0's first primary SIGKILLs itself */
    int optim;           /* optim_rule (mlp.h): allreduce and fsdp; -1 until resolved (fsdp: adam, else sgd) */
    int set_lr;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: fmnist [--model softmax|mlp] [--servers N] [--workers M] [--epochs E] [--batch B]\n"
            "              [--lr LR] [--hidden H] [--mode bsp|ssp:K|async|easgd|allreduce|fsdp] [--seed S]\n"
            "              [--data DIR] [--codec none|fp16|bf16|topk:FRACTION|sign] [--ef 1|0]\n"
            "              [--tau T] [--alpha A] [--decay cosine|none] [--target ACC] [--check]\n"
            "              [--timeout SECONDS] [--kill-primary-at ROUND] [--optim sgd|momentum|adam]\n"
            "defaults: --model mlp --servers 2 --workers 4 --epochs 15 --batch 128 --lr 0.3 --hidden 128\n"
            "          --mode bsp --seed 1 --data " DATA_DIR " --codec none --ef 1 --decay cosine\n"
            "          --tau 4 --alpha 0.9/workers (easgd) --timeout 900\n"
            "          --optim sgd (fsdp: adam); lr without --lr: sgd 0.3, momentum 0.03, adam 0.001\n"
            "--optim   the update rule each rank applies in allreduce and fsdp modes (the servers apply sgd in the\n"
            "          others); momentum and adam follow the cosine decay through their lr, sgd through its gradients.\n"
            "--mode fsdp  fully sharded data parallel: each rank holds 1/workers of every layer's parameters and\n"
            "          optimizer state, all-gathers a layer before using it and reduce-scatters its gradient.\n"
            "A BSP run (bsp, ssp:0) ends with worker 0 printing 'final weights crc32 XXXXXXXX' (zlib's crc32 of\n"
            "the final weights on the servers: fc1.w, fc1.b and, for the MLP, fc2.w, fc2.b).\n"
            "--kill-primary-at ROUND  a test hook for replicated shards (kvps-run -s 2 --replicas 2 -w 4 -- fmnist\n"
            "          ... --kill-primary-at ROUND): the server of shard 0, replica 0, not started as a replacement\n"
            "          (KVPS_REPLACEMENT), serves from a background thread and raises SIGKILL on itself once it\n"
            "          has applied ROUND rounds (kvps_server_stats.rounds: one per slice of each tensor it\n"
            "          holds, per step); every other process ignores it. Give it to every process.\n");
}

/* Returns 0, or 2 after printing what is wrong. Takes "--opt value" and "--opt=value". */
static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){.mlp = 1, .servers = 2, .workers = 4, .epochs = 15, .batch = 128, .hidden = 128,
                .lr = 0.3f, .seed = 1, .data = DATA_DIR, .decay = 1, .timeout_s = 900, .ef = 1, .tau = 4,
                .optim = -1};
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *arg = argv[i], *val = NULL;
        if (launch_opt(arg, name, sizeof name, &val) != 0) {
            fprintf(stderr, "fmnist: unknown argument '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        if (strcmp(name, "--help") == 0 || strcmp(name, "--check") == 0) {
            if (val) { fprintf(stderr, "fmnist: %s takes no value\n", name); return 2; }
            if (name[2] == 'h') { usage(stdout); exit(0); }
            o->check = 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) { fprintf(stderr, "fmnist: %s needs a value\n", name); return 2; }
            val = argv[++i];
        }
        long l = 0;
        double d = 0;
        int bad = 0;
        if (strcmp(name, "--model") == 0) {
            if (strcmp(val, "softmax") == 0) o->mlp = 0;
            else if (strcmp(val, "mlp") == 0) o->mlp = 1;
            else bad = 1;
        } else if (strcmp(name, "--codec") == 0) {
            if (strcmp(val, "none") == 0) o->codec = KVPS_CODEC_NONE;
            else if (strcmp(val, "fp16") == 0) o->codec = KVPS_CODEC_FP16;
            else if (strcmp(val, "bf16") == 0) o->codec = KVPS_CODEC_BF16;
            else if (strcmp(val, "sign") == 0) o->codec = KVPS_CODEC_SIGN;
            else if (strncmp(val, "topk:", 5) == 0 && (o->topk_frac = atof(val + 5)) > 0 && o->topk_frac <= 1)
                o->codec = KVPS_CODEC_TOPK;
            else bad = 1;
        } else if (strcmp(name, "--ef") == 0) {
            if (strcmp(val, "1") == 0) o->ef = 1;
            else if (strcmp(val, "0") == 0) o->ef = 0;
            else bad = 1;
        } else if (strcmp(name, "--decay") == 0) {
            if (strcmp(val, "cosine") == 0) o->decay = 1;
            else if (strcmp(val, "none") == 0) o->decay = 0;
            else bad = 1;
        } else if (strcmp(name, "--mode") == 0) {
            if (strcmp(val, "bsp") == 0) o->mode = MODE_BSP;
            else if (strcmp(val, "async") == 0) o->mode = MODE_ASYNC;
            else if (strcmp(val, "easgd") == 0) o->mode = MODE_EASGD;
            else if (strcmp(val, "allreduce") == 0) o->mode = MODE_ALLREDUCE;
            else if (strcmp(val, "fsdp") == 0) o->mode = MODE_FSDP;
            else if (strncmp(val, "ssp:", 4) == 0 && parse_long(val + 4, 0, 1000, &l) == 0) {
                o->mode = MODE_SSP;
                o->staleness = (int)l;
            } else bad = 1;
        } else if (strcmp(name, "--optim") == 0) {
            bad = (o->optim = optim_parse(val)) < 0;
        } else if (strcmp(name, "--tau") == 0) {
            bad = parse_long(val, 1, 100000, &l);
            o->tau = (int)l;
        } else if (strcmp(name, "--alpha") == 0) {
            bad = parse_double(val, 1e-6, 0.999999, &d);
            o->alpha = (float)d;
        } else if (strcmp(name, "--servers") == 0) {
            bad = parse_long(val, 1, 64, &l);
            o->servers = (int)l;
            o->set_servers = 1;
        } else if (strcmp(name, "--workers") == 0) {
            bad = parse_long(val, 1, 64, &l);
            o->workers = (int)l;
            o->set_workers = 1;
        } else if (strcmp(name, "--epochs") == 0) {
            bad = parse_long(val, 1, 1000, &l);
            o->epochs = (int)l;
        } else if (strcmp(name, "--batch") == 0) {
            bad = parse_long(val, 1, 60000, &l);
            o->batch = (int)l;
        } else if (strcmp(name, "--hidden") == 0) {
            bad = parse_long(val, 1, 8192, &l);
            o->hidden = (int)l;
        } else if (strcmp(name, "--seed") == 0) {
            bad = parse_long(val, 0, 2147483647L, &l);
            o->seed = (uint64_t)l;
        } else if (strcmp(name, "--timeout") == 0) {
            bad = parse_long(val, 1, 86400, &l);
            o->timeout_s = (int)l;
        } else if (strcmp(name, "--lr") == 0) {
            bad = parse_double(val, 1e-6, 100.0, &d);
            o->lr = (float)d;
            o->set_lr = 1;
        } else if (strcmp(name, "--target") == 0) {
            bad = parse_double(val, 0.0, 1.0, &d);
            o->target = d;
        } else if (strcmp(name, "--data") == 0) {
            o->data = val;
        } else if (strcmp(name, "--kill-primary-at") == 0) {
            bad = parse_long(val, 1, 2147483647L, &l);
            o->kill_at = (uint64_t)l;
        } else {
            fprintf(stderr, "fmnist: unknown option '%s'\n", name);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "fmnist: bad value '%s' for %s\n", val, name);
            usage(stderr);
            return 2;
        }
    }
    if (o->optim < 0) o->optim = o->mode == MODE_FSDP ? OPTIM_ADAM : OPTIM_SGD;
    if (!o->set_lr) o->lr = optim_rules[o->optim].lr;
    return 0;
}

/* allreduce and fsdp: ranks of a kvps_ring, no server. */
static int ring_mode(const opts *o) { return o->mode == MODE_ALLREDUCE || o->mode == MODE_FSDP; }

/* Checked after the launcher's environment has fixed the worker count. */
static int check_opts(const opts *o) {
    if (o->batch < o->workers) {
        fprintf(stderr, "fmnist: --batch %d is the global batch; it must be at least --workers %d\n",
                o->batch, o->workers);
        return 2;
    }
    if (o->check && o->mode != MODE_BSP) {
        fprintf(stderr, "fmnist: --check compares against a sequential replay, which only BSP matches\n");
        return 2;
    }
    if (!ring_mode(o) && o->optim != OPTIM_SGD) {
        fprintf(stderr, "fmnist: --optim %s is for --mode allreduce and fsdp (the servers apply sgd)\n",
                optim_rules[o->optim].name);
        return 2;
    }
    if (o->mode == MODE_FSDP && o->codec != KVPS_CODEC_NONE) {
        fprintf(stderr, "fmnist: --mode fsdp takes --codec none\n");
        return 2;
    }
    if (o->mode == MODE_ALLREDUCE && o->codec == KVPS_CODEC_SIGN) {
        fprintf(stderr, "fmnist: --mode allreduce takes --codec none, fp16, bf16 or topk:F (no 1-bit sign all-reduce)\n");
        return 2;
    }
    return 0;
}

static const char *mode_name(const opts *o, char *buf, size_t cap) {
    static const char *names[] = {"bsp", "ssp", "async", "easgd", "allreduce", "fsdp"};
    if (o->mode == MODE_SSP) snprintf(buf, cap, "ssp:%d", o->staleness);
    else snprintf(buf, cap, "%s", names[o->mode]);
    return buf;
}

/* EASGD's alpha: 0.9 / workers by default (the paper's beta = alpha * workers = 0.9). */
static float easgd_alpha(const opts *o) { return o->alpha > 0 ? o->alpha : 0.9f / (float)o->workers; }

/* ---------------------------------------------------------------------------------------------
   Model: layers l = 0..nl-1, weights t[2l] (dim[l] x dim[l+1], row k = input k) and biases
   t[2l+1]. Activations act[0] = input, act[nl] = logits; ReLU between layers. */
typedef struct net {
    int nl;
    int dim[3];
    int nt;                    /* tensors: 2 * nl */
    size_t len[MAX_TENSORS];   /* floats per tensor */
    char name[MAX_TENSORS][16];
} net;

typedef struct scratch {
    float *act[3], *del[3];    /* activations and their gradients for one sample */
} scratch;

static float pix_scale[256];   /* pixel value -> [0, 1] */

static void net_setup(net *n, const opts *o) {
    memset(n, 0, sizeof *n);
    n->nl = o->mlp ? 2 : 1;
    n->dim[0] = NPIX;
    if (o->mlp) n->dim[1] = o->hidden;
    n->dim[n->nl] = NCLASS;
    n->nt = 2 * n->nl;
    for (int l = 0; l < n->nl; l++) {
        n->len[2 * l] = (size_t)n->dim[l] * (size_t)n->dim[l + 1];
        n->len[2 * l + 1] = (size_t)n->dim[l + 1];
        snprintf(n->name[2 * l], sizeof n->name[0], "fc%d.w", l + 1);
        snprintf(n->name[2 * l + 1], sizeof n->name[0], "fc%d.b", l + 1);
    }
    for (int v = 0; v < 256; v++) pix_scale[v] = (float)v / 255.0f;
}

static size_t net_params(const net *n) {
    size_t s = 0;
    for (int i = 0; i < n->nt; i++) s += n->len[i];
    return s;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "fmnist: out of memory\n");
        fflush(NULL);
        _exit(1); /* no atexit work while ZeroMQ threads may run */
    }
    return p;
}

static void tensors_alloc(const net *n, float **t) {
    for (int i = 0; i < n->nt; i++) t[i] = (float *)xcalloc(n->len[i], sizeof(float));
}

static void tensors_free(const net *n, float **t) {
    for (int i = 0; i < n->nt; i++) free(t[i]);
}

static void scratch_alloc(const net *n, scratch *s) {
    memset(s, 0, sizeof *s);
    for (int l = 0; l <= n->nl; l++) {
        s->act[l] = (float *)xcalloc((size_t)n->dim[l], sizeof(float));
        s->del[l] = (float *)xcalloc((size_t)n->dim[l], sizeof(float));
    }
}

static void scratch_free(const net *n, scratch *s) {
    for (int l = 0; l <= n->nl; l++) { free(s->act[l]); free(s->del[l]); }
}

/* He init for the ReLU layer, Xavier for the layer feeding the softmax; biases zero. Layer l's
   weights w and biases b from the stream st, which goes on to layer l + 1 (fsdp mode draws one
   layer at a time and keeps its shard). */
static uint64_t net_init_stream(uint64_t seed) { return seed * 0x2545F4914F6CDD1Dull + 1; }

static void net_init_layer(const net *n, int l, float *w, float *b, uint64_t *st) {
    double fan_in = n->dim[l], fan_out = n->dim[l + 1];
    double sd = l + 1 < n->nl ? sqrt(2.0 / fan_in) : sqrt(2.0 / (fan_in + fan_out));
    for (size_t i = 0; i < n->len[2 * l]; i++) w[i] = (float)(sd * rng_normal(st));
    memset(b, 0, n->len[2 * l + 1] * sizeof(float));
}

static void net_init(const net *n, float **t, uint64_t seed) {
    uint64_t st = net_init_stream(seed);
    for (int l = 0; l < n->nl; l++) net_init_layer(n, l, t[2 * l], t[2 * l + 1], &st);
}

static void net_forward(const net *n, float *const *t, scratch *s) {
    for (int l = 0; l < n->nl; l++)
        dense_forward(t[2 * l], t[2 * l + 1], n->dim[l], n->dim[l + 1], s->act[l], s->act[l + 1], 1, l + 1 < n->nl);
}

static void load_input(float *a, const uint8_t *px) {
    for (int k = 0; k < NPIX; k++) a[k] = pix_scale[px[k]];
}

/* Forward and backward for one sample; adds its gradient to g. Returns its cross-entropy. */
static float sample_grad(const net *n, float *const *t, float *const *g, scratch *s, const uint8_t *px,
                         int label, int *correct) {
    load_input(s->act[0], px);
    net_forward(n, t, s);
    int nl = n->nl;
    float loss = softmax_xent(s->act[nl], NCLASS, label, s->del[nl], correct); /* del: softmax - onehot */
    for (int l = nl - 1; l >= 0; l--)
        dense_backward(t[2 * l], n->dim[l], n->dim[l + 1], s->act[l], s->del[l + 1], 1, g[2 * l], g[2 * l + 1],
                       l > 0 ? s->del[l] : NULL);
    return loss;
}

/* Worker r's share of global batch `batch` (indices into the training set): positions r, r+m, ...
   Its gradient sum is multiplied by `scale` (see grad_scale). */
typedef struct step_stats { double loss; int correct, seen; } step_stats;

static void shard_grad(const net *n, float *const *t, float *const *g, scratch *s, const dataset *d,
                       const int *batch, int bsize, int r, int m, float scale, step_stats *st) {
    for (int i = 0; i < n->nt; i++) memset(g[i], 0, n->len[i] * sizeof(float));
    for (int j = r; j < bsize; j += m) {
        int idx = batch[j];
        st->loss += sample_grad(n, t, g, s, d->x + (size_t)idx * NPIX, d->y[idx], &st->correct);
        st->seen++;
    }
    for (int i = 0; i < n->nt; i++)
        for (size_t k = 0; k < n->len[i]; k++) g[i][k] *= scale;
}

static double evaluate(const net *n, float *const *t, scratch *s, const dataset *d) {
    int correct = 0;
    for (int i = 0; i < d->n; i++) {
        load_input(s->act[0], d->x + (size_t)i * NPIX);
        net_forward(n, t, s);
        correct += argmax(s->act[n->nl], NCLASS) == d->y[i];
    }
    return (double)correct / (double)d->n;
}

/* The servers' lr is fixed, so workers follow the learning-rate schedule by scaling their
   gradients: cosine decay from 1 to 0 over all steps (--decay none: constant). The factor m / B
   makes the servers' mean over m workers the mean over the global batch even when B is not a
   multiple of m. Every worker, and the --check replay, computes the same float. */
static double lr_decay(const opts *o, long step, long total) {
    return o->decay ? 0.5 * (1.0 + cos(3.141592653589793 * (double)step / (double)total)) : 1.0;
}

static float grad_scale(const opts *o, long step, long total) {
    return (float)(lr_decay(o, step, total) * o->workers / o->batch);
}

/* allreduce and fsdp: sgd decays through the gradients as the servers' modes do (grad_scale);
   momentum and adam through their lr (scaling adam's gradients would change nothing). */
static float rule_grad_scale(const opts *o, long step, long total) {
    return o->optim == OPTIM_SGD ? grad_scale(o, step, total) : (float)o->workers / (float)o->batch;
}

static float rule_lr(const opts *o, long step, long total) {
    return o->optim == OPTIM_SGD ? o->lr : (float)(o->lr * lr_decay(o, step, total));
}

/* The server's learning rate. Under async each push is applied on its own, so lr / m keeps the
   step per global batch the same as under BSP. */
static float server_lr(const opts *o) { return o->mode == MODE_ASYNC ? o->lr / (float)o->workers : o->lr; }

/* EASGD's centre takes pushes as they come (KVPS_RULE_ACCUMULATE on its tensors). */
static kvps_consistency server_consistency(const opts *o) {
    return o->mode == MODE_SSP ? KVPS_SSP : o->mode == MODE_ASYNC || o->mode == MODE_EASGD ? KVPS_ASYNC : KVPS_BSP;
}

/* ---------------------------------------------------------------------------------------------
   Worker */
static int g_rank = -1;

static void die_kvps(const kvps_worker *w, kvps_result r, const char *what) {
    const char *detail = w ? kvps_worker_last_error(w) : "";
    fprintf(stderr, "fmnist: worker %d: %s: %s%s%s\n", g_rank, what, kvps_result_str(r), *detail ? " - " : "",
            detail);
    fflush(NULL);
    _exit(1); /* no atexit work while ZeroMQ threads still run */
}

#define KVPS_CHECK(w, call, what)                        \
    do {                                                 \
        kvps_result r_ = (call);                         \
        if (r_ != KVPS_OK) die_kvps((w), r_, (what));    \
    } while (0)

/* Waits for every request in q[0..n). */
static void wait_all(kvps_worker *w, const kvps_req *q, int n, int timeout_ms, const char *what) {
    for (int i = 0; i < n; i++) KVPS_CHECK(w, kvps_worker_wait(w, q[i], timeout_ms), what);
}

static void pull_all(kvps_worker *w, const net *n, const kvps_tensor *th, float **t, int timeout_ms) {
    kvps_req q[MAX_TENSORS];
    for (int i = 0; i < n->nt; i++) KVPS_CHECK(w, kvps_worker_pull_tensor(w, th[i], t[i], &q[i]), "pull");
    wait_all(w, q, n->nt, timeout_ms, "pull");
}

/* The sequential oracle for --check: m virtual workers per step in one process, combined with
   the same arithmetic as the servers' BSP round (sum in rank order, then value -= lr * (sum / m)). */
static void train_sequential(const opts *o, const net *n, float **t, const dataset *train) {
    float *g[MAX_TENSORS], *acc[MAX_TENSORS];
    tensors_alloc(n, g);
    tensors_alloc(n, acc);
    scratch s;
    scratch_alloc(n, &s);
    int *perm = (int *)xcalloc((size_t)train->n, sizeof *perm);
    int m = o->workers, steps = train->n / o->batch;
    float lr = server_lr(o), c = (float)m;
    net_init(n, t, o->seed);
    for (int e = 0; e < o->epochs; e++) {
        shuffle(perm, train->n, o->seed, e);
        for (int step = 0; step < steps; step++) {
            step_stats st = {0, 0, 0};
            for (int r = 0; r < m; r++) {
                shard_grad(n, t, g, &s, train, perm + (size_t)step * o->batch, o->batch, r, m,
                           grad_scale(o, (long)e * steps + step, (long)o->epochs * steps), &st);
                for (int i = 0; i < n->nt; i++) {
                    if (r == 0) memcpy(acc[i], g[i], n->len[i] * sizeof(float));
                    else for (size_t k = 0; k < n->len[i]; k++) acc[i][k] += g[i][k];
                }
            }
            for (int i = 0; i < n->nt; i++)
                for (size_t k = 0; k < n->len[i]; k++) t[i][k] -= lr * (acc[i][k] / c);
        }
    }
    free(perm);
    scratch_free(n, &s);
    tensors_free(n, g);
    tensors_free(n, acc);
}

/* Rank failures in allreduce mode. */
static void die_ring(const kvps_ring *r, kvps_result rc, const char *what) {
    const char *detail = r ? kvps_ring_last_error(r) : "";
    fprintf(stderr, "fmnist: rank %d: %s: %s%s%s\n", g_rank, what, kvps_result_str(rc), *detail ? " - " : "", detail);
    fflush(NULL);
    _exit(1);
}

/* allreduce mode: the tensors back to back in one buffer, and back. */
static void flat_pack(const net *n, float *const *t, float *flat) {
    size_t off = 0;
    for (int i = 0; i < n->nt; i++) {
        memcpy(flat + off, t[i], n->len[i] * sizeof(float));
        off += n->len[i];
    }
}

static void flat_unpack(const net *n, const float *flat, float **t) {
    size_t off = 0;
    for (int i = 0; i < n->nt; i++) {
        memcpy(t[i], flat + off, n->len[i] * sizeof(float));
        off += n->len[i];
    }
}

/* allreduce mode, one step: every rank's gradients summed across the ring (as the codec says),
   then --optim on sum / m (sgd: the servers' arithmetic, value -= lr * (sum / m)) on every rank
   alike; state: the rule's state per parameter, tensor after tensor. Adds the
   payload this rank sent to *sent (as the ring algorithm moves it: 2 (m - 1) / m of the buffer
   for an all-reduce, (m - 1) k pairs of 8 bytes for top-k's all-gather). */
static void ring_step(kvps_ring *ring, const opts *o, const net *n, float **t, float *const *g, float *flat,
                      float *resid, float *state, float lr, long step, uint64_t *sent) {
    size_t total = net_params(n), off = 0;
    int m = o->workers;
    flat_pack(n, g, flat);
    kvps_result rc;
    double per = (double)(m - 1) / m;
    if (o->codec == KVPS_CODEC_TOPK) {
        size_t k = (size_t)(o->topk_frac * (double)total);
        k = k < 1 ? 1 : k > total ? total : k;
        rc = kvps_ring_allreduce_topk(ring, flat, total, k, o->ef ? resid : NULL);
        *sent += (uint64_t)(m - 1) * k * 8;
    } else if (o->codec == KVPS_CODEC_FP16 || o->codec == KVPS_CODEC_BF16) {
        rc = kvps_ring_allreduce_wire(ring, flat, flat, total, KVPS_SUM,
                                      o->codec == KVPS_CODEC_FP16 ? KVPS_FLOAT16 : KVPS_BFLOAT16);
        *sent += (uint64_t)(2.0 * per * (double)total * 2);
    } else {
        rc = kvps_ring_allreduce(ring, flat, flat, total, KVPS_FLOAT32, KVPS_SUM);
        *sent += (uint64_t)(2.0 * per * (double)total * 4);
    }
    if (rc != KVPS_OK) die_ring(ring, rc, "all-reduce");
    int ns = optim_rules[o->optim].state;
    off = 0;
    for (int i = 0; i < n->nt; i++) {
        optim_step((optim_rule)o->optim, t[i], flat + off, (float)m, state + ns * off, n->len[i], lr, step);
        off += n->len[i];
    }
}

/* ---------------------------------------------------------------------------------------------
   fsdp mode. Layer l's parameters are one flat vector, its weights then its biases, padded with
   zeros to a multiple of the ranks m; rank r holds block r of it (len / m floats) and the
   optimizer state of that block, and nothing else persistently. A step:
     forward   layer by layer: all-gather the layer (kvps_ring_allgather), run this rank's share
               of the batch through it, free it (the last layer is kept for the backward pass)
     backward  layer by layer from the last: all-gather it again where the gradient of its input
               is needed (not for the first layer, nor the last, still held), add the share's
               gradient into a zeroed padded buffer, reduce-scatter it (kvps_ring_reduce_scatter,
               sum) into this rank's block, free both
     update    --optim on block / m: the same arithmetic allreduce mode does on the whole (a sum
               of two is the same in either order, so with 2 ranks the two modes end bit-identical)
   Evaluation is sharded too: each rank runs its slice of the test set through the gathered
   layers in chunks, and the correct counts are all-reduced. */
#define FSDP_EVAL_CHUNK 128 /* test rows per forward pass: activations stay small */

typedef struct fsdp {
    int m, rank, nl;
    size_t len[2];    /* floats in layer l: weights + biases */
    size_t blk[2];    /* this rank's block: ceil(len / m) */
    float *w[2];      /* the block of the parameters */
    float *st[2];     /* its optimizer state: optim_rules[].state * blk floats */
    float *gs[2];     /* its reduced gradient (a step's, not kept across steps) */
    float *act[3], *del[3]; /* this rank's share of a batch, layer by layer: bs rows each */
    int bs;           /* rows in act: ceil(batch / m) or FSDP_EVAL_CHUNK; del: ceil(batch / m) */
    size_t transient; /* most bytes of gathered layer + padded gradient held at once */
} fsdp;

static void fsdp_setup(fsdp *f, const opts *o, const net *n, int rank) {
    memset(f, 0, sizeof *f);
    f->m = o->workers;
    f->rank = rank;
    f->nl = n->nl;
    int ns = optim_rules[o->optim].state;
    uint64_t st = net_init_stream(o->seed); /* every rank draws every layer, keeps its block */
    for (int l = 0; l < n->nl; l++) {
        f->len[l] = n->len[2 * l] + n->len[2 * l + 1];
        f->blk[l] = (f->len[l] + (size_t)f->m - 1) / (size_t)f->m;
        f->w[l] = (float *)xcalloc(f->blk[l], sizeof(float));
        f->st[l] = (float *)xcalloc(f->blk[l] * (size_t)(ns ? ns : 1), sizeof(float));
        f->gs[l] = (float *)xcalloc(f->blk[l], sizeof(float));
        float *full = (float *)xcalloc(f->blk[l] * (size_t)f->m, sizeof(float));
        net_init_layer(n, l, full, full + n->len[2 * l], &st);
        memcpy(f->w[l], full + f->blk[l] * (size_t)rank, f->blk[l] * sizeof(float));
        free(full);
        size_t both = 2 * f->blk[l] * (size_t)f->m * sizeof(float);
        if (both > f->transient) f->transient = both;
    }
    int share = (o->batch + f->m - 1) / f->m;
    f->bs = share > FSDP_EVAL_CHUNK ? share : FSDP_EVAL_CHUNK;
    for (int l = 0; l <= n->nl; l++) {
        f->act[l] = (float *)xcalloc((size_t)f->bs * (size_t)n->dim[l], sizeof(float));
        f->del[l] = (float *)xcalloc((size_t)share * (size_t)n->dim[l], sizeof(float));
    }
}

static void fsdp_free(fsdp *f) {
    for (int l = 0; l < f->nl; l++) { free(f->w[l]); free(f->st[l]); free(f->gs[l]); }
    for (int l = 0; l <= f->nl; l++) { free(f->act[l]); free(f->del[l]); }
}

/* Bytes held for the whole run: parameters and optimizer state (the figure allreduce mode
   compares with: all parameters and all their state). */
static size_t fsdp_param_bytes(const fsdp *f) { return (f->blk[0] + (f->nl > 1 ? f->blk[1] : 0)) * sizeof(float); }

/* Layer l whole (padded), gathered from every rank's block; the caller frees it. */
static float *fsdp_gather(kvps_ring *ring, const fsdp *f, int l) {
    float *full = (float *)xcalloc(f->blk[l] * (size_t)f->m, sizeof(float));
    kvps_result rc = kvps_ring_allgather(ring, f->w[l], full, f->blk[l], KVPS_FLOAT32);
    if (rc != KVPS_OK) die_ring(ring, rc, "fsdp all-gather");
    return full;
}

/* This rank's rows (act[0], bs of them) through every layer; returns the last layer, still
   gathered (the caller frees it). */
static float *fsdp_forward(kvps_ring *ring, fsdp *f, const net *n, int bs) {
    float *full = NULL;
    for (int l = 0; l < n->nl; l++) {
        free(full);
        full = fsdp_gather(ring, f, l);
        dense_forward(full, full + n->len[2 * l], n->dim[l], n->dim[l + 1], f->act[l], f->act[l + 1], bs,
                      l + 1 < n->nl);
    }
    return full;
}

/* One step on positions rank, rank + m, ... of the batch: forward, backward, reduce-scatter,
   update. Adds to st and *sent as ring_step does. */
static void fsdp_step(kvps_ring *ring, const opts *o, fsdp *f, const net *n, const dataset *d, const int *batch,
                      float scale, float lr, long step, step_stats *st, uint64_t *sent) {
    int bs = 0, m = f->m;
    for (int j = f->rank; j < o->batch; j += m, bs++) {
        int idx = batch[j];
        load_input(f->act[0] + (size_t)bs * NPIX, d->x + (size_t)idx * NPIX);
    }
    float *last = fsdp_forward(ring, f, n, bs);
    int nl = n->nl;
    for (int j = 0, k = f->rank; j < bs; j++, k += m) {
        int idx = batch[k];
        st->loss += softmax_xent(f->act[nl] + (size_t)j * NCLASS, NCLASS, d->y[idx], f->del[nl] + (size_t)j * NCLASS,
                                 &st->correct);
        st->seen++;
    }
    for (int l = nl - 1; l >= 0; l--) {
        float *full = l == nl - 1 ? last : l > 0 ? fsdp_gather(ring, f, l) : NULL; /* layer 0: no input gradient */
        size_t padded = f->blk[l] * (size_t)m, nw = n->len[2 * l];
        float *g = (float *)xcalloc(padded, sizeof(float));
        dense_backward(full, n->dim[l], n->dim[l + 1], f->act[l], f->del[l + 1], bs, g, g + nw,
                       l > 0 ? f->del[l] : NULL);
        free(full);
        for (size_t k = 0; k < f->len[l]; k++) g[k] *= scale; /* as shard_grad: the sum, then the scale */
        kvps_result rc = kvps_ring_reduce_scatter(ring, g, f->gs[l], f->blk[l], KVPS_FLOAT32, KVPS_SUM);
        if (rc != KVPS_OK) die_ring(ring, rc, "fsdp reduce-scatter");
        free(g);
        *sent += (uint64_t)(2 * (m - 1)) * f->blk[l] * sizeof(float); /* its all-gather and reduce-scatter */
        if (l > 0 && l < nl - 1) *sent += (uint64_t)(m - 1) * f->blk[l] * sizeof(float); /* gathered again */
    }
    for (int l = 0; l < nl; l++)
        optim_step((optim_rule)o->optim, f->w[l], f->gs[l], (float)m, f->st[l], f->blk[l], lr, step);
}

/* Test accuracy, every rank taking part: rank r scores its slice of d, FSDP_EVAL_CHUNK rows at a
   time (every rank runs as many chunks, so the all-gathers line up). */
static double fsdp_evaluate(kvps_ring *ring, fsdp *f, const net *n, const dataset *d) {
    int m = f->m, per = (d->n + m - 1) / m, lo = f->rank * per, hi = lo + per > d->n ? d->n : lo + per;
    int chunks = (per + FSDP_EVAL_CHUNK - 1) / FSDP_EVAL_CHUNK;
    int64_t correct = 0;
    for (int c = 0; c < chunks; c++) {
        int a = lo + c * FSDP_EVAL_CHUNK, b = a + FSDP_EVAL_CHUNK < hi ? a + FSDP_EVAL_CHUNK : hi, bs = b > a ? b - a : 0;
        for (int i = 0; i < bs; i++) load_input(f->act[0] + (size_t)i * NPIX, d->x + (size_t)(a + i) * NPIX);
        free(fsdp_forward(ring, f, n, bs));
        for (int i = 0; i < bs; i++) correct += argmax(f->act[n->nl] + (size_t)i * NCLASS, NCLASS) == d->y[a + i];
    }
    kvps_result rc = kvps_ring_allreduce(ring, &correct, &correct, 1, KVPS_INT64, KVPS_SUM);
    if (rc != KVPS_OK) die_ring(ring, rc, "fsdp evaluate");
    return (double)correct / (double)d->n;
}

/* crc32 of the whole model as the other modes print it (fc1.w, fc1.b, ...: each layer's flat
   vector without its padding), gathered one layer at a time; every rank takes part. */
static uLong fsdp_crc(kvps_ring *ring, const fsdp *f) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int l = 0; l < f->nl; l++) {
        float *full = fsdp_gather(ring, f, l);
        crc = crc32(crc, (const Bytef *)full, (uInt)(f->len[l] * sizeof(float)));
        free(full);
    }
    return crc;
}

/* Peak resident set of this process so far (getrusage: KiB on Linux). */
static long peak_rss_kib(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

/* One worker (or, in allreduce and fsdp modes, one ring rank: servers is NULL and ring is connected). */
static int worker_main(const opts *o, const char *servers, kvps_ring *ring, int rank, const dataset *train,
                       const dataset *test) {
    g_rank = rank;
    int m = o->workers, me = rank == 0, ps = !ring_mode(o), sharded = o->mode == MODE_FSDP;
    kvps_worker *w = NULL;
    net n;
    net_setup(&n, o);
    float *t[MAX_TENSORS] = {NULL}, *g[MAX_TENSORS] = {NULL}; /* fsdp: no whole copy of anything */
    fsdp f;
    float *state = NULL; /* allreduce: --optim's state for every parameter */
    if (sharded) {
        fsdp_setup(&f, o, &n, rank);
    } else {
        tensors_alloc(&n, t);
        tensors_alloc(&n, g);
    }
    scratch s;
    scratch_alloc(&n, &s);
    kvps_tensor th[MAX_TENSORS];
    kvps_req q[MAX_TENSORS];
    size_t nparams = net_params(&n);
    float *flat = NULL, *resid = NULL; /* allreduce: the gradients back to back; top-k's error feedback */
    uint64_t ring_sent = 0;
    float alpha = easgd_alpha(o);
    if (ps) {
        KVPS_CHECK(w, kvps_worker_create(&(kvps_worker_desc){.servers = servers, .rank = rank, .num_workers = m,
                                                             .timeout_ms = WAIT_MS}, &w),
                   "create");
        for (int i = 0; i < n.nt; i++) KVPS_CHECK(w, kvps_worker_tensor(w, n.name[i], n.len[i], &th[i]), "tensor");
        if (o->codec != KVPS_CODEC_NONE) { /* gradients go compressed; weights come back as float32 */
            kvps_codec c = kvps_codec_get(o->codec);
            c.topk_fraction = o->topk_frac;
            for (int i = 0; i < n.nt; i++) KVPS_CHECK(w, kvps_worker_tensor_codec(w, th[i], &c, NULL, o->ef), "codec");
        }
        if (me) {
            if (o->mode == MODE_EASGD) { /* the centre: its servers add what the workers push */
                kvps_optim acc = {.rule = KVPS_RULE_ACCUMULATE};
                for (int i = 0; i < n.nt; i++) KVPS_CHECK(w, kvps_worker_tensor_optim(w, th[i], &acc, &q[i]), "optim");
                wait_all(w, q, n.nt, WAIT_MS, "optim");
            }
            net_init(&n, t, o->seed);
            for (int i = 0; i < n.nt; i++) KVPS_CHECK(w, kvps_worker_init_tensor(w, th[i], t[i], &q[i]), "init");
            wait_all(w, q, n.nt, WAIT_MS, "init");
        }
        KVPS_CHECK(w, kvps_worker_barrier(w, &q[0]), "barrier");
        wait_all(w, q, 1, WAIT_MS, "barrier");
        pull_all(w, &n, th, t, WAIT_MS);
    } else if (!sharded) {
        flat = (float *)xcalloc(nparams, sizeof *flat);
        state = (float *)xcalloc(nparams * (size_t)optim_rules[o->optim].state + 1, sizeof *state);
        if (o->codec == KVPS_CODEC_TOPK && o->ef) resid = (float *)xcalloc(nparams, sizeof *resid);
        if (me) net_init(&n, t, o->seed);
        flat_pack(&n, t, flat); /* rank 0's initial weights to every rank */
        kvps_result rc = kvps_ring_broadcast(ring, flat, flat, nparams, KVPS_FLOAT32, 0);
        if (rc != KVPS_OK) die_ring(ring, rc, "broadcast");
        flat_unpack(&n, flat, t);
    }

    int steps = train->n / o->batch;
    char mname[32];
    mode_name(o, mname, sizeof mname);
    if (me) {
        if (o->mlp) printf("fmnist: mlp 784-%d-10", o->hidden);
        else printf("fmnist: softmax regression 784-10");
        if (ps) printf(", %zu parameters in %d tensors; %s, %d servers, %d workers\n", nparams, n.nt, mname, o->servers, m);
        else if (!sharded) printf(", %zu parameters; allreduce (ring, no server), %d workers, optim %s\n", nparams, m,
                                  optim_rules[o->optim].name);
        else printf(", %zu parameters; fsdp (ring, no server), %d workers, optim %s: each rank holds 1/%d of every "
                    "layer (padded to %zu floats) and of its optimizer state\n", nparams, m,
                    optim_rules[o->optim].name, m, f.blk[0] * (size_t)m + (n.nl > 1 ? f.blk[1] * (size_t)m : 0));
        char share[48];
        if (o->batch % m == 0) snprintf(share, sizeof share, "%d", o->batch / m);
        else snprintf(share, sizeof share, "%d-%d", o->batch / m, o->batch / m + 1);
        printf("fmnist: %d epochs of %d steps, global batch %d (%s per worker), lr %g%s%s, seed %llu\n",
               o->epochs, steps, o->batch, share, (double)o->lr, o->decay ? " with cosine decay" : "",
               o->mode == MODE_ASYNC ? " (servers apply lr/workers per push)" : "", (unsigned long long)o->seed);
        if (o->mode == MODE_SSP)
            printf("fmnist: SSP: a worker's pull waits only for the round %d steps behind its own\n", o->staleness);
        if (o->mode == MODE_EASGD)
            printf("fmnist: EASGD: local SGD on each worker's share, elastic exchange with the centre every %d steps, "
                   "alpha %g; test_acc is the centre's\n", o->tau, (double)alpha);
        static const char *cn[] = {"none", "fp16", "bf16", "topk", "sign"};
        const char *what = ps ? "pushes compressed with" : "all-reduce with";
        if (o->codec == KVPS_CODEC_TOPK) printf("fmnist: %s top-k %g%s\n", what, o->topk_frac, o->ef ? " + error feedback" : "");
        else if (o->codec == KVPS_CODEC_FP16 || o->codec == KVPS_CODEC_BF16)
            printf("fmnist: %s %s%s\n", what, cn[o->codec], ps ? (o->ef ? " + error feedback" : "") : " on the wire");
        else if (o->codec) printf("fmnist: %s %s%s\n", what, cn[o->codec], o->ef ? " + error feedback" : "");
        printf("fmnist: loss and train_acc: running means over worker 0's shard; %s\n",
               ps ? (o->mode == MODE_EASGD ? "net_MB: payload pushed + pulled by all workers; push_KB: bytes one worker "
                                             "pushes per exchange"
                                           : "net_MB: payload pushed + pulled by all workers; push_KB: bytes one worker "
                                             "pushes per step")
                  : "net_MB: payload sent by all ranks (as the ring algorithm moves it); push_KB: bytes one rank "
                    "sends per step");
        printf("%5s %8s %10s %9s %10s %9s %8s %7s\n", "epoch", "loss", "train_acc", "test_acc", "samples/s",
               "net_MB", "push_KB", "time_s");
        fflush(stdout);
    }

    int *perm = (int *)xcalloc((size_t)train->n, sizeof *perm);
    double t_start = now_s(), train_s = 0, test_acc = 0;
    uint64_t prev_bytes = 0, prev_push = 0, prev_pushes = 0;
    long gstep = 0;
    for (int e = 0; e < o->epochs; e++) {
        double t0 = now_s();
        step_stats st = {0, 0, 0};
        shuffle(perm, train->n, o->seed, e);
        for (int step = 0; step < steps; step++, gstep++) {
            long now = (long)e * steps + step, total = (long)o->epochs * steps;
            if (sharded) {
                fsdp_step(ring, o, &f, &n, train, perm + (size_t)step * o->batch, rule_grad_scale(o, now, total),
                          rule_lr(o, now, total), gstep + 1, &st, &ring_sent);
                continue;
            }
            shard_grad(&n, t, g, &s, train, perm + (size_t)step * o->batch, o->batch, rank, m,
                       ps ? grad_scale(o, now, total) : rule_grad_scale(o, now, total), &st);
            if (o->mode == MODE_ALLREDUCE) {
                ring_step(ring, o, &n, t, g, flat, resid, state, rule_lr(o, now, total), gstep + 1, &ring_sent);
            } else if (o->mode == MODE_EASGD) {
                for (int i = 0; i < n.nt; i++) /* local SGD on this worker's copy */
                    for (size_t k = 0; k < n.len[i]; k++) t[i][k] -= o->lr * g[i][k];
                if ((gstep + 1) % o->tau == 0)
                    for (int i = 0; i < n.nt; i++)
                        KVPS_CHECK(w, kvps_worker_easgd(w, th[i], t[i], alpha, WAIT_MS), "easgd");
            } else {
                /* All tensors in flight at once; each reply brings the weights after this round. */
                for (int i = 0; i < n.nt; i++)
                    KVPS_CHECK(w, kvps_worker_pushpull_tensor(w, th[i], g[i], t[i], &q[i]), "pushpull");
                wait_all(w, q, n.nt, WAIT_MS, "pushpull");
            }
        }
        double dt = now_s() - t0;
        train_s += dt;
        if (sharded) test_acc = fsdp_evaluate(ring, &f, &n, test); /* every rank scores its slice */
        if (me) {
            uint64_t bytes = 0, push = 0, pushes = 0;
            if (ps) {
                for (int i = 0; i < n.nt; i++) { /* this worker's measured payload; every worker sends as much */
                    kvps_tensor_stats ts;
                    memset(&ts, 0, sizeof ts);
                    kvps_worker_tensor_stats(w, th[i], &ts);
                    bytes += ts.push_wire_bytes + ts.pull_wire_bytes;
                    push += ts.push_wire_bytes;
                    pushes += ts.pushes;
                }
            } else {
                bytes = push = ring_sent;
                pushes = (uint64_t)gstep * (uint64_t)n.nt;
            }
            if (o->mode == MODE_EASGD) { /* score the centre (g is free until the next step) */
                for (int i = 0; i < n.nt; i++) KVPS_CHECK(w, kvps_worker_pull_tensor(w, th[i], g[i], &q[i]), "pull centre");
                wait_all(w, q, n.nt, WAIT_MS, "pull centre");
                test_acc = evaluate(&n, g, &s, test);
            } else if (!sharded) {
                test_acc = evaluate(&n, t, &s, test);
            }
            double per_push = pushes > prev_pushes ? (double)(push - prev_push) / ((double)(pushes - prev_pushes) / n.nt) : 0;
            printf("%5d %8.4f %10.4f %9.4f %10.0f %9.1f %8.1f %7.2f\n", e + 1, st.loss / st.seen,
                   (double)st.correct / st.seen, test_acc, (double)steps * o->batch / dt,
                   (double)(bytes - prev_bytes) * m / 1e6, per_push / 1e3, now_s() - t0);
            prev_bytes = bytes;
            prev_push = push;
            prev_pushes = pushes;
            fflush(stdout);
        }
    }
    if (ps) {
        /* Under async and EASGD the others may still be pushing: meet, then read the final
           weights (EASGD: the centre). */
        KVPS_CHECK(w, kvps_worker_barrier(w, &q[0]), "barrier");
        wait_all(w, q, 1, END_WAIT_MS, "final barrier");
        pull_all(w, &n, th, t, WAIT_MS);
    }
    /* BSP (and SSP(0), the same rounds): the final weights, which every run of these options
       computes bit for bit alike, named by their crc32 (the tensors in order, each float's bytes) */
    int bsp = ps && (o->mode == MODE_BSP || (o->mode == MODE_SSP && o->staleness == 0));
    /* allreduce and fsdp are deterministic too (a fixed ring order), and print their crc32 alike */
    int with_crc = bsp || (!ps && o->codec == KVPS_CODEC_NONE);
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; with_crc && !sharded && i < n.nt; i++)
        crc = crc32(crc, (const Bytef *)t[i], (uInt)(n.len[i] * sizeof(float)));
    if (sharded) crc = fsdp_crc(ring, &f);
    double wall_s = now_s() - t_start;
    /* What each rank holds for the whole run for the model and its optimizer, in bytes, and the
       largest peak RSS among the ranks (all-reduced: every rank takes part). */
    int nstate = optim_rules[o->optim].state;
    size_t pbytes = sharded ? fsdp_param_bytes(&f) : nparams * sizeof(float), sbytes = pbytes * (size_t)nstate;
    size_t gbytes = sharded ? pbytes : 2 * nparams * sizeof(float); /* fsdp: the reduced block; allreduce: g, flat */
    int64_t rss[2] = {peak_rss_kib(), 0};
    if (!ps) {
        kvps_result rr = kvps_ring_allreduce(ring, rss, rss + 1, 1, KVPS_INT64, KVPS_MAX);
        if (rr != KVPS_OK) die_ring(ring, rr, "peak rss");
    }
    if (ps) KVPS_CHECK(w, kvps_worker_finish(w, WAIT_MS), "finish"); /* the servers leave once every worker has */
    kvps_worker_destroy(&w);

    int rc = 0;
    if (sharded) test_acc = fsdp_evaluate(ring, &f, &n, test);
    if (me) {
        if (!sharded) test_acc = evaluate(&n, t, &s, test);
        printf("\nresult:\n");
        char model[32];
        if (o->mlp) snprintf(model, sizeof model, "mlp-%d", o->hidden);
        else snprintf(model, sizeof model, "softmax");
        printf("  %-9s %7s %7s %9s %6s %5s %7s %8s %7s %7s\n", "model", "servers", "workers", "mode", "epochs",
               "batch", "lr", "test_acc", "train_s", "wall_s");
        printf("  %-9s %7d %7d %9s %6d %5d %7g %8.4f %7.1f %7.1f\n", model, ps ? o->servers : 0, m, mname, o->epochs,
               o->batch, (double)o->lr, test_acc, train_s, wall_s);
        if (o->target > 0) {
            printf("fmnist: test accuracy %.4f %s target %.4f\n", test_acc, test_acc >= o->target ? ">=" : "BELOW",
                   o->target);
            if (test_acc < o->target) rc = 3;
        }
        if (!ps) {
            printf("fmnist: step_ms %.3f (train_s / steps)\n", 1e3 * train_s / (double)((long)o->epochs * steps));
            printf("fmnist: memory per rank: params_bytes %zu state_bytes %zu (%s: %d floats per parameter) "
                   "persistent_bytes %zu grad_bytes %zu transient_bytes %zu peak_rss_kib %lld (rank 0) %lld (max)\n",
                   pbytes, sbytes, optim_rules[o->optim].name, nstate, pbytes + sbytes, gbytes,
                   sharded ? f.transient : (size_t)0, (long long)rss[0], (long long)rss[1]);
        }
        fflush(stdout);
        if (o->check) {
            float *ref[MAX_TENSORS];
            tensors_alloc(&n, ref);
            double t0 = now_s();
            train_sequential(o, &n, ref, train);
            size_t diff = 0;
            double maxd = 0;
            for (int i = 0; i < n.nt; i++) {
                for (size_t k = 0; k < n.len[i]; k++) {
                    if (memcmp(&ref[i][k], &t[i][k], sizeof(float)) != 0) diff++;
                    double dd = fabs((double)ref[i][k] - (double)t[i][k]);
                    if (dd > maxd) maxd = dd;
                }
            }
            printf("check: sequential replay (%d virtual workers, one process, %.1f s): %s", m, now_s() - t0,
                   diff ? "FAIL, " : "PASS, final weights bit-identical\n");
            if (diff) printf("%zu of %zu floats differ, max |diff| %g\n", diff, nparams, maxd);
            if (diff && rc == 0) rc = 4;
            tensors_free(&n, ref);
            fflush(stdout);
        }
        if (with_crc) {
            printf("final weights crc32 %08lx\n", (unsigned long)crc);
            fflush(stdout);
        }
    }
    free(perm);
    free(flat);
    free(resid);
    free(state);
    if (sharded) fsdp_free(&f);
    scratch_free(&n, &s);
    tensors_free(&n, t);
    tensors_free(&n, g);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   Server: with report_fd >= 0 writes the bound endpoint there first. It leaves by itself once
   every worker has finished (kvps_server_run returns), on SIGINT/SIGTERM, or when the
   standalone parent (parent > 0) has died. */
static int server_main(const opts *o, const char *endpoint, int rank, int report_fd, pid_t parent,
                       const kvps_env *env) {
    const char *replicas = env ? env->replicas : NULL; /* standalone: no replicas */
    int replica = env ? env->replica : 0, replacement = env ? env->replacement : 0;
    return launch_server(&(launch_server_desc){
        .prog = "fmnist",
        .server = {.endpoint = endpoint, .num_workers = o->workers, .rank = rank,
                   .consistency = server_consistency(o), .staleness = o->staleness,
                   .update = KVPS_UPDATE_SGD, .lr = server_lr(o),
                   .replicas = replicas, .replica = replica, .replacement = replacement},
        .parent = parent,
        .poll_ms = 50,
        .report_fd = report_fd,
        /* --kill-primary-at: shard 0's first primary only */
        .kill_at_rounds = rank == 0 && replica == 0 && !replacement ? o->kill_at : 0});
}

/* ---------------------------------------------------------------------------------------------
   Standalone: fork the servers and workers of a local cluster. Nothing here touches ZeroMQ:
   each child creates its own context after the fork. */
static volatile sig_atomic_t g_parent_signal;
static void on_parent_signal(int sig) { g_parent_signal = sig; }

typedef struct child { pid_t pid; const char *role; int rank, done, status, reported; } child;

static int exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

static void describe_exit(const child *c) {
    if (WIFEXITED(c->status))
        fprintf(stderr, "fmnist: %s %d exited with code %d\n", c->role, c->rank, WEXITSTATUS(c->status));
    else if (WIFSIGNALED(c->status))
        fprintf(stderr, "fmnist: %s %d was killed by signal %d\n", c->role, c->rank, WTERMSIG(c->status));
}

/* Reaps whatever has exited; returns how many children are still running. */
static int reap(child *c, int n) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < n; i++) {
            if (c[i].pid == pid) { c[i].done = 1; c[i].status = status; }
        }
    }
    int running = 0;
    for (int i = 0; i < n; i++) running += c[i].pid > 0 && !c[i].done;
    return running;
}

/* SIGTERM to every child still running, then SIGKILL to any left after 5 s. */
static void stop_children(child *c, int n) {
    for (int i = 0; i < n; i++)
        if (c[i].pid > 0 && !c[i].done) kill(c[i].pid, SIGTERM);
    double deadline = now_s() + 5.0;
    while (reap(c, n) > 0 && now_s() < deadline) sleep_ms(20);
    for (int i = 0; i < n; i++) {
        if (c[i].pid > 0 && !c[i].done) {
            fprintf(stderr, "fmnist: %s %d ignored SIGTERM; killing it\n", c[i].role, c[i].rank);
            kill(c[i].pid, SIGKILL);
            waitpid(c[i].pid, &c[i].status, 0);
            c[i].done = 1;
        }
    }
}

/* Waits for the workers; stops everything at the first failure, signal or the deadline. Then
   the servers leave by themselves (every worker has finished); one still there after 10 s is
   named and stopped. */
static int wait_cluster(const opts *o, child *c, int ns, int nc, double t0, int rc) {
    launch_catch_signals(on_parent_signal);

    double deadline = t0 + o->timeout_s;
    int workers_left = nc - ns;
    while (rc == 0 && workers_left > 0) {
        reap(c, nc);
        workers_left = 0;
        for (int i = 0; i < nc; i++) {
            if (!c[i].done) { workers_left += i >= ns; continue; }
            if (c[i].reported || exited_ok(c[i].status)) continue;
            c[i].reported = 1;
            int code = WIFEXITED(c[i].status) ? WEXITSTATUS(c[i].status) : 1;
            /* Worker 0's 3 (below --target) and 4 (--check differs) are results it printed. */
            if (i < ns || (code != 3 && code != 4)) describe_exit(&c[i]);
            if (rc == 0) rc = i >= ns && (code == 3 || code == 4) ? code : 1;
        }
        if (rc == 0 && workers_left > 0) {
            if (g_parent_signal) {
                fprintf(stderr, "fmnist: signal %d: stopping the cluster\n", (int)g_parent_signal);
                rc = 128 + (int)g_parent_signal;
            } else if (now_s() > deadline) {
                fprintf(stderr, "fmnist: timed out after %d s (--timeout): stopping the cluster\n", o->timeout_s);
                rc = 1;
            } else {
                sleep_ms(20);
            }
        }
    }
    for (double until = now_s() + 10; rc == 0 && reap(c, nc) > 0 && now_s() < until;) sleep_ms(20);
    for (int i = 0; i < ns && rc == 0; i++)
        if (!c[i].done) fprintf(stderr, "fmnist: server %d did not leave by itself 10 s after the workers; stopping it\n", i);
    stop_children(c, nc);
    for (int i = 0; i < ns; i++) { /* a server that failed while being stopped */
        if (c[i].pid > 0 && !c[i].reported && !exited_ok(c[i].status)) {
            describe_exit(&c[i]);
            if (rc == 0) rc = 1;
        }
    }
    if (rc == 0) {
        if (ns) printf("fmnist: %d servers and %d workers finished in %.1f s\n", ns, nc - ns, now_s() - t0);
        else printf("fmnist: %d ranks finished in %.1f s\n", nc, now_s() - t0);
    }
    return rc;
}


static int run_local(const opts *o, const dataset *train, const dataset *test) {
    int ns = o->servers, nw = o->workers, nc = ns + nw, rc = 0;
    child *c = (child *)xcalloc((size_t)nc, sizeof *c);
    char *servers = (char *)xcalloc((size_t)ns, 300);
    double t0 = now_s();
    pid_t self = getpid();

    /* Servers one at a time: each reports its port before the next starts, and no child
       inherits another's pipe. */
    for (int i = 0; i < ns && rc == 0; i++) {
        int fd[2];
        if (pipe(fd) != 0) { perror("fmnist: pipe"); rc = 1; break; }
        fflush(NULL); /* or the child would print the parent's buffered output again */
        pid_t pid = fork();
        if (pid < 0) { perror("fmnist: fork"); close(fd[0]); close(fd[1]); rc = 1; break; }
        if (pid == 0) {
            close(fd[0]);
            _exit(server_main(o, "tcp://127.0.0.1:*", i, fd[1], self, NULL));
        }
        c[i] = (child){pid, "server", i, 0, 0, 0};
        close(fd[1]);
        char ep[256];
        if (launch_read_line(fd[0], ep, sizeof ep, 15000) != 0) {
            fprintf(stderr, "fmnist: server %d did not report its endpoint\n", i);
            rc = 1;
        } else {
            launch_list_add(servers, (size_t)ns * 300, ep);
        }
        close(fd[0]);
    }
    for (int r = 0; r < nw && rc == 0; r++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) { perror("fmnist: fork"); rc = 1; break; }
        if (pid == 0) {
            int wrc = worker_main(o, servers, NULL, r, train, test);
            fflush(NULL);
            _exit(wrc);
        }
        c[ns + r] = (child){pid, "worker", r, 0, 0, 0};
    }
    rc = wait_cluster(o, c, ns, nc, t0, rc);
    free(servers);
    free(c);
    return rc;
}

/* allreduce mode, one forked rank: binds a free port, tells the parent (up_fd), learns every
   rank's endpoint from it (down_fd), connects, trains. */
static int ring_child(const opts *o, int rank, int up_fd, int down_fd, const dataset *train, const dataset *test) {
    g_rank = rank;
    kvps_ring *ring = NULL;
    kvps_result r = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = o->workers, .bind = "tcp://127.0.0.1:*",
                                                       .timeout_ms = WAIT_MS, .algo = KVPS_ALGO_RING}, &ring);
    if (r != KVPS_OK) die_ring(ring, r, "create");
    char line[300];
    int len = snprintf(line, sizeof line, "%s\n", kvps_ring_endpoint(ring));
    if (write(up_fd, line, (size_t)len) != len) { perror("fmnist: rank: write"); return 1; }
    close(up_fd);
    size_t cap = (size_t)o->workers * 300;
    char *peers = (char *)xcalloc(cap, 1);
    if (launch_read_line(down_fd, peers, cap, 30000) != 0) {
        fprintf(stderr, "fmnist: rank %d: no peer list from the parent\n", rank);
        return 1;
    }
    close(down_fd);
    r = kvps_ring_connect(ring, peers);
    if (r != KVPS_OK) die_ring(ring, r, "connect");
    free(peers);
    int rc = worker_main(o, NULL, ring, rank, train, test);
    kvps_ring_destroy(&ring);
    return rc;
}

/* Standalone allreduce mode: fork M ranks, collect their endpoints, hand out the list. */
static int run_local_ring(const opts *o, const dataset *train, const dataset *test) {
    int nw = o->workers, rc = 0;
    child *c = (child *)xcalloc((size_t)nw, sizeof *c);
    int *up = (int *)xcalloc((size_t)nw, sizeof *up), *down = (int *)xcalloc((size_t)nw, sizeof *down);
    char *peers = (char *)xcalloc((size_t)nw, 300);
    double t0 = now_s();
    for (int r = 0; r < nw; r++) up[r] = down[r] = -1;
    for (int r = 0; r < nw && rc == 0; r++) {
        int fu[2], fd[2];
        if (pipe(fu) != 0) { perror("fmnist: pipe"); rc = 1; break; }
        if (pipe(fd) != 0) { perror("fmnist: pipe"); close(fu[0]); close(fu[1]); rc = 1; break; }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) { perror("fmnist: fork"); rc = 1; break; }
        if (pid == 0) {
            for (int j = 0; j < r; j++) { close(up[j]); close(down[j]); } /* the other ranks' pipes */
            close(fu[0]);
            close(fd[1]);
            int wrc = ring_child(o, r, fu[1], fd[0], train, test);
            fflush(NULL);
            _exit(wrc);
        }
        close(fu[1]);
        close(fd[0]);
        up[r] = fu[0];
        down[r] = fd[1];
        c[r] = (child){pid, "rank", r, 0, 0, 0};
    }
    for (int r = 0; r < nw && rc == 0; r++) {
        char ep[256];
        if (launch_read_line(up[r], ep, sizeof ep, 15000) != 0) {
            fprintf(stderr, "fmnist: rank %d did not report its endpoint\n", r);
            rc = 1;
        } else {
            launch_list_add(peers, (size_t)nw * 300, ep);
        }
    }
    size_t len = strlen(peers);
    peers[len] = '\n';
    for (int r = 0; r < nw && rc == 0; r++)
        if (write(down[r], peers, len + 1) != (ssize_t)(len + 1)) { perror("fmnist: write"); rc = 1; }
    for (int r = 0; r < nw; r++) {
        if (up[r] >= 0) close(up[r]);
        if (down[r] >= 0) close(down[r]);
    }
    rc = wait_cluster(o, c, 0, nw, t0, rc);
    free(peers);
    free(up);
    free(down);
    free(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   main */
int main(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0) return rc;
    static dataset train, test;

    if (kvps_env_launched() && ring_mode(&o)) { /* one ring rank per process, no server */
        const char *role = getenv("KVPS_ROLE");
        if (role && strcmp(role, "server") == 0) {
            printf("fmnist: --mode allreduce needs no server; this one leaves (use kvps-run -s 0)\n");
            return 0;
        }
        int rank = 0, size = 0;
        const char *peers = NULL;
        if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) {
            fprintf(stderr, "fmnist: --mode allreduce under a launcher needs KVPS_RANK, KVPS_SIZE (or the MPI/Slurm\n"
                            "  rank and size) and KVPS_RING_PEERS (one endpoint per rank)\n");
            return 2;
        }
        if (o.set_workers && o.workers != size)
            fprintf(stderr, "fmnist: using the environment's %d ranks, not --workers %d\n", size, o.workers);
        o.workers = size;
        if ((rc = check_opts(&o)) != 0) return rc;
        if (datasets_load(o.data, &train, &test) != 0)
            return 2;
        g_rank = rank;
        kvps_ring *ring = NULL;
        kvps_result r = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers,
                                                           .timeout_ms = WAIT_MS, .algo = KVPS_ALGO_RING}, &ring);
        if (r != KVPS_OK) die_ring(ring, r, "create");
        rc = worker_main(&o, NULL, ring, rank, &train, &test);
        kvps_ring_destroy(&ring);
        return rc;
    }
    if (kvps_env_launched()) {
        kvps_env env;
        if ((rc = launch_env_read("fmnist", &env, &o.servers, o.set_servers, &o.workers, o.set_workers)) != 0) return rc;
        if ((rc = check_opts(&o)) != 0) return rc;
        if (env.role == KVPS_ROLE_SERVER) return server_main(&o, env.endpoint, env.rank, -1, 0, &env);
        if (datasets_load(o.data, &train, &test) != 0)
            return 2;
        return worker_main(&o, env.servers, NULL, env.rank, &train, &test);
    }

    if ((rc = check_opts(&o)) != 0) return rc;
    /* Loaded once before the forks: the children share the pages. */
    if (datasets_load(o.data, &train, &test) != 0)
        return 2;
    return ring_mode(&o) ? run_local_ring(&o, &train, &test) : run_local(&o, &train, &test);
}
