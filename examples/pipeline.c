/* pipeline.c - pipeline-parallel training on Fashion-MNIST with kvps_ring's point-to-point calls:
   an MLP's layers split over 2-4 ranks (stages), micro-batches going forward as activations and
   backward as gradients (kvps_ring_isend / kvps_ring_recv).

   What it shows: model parallelism with no server and no collective in the training step. The
   MLP (--layers, default 784-256-128-64-10, ReLU between layers, softmax cross-entropy) is cut
   into --stages contiguous runs of layers, the cut that makes the largest stage's parameter count
   smallest. Each step takes a global batch of --batch samples (the same shuffle as fmnist) cut
   into --micro micro-batches. Stage 0 reads the pixels, the last stage the labels; each stage
   holds its layers' parameters, their gradients (summed over the step's micro-batches) and
   optimizer state, and the activations of the micro-batches it has run forward and not yet
   backward. After the step's last backward every stage applies one update (--optim, cosine decay
   of lr over the run) to its own layers: the same arithmetic, in the same order, as one process
   running the whole net on the same micro-batches.
   Schedules (--schedule):
     gpipe   all M forwards, then all M backwards (in micro-batch order): every stage holds the
             activations of all M micro-batches
     1f1b    stage s runs min(S - 1 - s, M) forwards, then alternates one forward and one
             backward, then the backwards left (PipeDream-flush): stage s holds at most
             S - s micro-batches' activations
   Both run the backwards of a stage in micro-batch order, so the gradients add up in the order
   the one-process reference does and the losses match it bit for bit. --stages 1 is that
   reference (one process, no ring); --check runs it after training, in the last stage's process,
   and compares the loss of every step (relative difference; FAIL and exit 4 at 1e-5 or more).

   usage: pipeline [--stages S] [--micro M] [--schedule gpipe|1f1b] [--epochs E] [--batch B]
                   [--steps K] [--layers 784,256,128,64,10] [--optim sgd|momentum|adam] [--lr LR]
                   [--seed S] [--data DIR] [--target ACC] [--check] [--timeout SECONDS]

   Standalone (no launcher variables): forks S ranks on 127.0.0.1 (each binds tcp://127.0.0.1:*,
   the parent hands every rank the list, as fmnist's allreduce mode does) and waits for them.
   Under a launcher, one process per stage from KVPS_RANK / KVPS_SIZE / KVPS_RING_PEERS
   (kvps_ring_env_read): `scripts/kvps-run -s 0 -w 4 -- build/pipeline` (the size is the stage
   count). The last stage prints: the epoch lines (loss and train_acc over its micro-batches,
   test_acc of the whole pipeline), the result, `pipeline: step_ms`, one `memory: stage ...` line
   per stage (bytes of parameters, gradients, optimizer state and stashed activations, peak RSS)
   and, with --check, the comparison.

   Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist, or --data DIR).
   Exit codes: 0 done, 1 a rank failed or timed out, 2 bad usage or data, 3 test accuracy below
   --target, 4 --check found a difference. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h" /* the ring alone: no parameter server */

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define FMNIST_DATA_PROG "pipeline"
#include "examples/launch.h"
#include "examples/fmnist_data.h"
#include "examples/mlp.h"

#define MAX_LAYERS 8
#define MAX_STAGES 8
#define MAX_MICRO 64     /* micro-batches per step: stash slots */
#define WAIT_MS 60000      /* one receive; a step takes milliseconds */
#define EVAL_CHUNK 500     /* test rows per message when scoring */
#define TAG_EVAL 0x40000000u

typedef enum schedule { SCHED_GPIPE, SCHED_1F1B } schedule;

typedef struct opts {
    int stages, micro, epochs, batch, steps;
    int nl, dim[MAX_LAYERS + 1];
    float lr;
    int optim, set_lr;
    schedule sched;
    uint64_t seed;
    const char *data;
    double target;
    int check, timeout_s;
} opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: pipeline [--stages S] [--micro M] [--schedule gpipe|1f1b] [--epochs E] [--batch B]\n"
            "                [--steps K] [--layers 784,256,128,64,10] [--optim sgd|momentum|adam] [--lr LR]\n"
            "                [--seed S] [--data DIR] [--target ACC] [--check] [--timeout SECONDS]\n"
            "defaults: --stages 2 --micro 4 --schedule gpipe --epochs 10 --batch 128 --steps 0 (every step)\n"
            "          --layers 784,256,128,64,10 --optim sgd (lr 0.1; momentum 0.03, adam 0.001) --seed 1\n"
            "          --data " DATA_DIR " --timeout 900\n"
            "--stages 1 runs the whole net in one process: the reference --check compares with.\n");
}

static int parse_layers(const char *v, opts *o) {
    int n = 0;
    const char *p = v;
    while (*p) {
        char *end = NULL;
        long d = strtol(p, &end, 10);
        if (end == p || d < 1 || d > 8192 || n > MAX_LAYERS) return -1;
        o->dim[n++] = (int)d;
        p = end;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    if (n < 2 || o->dim[0] != NPIX || o->dim[n - 1] != NCLASS) return -1;
    o->nl = n - 1;
    return 0;
}

/* 0, or 2 after saying what is wrong. "--opt value" and "--opt=value". */
static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){.stages = 2, .micro = 4, .epochs = 10, .batch = 128, .optim = OPTIM_SGD, .seed = 1,
                .data = DATA_DIR, .timeout_s = 900};
    parse_layers("784,256,128,64,10", o);
    for (int i = 1; i < argc; i++) {
        char name[32];
        const char *arg = argv[i], *val = NULL;
        if (launch_opt(arg, name, sizeof name, &val) != 0) {
            fprintf(stderr, "pipeline: unknown argument '%s'\n", arg);
            usage(stderr);
            return 2;
        }
        if (strcmp(name, "--help") == 0) { usage(stdout); exit(0); }
        if (strcmp(name, "--check") == 0) { o->check = 1; continue; }
        if (!val) {
            if (i + 1 >= argc) { fprintf(stderr, "pipeline: %s needs a value\n", name); return 2; }
            val = argv[++i];
        }
        long l = 0;
        double d = 0;
        int bad = 0;
        if (strcmp(name, "--stages") == 0) { bad = parse_long(val, 1, MAX_STAGES, &l); o->stages = (int)l; }
        else if (strcmp(name, "--micro") == 0) { bad = parse_long(val, 1, MAX_MICRO, &l); o->micro = (int)l; }
        else if (strcmp(name, "--epochs") == 0) { bad = parse_long(val, 1, 1000, &l); o->epochs = (int)l; }
        else if (strcmp(name, "--batch") == 0) { bad = parse_long(val, 1, 60000, &l); o->batch = (int)l; }
        else if (strcmp(name, "--steps") == 0) { bad = parse_long(val, 0, 60000, &l); o->steps = (int)l; }
        else if (strcmp(name, "--seed") == 0) { bad = parse_long(val, 0, 2147483647L, &l); o->seed = (uint64_t)l; }
        else if (strcmp(name, "--timeout") == 0) { bad = parse_long(val, 1, 86400, &l); o->timeout_s = (int)l; }
        else if (strcmp(name, "--lr") == 0) { bad = parse_double(val, 1e-6, 100.0, &d); o->lr = (float)d; o->set_lr = 1; }
        else if (strcmp(name, "--target") == 0) { bad = parse_double(val, 0.0, 1.0, &d); o->target = d; }
        else if (strcmp(name, "--optim") == 0) bad = (o->optim = optim_parse(val)) < 0;
        else if (strcmp(name, "--layers") == 0) bad = parse_layers(val, o);
        else if (strcmp(name, "--data") == 0) o->data = val;
        else if (strcmp(name, "--schedule") == 0) {
            if (strcmp(val, "gpipe") == 0) o->sched = SCHED_GPIPE;
            else if (strcmp(val, "1f1b") == 0) o->sched = SCHED_1F1B;
            else bad = 1;
        } else {
            fprintf(stderr, "pipeline: unknown option '%s'\n", name);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "pipeline: bad value '%s' for %s\n", val, name);
            usage(stderr);
            return 2;
        }
    }
    if (!o->set_lr) o->lr = o->optim == OPTIM_SGD ? 0.1f : optim_rules[o->optim].lr;
    return 0;
}

/* After the launcher has fixed the stage count. */
static int check_opts(const opts *o) {
    if (o->batch % o->micro != 0) {
        fprintf(stderr, "pipeline: --batch %d must be a multiple of --micro %d\n", o->batch, o->micro);
        return 2;
    }
    if (o->stages > o->nl) {
        fprintf(stderr, "pipeline: %d stages need at least %d layers (--layers has %d)\n", o->stages, o->stages, o->nl);
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   Placement: stage s runs layers [cut[s], cut[s + 1]); the contiguous cut whose largest stage
   holds the fewest parameters (ties: the first found), by trying them all (at most C(7, 3)). */
static size_t layer_params(const opts *o, int l) { return (size_t)o->dim[l] * (size_t)o->dim[l + 1] + (size_t)o->dim[l + 1]; }

static void best_cut(const opts *o, int s, int from, int *cut, int *best, size_t *best_max, size_t cur_max) {
    int S = o->stages;
    if (s == S - 1) {
        size_t p = 0;
        for (int l = from; l < o->nl; l++) p += layer_params(o, l);
        if (p > cur_max) cur_max = p;
        if (cur_max < *best_max) {
            *best_max = cur_max;
            memcpy(best, cut, sizeof(int) * (size_t)S);
            best[S] = o->nl;
        }
        return;
    }
    size_t p = 0;
    for (int to = from + 1; to <= o->nl - (S - 1 - s); to++) { /* stage s takes [from, to) */
        p += layer_params(o, to - 1);
        cut[s + 1] = to;
        best_cut(o, s + 1, to, cut, best, best_max, p > cur_max ? p : cur_max);
    }
}

static void place(const opts *o, int *cut) {
    int tmp[MAX_STAGES + 1] = {0};
    size_t best_max = (size_t)-1;
    best_cut(o, 0, 0, tmp, cut, &best_max, 0);
    cut[0] = 0;
}

/* ---------------------------------------------------------------------------------------------
   A stage: its layers' parameters p[l] (weights dim[l] x dim[l+1], then biases), gradients g[l]
   and optimizer state, and slots of stashed activations: slot k holds a micro-batch's input to
   each of its layers and its output (a[k][0] .. a[k][l1 - l0]) and the gradient it sends back
   (dsend[k]). A slot is reused only once the micro-batch in it has gone backward and its sends
   have completed. */
static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "pipeline: out of memory\n");
        fflush(NULL);
        _exit(1);
    }
    return p;
}

typedef struct stage {
    const opts *o;
    kvps_ring *ring;         /* NULL: one stage holding every layer (the reference) */
    int s, S, l0, l1, mb, nslots;
    float *p[MAX_LAYERS], *g[MAX_LAYERS], *st[MAX_LAYERS];
    float **a[MAX_MICRO];    /* a[slot][i] */
    float *dsend[MAX_MICRO];
    kvps_ring_req act_q[MAX_MICRO], grad_q[MAX_MICRO];
    int act_pending[MAX_MICRO], grad_pending[MAX_MICRO];
    float *dcur, *dnext;     /* the gradient going down through this stage's layers */
    double step_loss;        /* last stage: this step's summed loss */
    int correct, seen;       /* last stage: this epoch's */
    size_t param_bytes, state_bytes, stash_bytes;
} stage;

static int g_rank = -1;

static void die_ring(const kvps_ring *r, kvps_result rc, const char *what) {
    const char *detail = r ? kvps_ring_last_error(r) : "";
    fprintf(stderr, "pipeline: stage %d: %s: %s%s%s\n", g_rank, what, kvps_result_str(rc), *detail ? " - " : "",
            detail);
    fflush(NULL);
    _exit(1);
}

static int max_dim(const opts *o) {
    int m = 0;
    for (int l = 0; l <= o->nl; l++) m = o->dim[l] > m ? o->dim[l] : m;
    return m;
}

/* He init for layers feeding a ReLU, Xavier for the last; biases zero. Each layer has a stream
   of its own, so a stage draws only its layers and gets what one process holding all would. */
static void init_layer(const opts *o, int l, float *p) {
    uint64_t st = o->seed * 0x2545F4914F6CDD1Dull + 1 + (uint64_t)(l + 1) * 0xD1B54A32D192ED03ull;
    double fan_in = o->dim[l], fan_out = o->dim[l + 1];
    double sd = l + 1 < o->nl ? sqrt(2.0 / fan_in) : sqrt(2.0 / (fan_in + fan_out));
    size_t nw = (size_t)o->dim[l] * (size_t)o->dim[l + 1];
    for (size_t i = 0; i < nw; i++) p[i] = (float)(sd * rng_normal(&st));
}

static void stage_setup(stage *t, const opts *o, kvps_ring *ring, int s, int S) {
    memset(t, 0, sizeof *t);
    int cut[MAX_STAGES + 1];
    opts one = *o;
    one.stages = S;
    place(&one, cut);
    t->o = o;
    t->ring = ring;
    t->s = s;
    t->S = S;
    t->l0 = cut[s];
    t->l1 = cut[s + 1];
    t->mb = o->batch / o->micro;
    int warm = S - 1 - s < o->micro ? S - 1 - s : o->micro;
    t->nslots = o->sched == SCHED_GPIPE || warm + 1 > o->micro ? o->micro : warm + 1;
    int ns = optim_rules[o->optim].state;
    for (int l = t->l0; l < t->l1; l++) {
        size_t n = layer_params(o, l);
        t->p[l] = (float *)xcalloc(n, sizeof(float));
        t->g[l] = (float *)xcalloc(n, sizeof(float));
        t->st[l] = (float *)xcalloc(n * (size_t)(ns ? ns : 1), sizeof(float));
        init_layer(o, l, t->p[l]);
        t->param_bytes += n * sizeof(float);
        t->state_bytes += n * (size_t)ns * sizeof(float);
    }
    for (int k = 0; k < t->nslots; k++) {
        t->a[k] = (float **)xcalloc((size_t)(t->l1 - t->l0 + 1), sizeof(float *));
        for (int i = 0; i <= t->l1 - t->l0; i++) {
            t->a[k][i] = (float *)xcalloc((size_t)t->mb * (size_t)o->dim[t->l0 + i], sizeof(float));
            t->stash_bytes += (size_t)t->mb * (size_t)o->dim[t->l0 + i] * sizeof(float);
        }
        if (s > 0) {
            t->dsend[k] = (float *)xcalloc((size_t)t->mb * (size_t)o->dim[t->l0], sizeof(float));
            t->stash_bytes += (size_t)t->mb * (size_t)o->dim[t->l0] * sizeof(float);
        }
    }
    t->dcur = (float *)xcalloc((size_t)t->mb * (size_t)max_dim(o), sizeof(float));
    t->dnext = (float *)xcalloc((size_t)t->mb * (size_t)max_dim(o), sizeof(float));
}

static void stage_free(stage *t) {
    for (int l = t->l0; l < t->l1; l++) { free(t->p[l]); free(t->g[l]); free(t->st[l]); }
    for (int k = 0; k < t->nslots; k++) {
        for (int i = 0; i <= t->l1 - t->l0; i++) free(t->a[k][i]);
        free(t->a[k]);
        free(t->dsend[k]);
    }
    free(t->dcur);
    free(t->dnext);
}

/* Waits for slot k's sends (before it is written again, and at the end of a step). */
static void slot_drain(stage *t, int k) {
    if (t->act_pending[k]) {
        kvps_result rc = kvps_ring_wait(t->ring, t->act_q[k], -1);
        if (rc != KVPS_OK) die_ring(t->ring, rc, "send of activations");
        t->act_pending[k] = 0;
    }
    if (t->grad_pending[k]) {
        kvps_result rc = kvps_ring_wait(t->ring, t->grad_q[k], -1);
        if (rc != KVPS_OK) die_ring(t->ring, rc, "send of gradients");
        t->grad_pending[k] = 0;
    }
}

static void load_rows(float *a, const dataset *d, const int *idx, int n) {
    for (int j = 0; j < n; j++)
        for (int k = 0; k < NPIX; k++) a[(size_t)j * NPIX + k] = (float)d->x[(size_t)idx[j] * NPIX + k] / 255.0f;
}

/* Micro-batch m of the step whose samples are batch[0 .. B): forward through this stage. */
static void forward(stage *t, const dataset *d, const int *batch, int m) {
    const opts *o = t->o;
    int k = m % t->nslots, nin = t->l1 - t->l0, mb = t->mb;
    const int *idx = batch + (size_t)m * (size_t)mb;
    slot_drain(t, k);
    float **a = t->a[k];
    if (t->s == 0) {
        load_rows(a[0], d, idx, mb);
    } else {
        kvps_result rc = kvps_ring_recv(t->ring, a[0], (size_t)mb * (size_t)o->dim[t->l0], KVPS_FLOAT32, t->s - 1,
                                        (uint32_t)(2 * m));
        if (rc != KVPS_OK) die_ring(t->ring, rc, "receive of activations");
    }
    for (int l = t->l0; l < t->l1; l++)
        dense_forward(t->p[l], t->p[l] + (size_t)o->dim[l] * (size_t)o->dim[l + 1], o->dim[l], o->dim[l + 1],
                      a[l - t->l0], a[l - t->l0 + 1], mb, l + 1 < o->nl);
    if (t->s < t->S - 1) {
        kvps_result rc = kvps_ring_isend(t->ring, a[nin], (size_t)mb * (size_t)o->dim[t->l1], KVPS_FLOAT32, t->s + 1,
                                         (uint32_t)(2 * m), &t->act_q[k]);
        if (rc != KVPS_OK) die_ring(t->ring, rc, "send of activations");
        t->act_pending[k] = 1;
    } else {
        for (int j = 0; j < mb; j++)
            t->step_loss += softmax_xent(a[nin] + (size_t)j * NCLASS, NCLASS, d->y[idx[j]], NULL, &t->correct);
        t->seen += mb;
    }
}

/* Micro-batch m backward through this stage: its gradients added to g. */
static void backward(stage *t, const dataset *d, const int *batch, int m) {
    const opts *o = t->o;
    int k = m % t->nslots, nin = t->l1 - t->l0, mb = t->mb;
    float **a = t->a[k];
    if (t->s == t->S - 1) { /* d loss / d logits, from the stashed logits */
        const int *idx = batch + (size_t)m * (size_t)mb;
        int ignore = 0;
        for (int j = 0; j < mb; j++)
            softmax_xent(a[nin] + (size_t)j * NCLASS, NCLASS, d->y[idx[j]], t->dcur + (size_t)j * NCLASS, &ignore);
    } else {
        kvps_result rc = kvps_ring_recv(t->ring, t->dcur, (size_t)mb * (size_t)o->dim[t->l1], KVPS_FLOAT32, t->s + 1,
                                        (uint32_t)(2 * m + 1));
        if (rc != KVPS_OK) die_ring(t->ring, rc, "receive of gradients");
    }
    for (int l = t->l1 - 1; l >= t->l0; l--) {
        float *din = l > t->l0 ? t->dnext : t->s > 0 ? t->dsend[k] : NULL; /* layer 0: no input gradient */
        size_t nw = (size_t)o->dim[l] * (size_t)o->dim[l + 1];
        dense_backward(t->p[l], o->dim[l], o->dim[l + 1], a[l - t->l0], t->dcur, mb, t->g[l], t->g[l] + nw, din);
        if (l > t->l0) {
            float *tmp = t->dcur;
            t->dcur = t->dnext;
            t->dnext = tmp;
        }
    }
    if (t->s > 0) {
        kvps_result rc = kvps_ring_isend(t->ring, t->dsend[k], (size_t)mb * (size_t)o->dim[t->l0], KVPS_FLOAT32,
                                         t->s - 1, (uint32_t)(2 * m + 1), &t->grad_q[k]);
        if (rc != KVPS_OK) die_ring(t->ring, rc, "send of gradients");
        t->grad_pending[k] = 1;
    }
}

/* One step: the schedule's forwards and backwards, then one update of this stage's layers.
   Returns the step's mean loss on the last stage (0 elsewhere). */
static double train_step(stage *t, const dataset *d, const int *batch, float lr, long step) {
    const opts *o = t->o;
    int M = o->micro;
    t->step_loss = 0;
    for (int l = t->l0; l < t->l1; l++) memset(t->g[l], 0, layer_params(o, l) * sizeof(float));
    if (o->sched == SCHED_GPIPE) {
        for (int m = 0; m < M; m++) forward(t, d, batch, m);
        for (int m = 0; m < M; m++) backward(t, d, batch, m);
    } else {
        int warm = t->S - 1 - t->s < M ? t->S - 1 - t->s : M, b = 0;
        for (int m = 0; m < warm; m++) forward(t, d, batch, m);
        for (int m = warm; m < M; m++) {
            forward(t, d, batch, m);
            backward(t, d, batch, b++);
        }
        while (b < M) backward(t, d, batch, b++);
    }
    for (int k = 0; k < t->nslots; k++) slot_drain(t, k);
    for (int l = t->l0; l < t->l1; l++)
        optim_step((optim_rule)o->optim, t->p[l], t->g[l], (float)o->batch, t->st[l], layer_params(o, l), lr, step);
    return t->s == t->S - 1 ? t->step_loss / o->batch : 0;
}

/* Test accuracy through the pipeline, EVAL_CHUNK rows per message; known to the last stage
   (-1 elsewhere). */
static double evaluate(stage *t, const dataset *d) {
    const opts *o = t->o;
    int md = max_dim(o);
    float *x = (float *)xcalloc((size_t)EVAL_CHUNK * (size_t)md, sizeof(float));
    float *y = (float *)xcalloc((size_t)EVAL_CHUNK * (size_t)md, sizeof(float));
    int correct = 0, idx[EVAL_CHUNK];
    for (int c = 0, lo = 0; lo < d->n; c++, lo += EVAL_CHUNK) {
        int n = d->n - lo < EVAL_CHUNK ? d->n - lo : EVAL_CHUNK;
        for (int j = 0; j < n; j++) idx[j] = lo + j;
        if (t->s == 0) {
            load_rows(x, d, idx, n);
        } else {
            kvps_result rc = kvps_ring_recv(t->ring, x, (size_t)n * (size_t)o->dim[t->l0], KVPS_FLOAT32, t->s - 1,
                                            TAG_EVAL + (uint32_t)c);
            if (rc != KVPS_OK) die_ring(t->ring, rc, "receive of test activations");
        }
        for (int l = t->l0; l < t->l1; l++) {
            dense_forward(t->p[l], t->p[l] + (size_t)o->dim[l] * (size_t)o->dim[l + 1], o->dim[l], o->dim[l + 1], x, y,
                          n, l + 1 < o->nl);
            float *tmp = x;
            x = y;
            y = tmp;
        }
        if (t->s < t->S - 1) {
            kvps_result rc = kvps_ring_send(t->ring, x, (size_t)n * (size_t)o->dim[t->l1], KVPS_FLOAT32, t->s + 1,
                                            TAG_EVAL + (uint32_t)c);
            if (rc != KVPS_OK) die_ring(t->ring, rc, "send of test activations");
        } else {
            for (int j = 0; j < n; j++) correct += argmax(x + (size_t)j * NCLASS, NCLASS) == d->y[lo + j];
        }
    }
    free(x);
    free(y);
    return t->s == t->S - 1 ? (double)correct / d->n : -1;
}

static int steps_per_epoch(const opts *o, const dataset *train) {
    int steps = train->n / o->batch;
    return o->steps > 0 && o->steps < steps ? o->steps : steps;
}

static float lr_at(const opts *o, long step, long total) {
    return (float)(o->lr * 0.5 * (1.0 + cos(3.141592653589793 * (double)step / (double)total)));
}

/* Trains a stage through every epoch; the last stage records each step's loss in losses (may be
   NULL) and, when report, prints the epoch lines. Returns the final test accuracy (last stage). */
static double train(stage *t, const dataset *train_set, const dataset *test, double *losses, int report,
                    double *train_s) {
    const opts *o = t->o;
    int steps = steps_per_epoch(o, train_set);
    long total = (long)o->epochs * steps, gstep = 0;
    int *perm = (int *)xcalloc((size_t)train_set->n, sizeof *perm);
    double acc = 0;
    *train_s = 0;
    for (int e = 0; e < o->epochs; e++) {
        double t0 = now_s(), loss = 0;
        t->correct = t->seen = 0;
        shuffle(perm, train_set->n, o->seed, e);
        for (int step = 0; step < steps; step++, gstep++) {
            double l = train_step(t, train_set, perm + (size_t)step * o->batch, lr_at(o, gstep, total), gstep + 1);
            if (losses) losses[gstep] = l;
            loss += l;
        }
        double dt = now_s() - t0;
        *train_s += dt;
        acc = t->ring || report ? evaluate(t, test) : 0; /* every stage takes part; the reference skips it */
        if (report) {
            printf("%5d %8.4f %10.4f %9.4f %10.0f %8.3f %7.2f\n", e + 1, loss / steps, (double)t->correct / t->seen,
                   acc, (double)steps * o->batch / dt, 1e3 * dt / steps, now_s() - t0);
            fflush(stdout);
        }
    }
    free(perm);
    return acc;
}

static long peak_rss_kib(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

/* One rank (ring NULL: --stages 1). The last stage prints. Returns the exit code. */
static int stage_main(const opts *o, kvps_ring *ring, int s, const dataset *train_set, const dataset *test) {
    g_rank = s;
    int S = o->stages, last = s == S - 1;
    stage t;
    stage_setup(&t, o, ring, s, S);
    int steps = steps_per_epoch(o, train_set);
    long total = (long)o->epochs * steps;
    double *losses = last ? (double *)xcalloc((size_t)total, sizeof(double)) : NULL;
    static const char *sn[] = {"gpipe", "1f1b"};
    if (last) {
        int cut[MAX_STAGES + 1];
        place(o, cut);
        printf("pipeline: mlp");
        for (int l = 0; l <= o->nl; l++) printf("%c%d", l ? '-' : ' ', o->dim[l]);
        printf(" over %d stage%s (", S, S > 1 ? "s" : "");
        for (int i = 0; i < S; i++) {
            size_t p = 0;
            for (int l = cut[i]; l < cut[i + 1]; l++) p += layer_params(o, l);
            printf("%sstage %d: layers %d-%d, %zu parameters", i ? "; " : "", i, cut[i] + 1, cut[i + 1], p);
        }
        printf(")\n");
        printf("pipeline: %s, %d micro-batches of %d, global batch %d; %d epochs of %d steps; %s lr %g with cosine "
               "decay, seed %llu\n", sn[o->sched], o->micro, o->batch / o->micro, o->batch, o->epochs, steps,
               optim_rules[o->optim].name, (double)o->lr, (unsigned long long)o->seed);
        printf("pipeline: loss and train_acc: means over the epoch's steps and samples; test_acc: the whole test set "
               "through the pipeline\n");
        printf("%5s %8s %10s %9s %10s %8s %7s\n", "epoch", "loss", "train_acc", "test_acc", "samples/s", "step_ms",
               "time_s");
        fflush(stdout);
    }
    double t0 = now_s(), train_s = 0;
    double acc = train(&t, train_set, test, losses, last, &train_s);
    double wall_s = now_s() - t0;

    /* Every stage's memory to the last one. */
    int64_t mine[5] = {(int64_t)t.param_bytes, (int64_t)t.param_bytes, (int64_t)t.state_bytes, (int64_t)t.stash_bytes,
                       peak_rss_kib()}, all[5 * MAX_STAGES];
    if (ring) {
        kvps_result rc = kvps_ring_gather(ring, mine, all, 5, KVPS_INT64, S - 1);
        if (rc != KVPS_OK) die_ring(ring, rc, "gather of memory figures");
    } else {
        memcpy(all, mine, sizeof mine);
    }
    int rc = 0;
    if (last) {
        printf("\nresult:\n");
        printf("  %6s %5s %8s %6s %5s %7s %8s %8s %7s %7s\n", "stages", "micro", "schedule", "epochs", "batch", "lr",
               "test_acc", "step_ms", "train_s", "wall_s");
        printf("  %6d %5d %8s %6d %5d %7g %8.4f %8.3f %7.1f %7.1f\n", S, o->micro, sn[o->sched], o->epochs, o->batch,
               (double)o->lr, acc, 1e3 * train_s / (double)total, train_s, wall_s);
        printf("pipeline: step_ms %.3f (train_s / steps)\n", 1e3 * train_s / (double)total);
        for (int i = 0; i < S; i++)
            printf("memory: stage %d params_bytes %lld grad_bytes %lld state_bytes %lld act_stash_bytes %lld "
                   "peak_rss_kib %lld\n", i, (long long)all[5 * i], (long long)all[5 * i + 1], (long long)all[5 * i + 2],
                   (long long)all[5 * i + 3], (long long)all[5 * i + 4]);
        printf("pipeline: final loss %.9g (step %ld)\n", losses[total - 1], total);
        if (o->target > 0) {
            printf("pipeline: test accuracy %.4f %s target %.4f\n", acc, acc >= o->target ? ">=" : "BELOW", o->target);
            if (acc < o->target) rc = 3;
        }
        fflush(stdout);
        if (o->check) { /* the same micro-batches, the same maths, one process holding every layer */
            double c0 = now_s(), ref_s = 0, worst = 0;
            long worst_at = 0;
            opts one = *o;
            one.stages = 1;
            stage r;
            stage_setup(&r, &one, NULL, 0, 1);
            double *ref = (double *)xcalloc((size_t)total, sizeof(double));
            (void)train(&r, train_set, test, ref, 0, &ref_s);
            for (long i = 0; i < total; i++) {
                double rel = fabs(losses[i] - ref[i]) / (fabs(ref[i]) > 0 ? fabs(ref[i]) : 1);
                if (!(rel <= worst)) { worst = rel; worst_at = i + 1; }
            }
            int pass = worst < 1e-5;
            printf("check: one-process reference, %ld steps (%.1f s): max relative loss difference %.3g (step %ld)%s: "
                   "%s\n", total, now_s() - c0, worst, worst_at ? worst_at : total, worst == 0 ? ", bit-identical" : "",
                   pass ? "PASS (< 1e-05)" : "FAIL (>= 1e-05)");
            if (!pass) {
                printf("check: step %ld: pipeline loss %.9g, reference %.9g\n", worst_at, losses[worst_at - 1],
                       ref[worst_at - 1]);
                if (rc == 0) rc = 4;
            }
            fflush(stdout);
            free(ref);
            stage_free(&r);
        }
    }
    free(losses);
    stage_free(&t);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   Standalone: fork the stages, hand out the endpoints, wait. */
static int rank_child(const opts *o, int s, int up, int down, const dataset *train_set, const dataset *test) {
    g_rank = s;
    kvps_ring *ring = NULL;
    kvps_result r = kvps_ring_create(&(kvps_ring_desc){.rank = s, .size = o->stages, .bind = "tcp://127.0.0.1:*",
                                                       .timeout_ms = WAIT_MS}, &ring);
    if (r != KVPS_OK) die_ring(ring, r, "create");
    char line[300];
    int len = snprintf(line, sizeof line, "%s\n", kvps_ring_endpoint(ring));
    if (write(up, line, (size_t)len) != len) { perror("pipeline: write"); return 1; }
    close(up);
    char *peers = (char *)xcalloc((size_t)o->stages, 300);
    if (launch_read_line(down, peers, (size_t)o->stages * 300, 30000) != 0) {
        fprintf(stderr, "pipeline: stage %d: no peer list from the parent\n", s);
        return 1;
    }
    close(down);
    r = kvps_ring_connect(ring, peers);
    if (r != KVPS_OK) die_ring(ring, r, "connect");
    free(peers);
    int rc = stage_main(o, ring, s, train_set, test);
    kvps_ring_destroy(&ring);
    return rc;
}

static int run_local(const opts *o, const dataset *train_set, const dataset *test) {
    int S = o->stages, rc = 0, up[MAX_STAGES], down[MAX_STAGES], done = 0;
    pid_t pid[MAX_STAGES];
    int status[MAX_STAGES];
    double t0 = now_s();
    char *peers = (char *)xcalloc((size_t)S, 300);
    for (int s = 0; s < S; s++) {
        int fu[2], fd[2];
        if (pipe(fu) != 0 || pipe(fd) != 0) { perror("pipeline: pipe"); return 1; }
        fflush(NULL);
        pid[s] = fork();
        if (pid[s] < 0) { perror("pipeline: fork"); return 1; }
        if (pid[s] == 0) {
            for (int j = 0; j < s; j++) { close(up[j]); close(down[j]); }
            close(fu[0]);
            close(fd[1]);
            int crc = rank_child(o, s, fu[1], fd[0], train_set, test);
            fflush(NULL);
            _exit(crc);
        }
        close(fu[1]);
        close(fd[0]);
        up[s] = fu[0];
        down[s] = fd[1];
        status[s] = -1;
    }
    for (int s = 0; s < S && rc == 0; s++) {
        char ep[256];
        if (launch_read_line(up[s], ep, sizeof ep, 15000) != 0) {
            fprintf(stderr, "pipeline: stage %d did not report its endpoint\n", s);
            rc = 1;
        } else {
            launch_list_add(peers, (size_t)S * 300, ep);
        }
    }
    size_t len = strlen(peers);
    peers[len] = '\n';
    for (int s = 0; s < S && rc == 0; s++)
        if (write(down[s], peers, len + 1) != (ssize_t)(len + 1)) { perror("pipeline: write"); rc = 1; }
    for (int s = 0; s < S; s++) { close(up[s]); close(down[s]); }
    free(peers);
    /* Wait for every stage; the first failure, or the deadline, stops the rest. */
    while (done < S) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int s = 0; s < S; s++) {
                if (pid[s] != p) continue;
                status[s] = st;
                done++;
                int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
                if (code != 0 && rc == 0) {
                    if (code != 3 && code != 4) fprintf(stderr, "pipeline: stage %d %s %d\n", s,
                                                        WIFEXITED(st) ? "exited with code" : "was killed by signal",
                                                        WIFEXITED(st) ? code : WTERMSIG(st));
                    rc = code == 3 || code == 4 ? code : 1;
                }
            }
            continue;
        }
        if (rc == 1 || now_s() - t0 > o->timeout_s) {
            if (rc == 0) { fprintf(stderr, "pipeline: timed out after %d s (--timeout)\n", o->timeout_s); rc = 1; }
            for (int s = 0; s < S; s++)
                if (status[s] == -1) kill(pid[s], SIGKILL);
        }
        sleep_ms(20);
    }
    if (rc == 0 || rc == 3 || rc == 4) printf("pipeline: %d ranks finished in %.1f s\n", S, now_s() - t0);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc != 0) return rc;
    static dataset train_set, test;
    if (kvps_env_launched()) { /* one stage per process */
        int rank = 0, size = 0;
        const char *peers = NULL;
        if (kvps_ring_env_read(&rank, &size, &peers) != KVPS_OK) {
            fprintf(stderr, "pipeline: under a launcher it needs KVPS_RANK, KVPS_SIZE (or the MPI/Slurm rank and size)\n"
                            "  and KVPS_RING_PEERS (one endpoint per stage)\n");
            return 2;
        }
        o.stages = size;
        if ((rc = check_opts(&o)) != 0) return rc;
        if (datasets_load(o.data, &train_set, &test) != 0) return 2;
        g_rank = rank;
        kvps_ring *ring = NULL;
        kvps_result r = kvps_ring_create(&(kvps_ring_desc){.rank = rank, .size = size, .peers = peers,
                                                           .timeout_ms = WAIT_MS}, &ring);
        if (r != KVPS_OK) die_ring(ring, r, "create");
        rc = stage_main(&o, size > 1 ? ring : NULL, rank, &train_set, &test);
        kvps_ring_destroy(&ring);
        return rc;
    }
    if ((rc = check_opts(&o)) != 0) return rc;
    if (datasets_load(o.data, &train_set, &test) != 0) return 2; /* before the forks: shared pages */
    if (o.stages == 1) return stage_main(&o, NULL, 0, &train_set, &test);
    return run_local(&o, &train_set, &test);
}
