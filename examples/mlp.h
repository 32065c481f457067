/* mlp.h - dense layers and optimizer rules for the Fashion-MNIST examples (fmnist.c, pipeline.c):
   a layer's forward and backward over a batch of rows, the softmax cross-entropy, and SGD /
   momentum / Adam on a flat vector (element by element, so a shard is updated as the whole is).

   Every sum runs in one fixed order (sample after sample, input after input), so the same inputs
   give the same bits in every process, whether a batch goes layer by layer (fmnist --mode fsdp,
   pipeline.c) or sample by sample through the whole net (fmnist's other modes). Build with
   -ffp-contract=off (the Makefile does) or a compiler may fuse some of them and not others.

     axpy, dot                      the two loops everything is made of
     dense_forward, dense_backward  one layer over bs rows (weights: row k = input k)
     softmax_xent                   loss, d loss / d logits and the prediction of one sample
     optim_rules, optim_step        sgd, momentum, adam: state per element, default lr, one step */
#ifndef KVPS_EXAMPLES_MLP_H
#define KVPS_EXAMPLES_MLP_H

#include <math.h>
#include <stddef.h>
#include <string.h>

/* y += a * x. Blocks of 8 with a fixed trip count so -O2 vectorises them. */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int u = 0; u < 8; u++) y[j + u] += a * x[j + u];
    for (; j < n; j++) y[j] += a * x[j];
}

static inline float dot(const float *restrict x, const float *restrict y, int n) {
    float s = 0.0f;
    for (int j = 0; j < n; j++) s += x[j] * y[j];
    return s;
}

/* out (bs x nout) = in (bs x nin) times w (nin x nout) plus b, through a ReLU when relu. Zero
   inputs (about half the pixels and ReLUs) are skipped. */
static inline void dense_forward(const float *w, const float *b, int nin, int nout, const float *in, float *out, int bs,
                          int relu) {
    for (int j = 0; j < bs; j++) {
        const float *a = in + (size_t)j * (size_t)nin;
        float *z = out + (size_t)j * (size_t)nout;
        memcpy(z, b, (size_t)nout * sizeof *z);
        for (int k = 0; k < nin; k++)
            if (a[k] != 0.0f) axpy(z, a[k], w + (size_t)k * (size_t)nout, nout);
        if (relu)
            for (int c = 0; c < nout; c++) z[c] = z[c] > 0.0f ? z[c] : 0.0f;
    }
}

/* Adds the batch's gradient to gw (nin x nout) and gb (nout), sample after sample, given dout (bs
   x nout, d loss / d this layer's pre-activation). din, unless NULL: d loss / d the layer
   below's pre-activation (bs x nin), zero where in <= 0: in is that layer's ReLU output. */
static inline void dense_backward(const float *w, int nin, int nout, const float *in, const float *dout, int bs, float *gw,
                           float *gb, float *din) {
    for (int j = 0; j < bs; j++) {
        const float *a = in + (size_t)j * (size_t)nin, *dl = dout + (size_t)j * (size_t)nout;
        for (int c = 0; c < nout; c++) gb[c] += dl[c];
        for (int k = 0; k < nin; k++)
            if (a[k] != 0.0f) axpy(gw + (size_t)k * (size_t)nout, a[k], dl, nout);
        if (din) {
            float *da = din + (size_t)j * (size_t)nin;
            for (int k = 0; k < nin; k++) da[k] = a[k] > 0.0f ? dot(w + (size_t)k * (size_t)nout, dl, nout) : 0.0f;
        }
    }
}

static inline int argmax(const float *z, int n) {
    int best = 0;
    for (int c = 1; c < n; c++)
        if (z[c] > z[best]) best = c;
    return best;
}

/* One sample's logits z[n]: d = softmax(z) - onehot(label) (d may be NULL), *correct += the
   prediction is right. Returns the cross-entropy. */
static inline float softmax_xent(const float *z, int n, int label, float *d, int *correct) {
    float e[64]; /* n <= 64 */
    int top = argmax(z, n);
    float sum = 0.0f;
    for (int c = 0; c < n; c++) sum += (e[c] = expf(z[c] - z[top]));
    *correct += top == label;
    if (d) {
        for (int c = 0; c < n; c++) d[c] = e[c] / sum;
        d[label] -= 1.0f;
    }
    return logf(sum) - (z[label] - z[top]);
}

/* ---------------------------------------------------------------------------------------------
   Optimizer rules, one row each: how many floats of state per parameter, the default lr. */
typedef enum optim_rule { OPTIM_SGD, OPTIM_MOMENTUM, OPTIM_ADAM, OPTIM_COUNT } optim_rule;

static const struct { const char *name; int state; float lr; } optim_rules[OPTIM_COUNT] = {
    [OPTIM_SGD] = {"sgd", 0, 0.3f},          /* w -= lr g */
    [OPTIM_MOMENTUM] = {"momentum", 1, 0.03f}, /* v = 0.9 v + g; w -= lr v */
    [OPTIM_ADAM] = {"adam", 2, 0.001f},      /* beta 0.9, 0.999, eps 1e-8, bias-corrected */
};

/* -1 when name is none of them. */
static inline int optim_parse(const char *name) {
    for (int i = 0; i < OPTIM_COUNT; i++)
        if (strcmp(name, optim_rules[i].name) == 0) return i;
    return -1;
}

/* One step of rule on n parameters w with gradient g / div (div: the ranks summed into g, or 1),
   state: optim_rules[rule].state * n floats (momentum: v; Adam: m then v), zero at first;
   t >= 1 counts the steps (Adam's bias correction). Element by element: a rank holding a shard
   of w, g and state computes exactly the bits the whole would. */
static inline void optim_step(optim_rule rule, float *w, const float *g, float div, float *state, size_t n, float lr,
                       long t) {
    if (rule == OPTIM_SGD) {
        for (size_t k = 0; k < n; k++) w[k] -= lr * (g[k] / div);
    } else if (rule == OPTIM_MOMENTUM) {
        for (size_t k = 0; k < n; k++) {
            state[k] = 0.9f * state[k] + g[k] / div;
            w[k] -= lr * state[k];
        }
    } else {
        float *m = state, *v = state + n;
        float c1 = (float)(1.0 / (1.0 - pow(0.9, (double)t))), c2 = (float)(1.0 / (1.0 - pow(0.999, (double)t)));
        for (size_t k = 0; k < n; k++) {
            float gk = g[k] / div;
            m[k] = 0.9f * m[k] + 0.1f * gk;
            v[k] = 0.999f * v[k] + 0.001f * gk * gk;
            w[k] -= lr * (m[k] * c1) / (sqrtf(v[k] * c2) + 1e-8f);
        }
    }
}

#endif
