/* test_costmodel - bench/costmodel.h: its formulas against cases worked by hand, and its copy of
   AUTO against the algorithm kvps_ring.h itself chooses (rings as threads over inproc, the
   choice read from the ring's timeline state). No timing: deterministic. */
#define KVPS_IMPLEMENTATION
#include "kvps_ring.h"
#include "tests/kvps_test.h"
#include "bench/costmodel.h"

static int near(double x, double y) { return fabs(x - y) <= 1e-9 * (fabs(y) > 1 ? fabs(y) : 1); }

static cm_net unit_net(double a, double b, double g, double c) {
    cm_net n;
    memset(&n, 0, sizeof n);
    n.a = a; n.b = b; n.g = g; n.c = c; n.q = 1; n.small = 512 << 10;
    n.a_in = a; n.b_in = b;
    return n;
}

static void test_formulas(void) {
    cm_net n = unit_net(1, 1e-3, 0, 1e12); /* alpha 1 s, beta 1 ms/B, no reduction cost, one piece */
    /* RD, 4 ranks, 1000 B: 2 exchanges of (1 + 1) */
    KT_CHECK(near(cm_allreduce(&n, CM_RD, 4, 1000), 4), "rd4 %g", cm_allreduce(&n, CM_RD, 4, 1000));
    /* RD, 3 ranks: one exchange among 2, plus the fold (1 + 1) and the answer (1 + 1) */
    KT_CHECK(near(cm_allreduce(&n, CM_RD, 3, 1000), 6), "rd3 %g", cm_allreduce(&n, CM_RD, 3, 1000));
    /* RING, 4 ranks, 1000 B, one piece: 6 steps of (1 + 0.25) */
    KT_CHECK(near(cm_allreduce(&n, CM_RING, 4, 1000), 7.5), "ring4 %g", cm_allreduce(&n, CM_RING, 4, 1000));
    /* RHD, 4 ranks: halving 500 then 250, doubling 250 then 500: 4 alphas + 1.5 */
    KT_CHECK(near(cm_allreduce(&n, CM_RHD, 4, 1000), 5.5), "rhd4 %g", cm_allreduce(&n, CM_RHD, 4, 1000));
    /* RHD on 6 ranks runs RING (10 steps of 1 + 1000/6 ms) */
    KT_CHECK(near(cm_allreduce(&n, CM_RHD, 6, 1000), 10 * (1 + 1.0 / 6)), "rhd6 %g", cm_allreduce(&n, CM_RHD, 6, 1000));
    /* pipelined RING, 2 ranks, 8 B in pieces of 1, alpha 0, beta 1: the port's 8 B */
    cm_net p = unit_net(0, 1, 0, 1);
    KT_CHECK(near(cm_allreduce(&p, CM_RING, 2, 8), 8), "ring pipelined %g", cm_allreduce(&p, CM_RING, 2, 8));
    /* the same with alpha 10: the first piece's way (2 hops of 11) then 3 more pieces = 25 */
    p.a = 10;
    KT_CHECK(near(cm_allreduce(&p, CM_RING, 2, 8), 25), "ring chain %g", cm_allreduce(&p, CM_RING, 2, 8));
    /* a reducing step with gamma above beta runs at gamma: 4 pieces of 1, b 1, g 3: 1*(1+3) + 3*3 */
    KT_CHECK(near(cm_step(0, 1, 3, 1, 4, 1), 13), "step %g", cm_step(0, 1, 3, 1, 4, 1));
    /* BIRING adds one message overhead o per step (2(p-1) of them) */
    n.o = 0.5;
    KT_CHECK(near(cm_allreduce(&n, CM_BIRING, 4, 1000), 7.5 + 3), "biring %g", cm_allreduce(&n, CM_BIRING, 4, 1000));
    KT_CHECK(near(cm_allreduce(&n, CM_BIRING, 2, 1000), cm_allreduce(&n, CM_RING, 2, 1000)), "biring2");
    n.o = 0;
    /* PS: 2 servers, 4 workers, 100 B, separate hosts: each server takes 4 x 50 in and out */
    cm_net s = unit_net(0, 1, 0, 1e12);
    KT_CHECK(near(cm_ps(&s, 2, 4, 100, 1, 0), 400), "ps sep %g", cm_ps(&s, 2, 4, 100, 1, 0));
    /* n = m = 4 colocated: 3/4 of 100 each way, push and pull */
    KT_CHECK(near(cm_ps(&s, 4, 4, 100, 1, 1), 150), "ps coloc %g", cm_ps(&s, 4, 4, 100, 1, 1));
    /* one server, m workers: 2 m S b (the notes' 2 m T), plus 2 alpha and m requests of o */
    s.a = 3; s.o = 2;
    KT_CHECK(near(cm_ps(&s, 1, 8, 100, 1, 0), 6 + 1600 + 16), "ps one server %g", cm_ps(&s, 1, 8, 100, 1, 0));
    /* HIER, groups of 2 on 4 ranks, small (tree in the group, RD among 2 leaders, tree back):
       (1 + 1) + (1 + 1) + (1 + 1) with a_in = a, b_in = b */
    n.q = 2;
    KT_CHECK(near(cm_allreduce(&n, CM_HIER, 4, 1000), 6), "hier small %g", cm_allreduce(&n, CM_HIER, 4, 1000));
    /* CPU bound: 2 ranks sharing 1 CPU, RD of 1000 B with kappa 1e-3, mu 0: per rank 2000 B -> 2 x 2 = 4 s,
       above the link's 2 s */
    cm_net c = unit_net(1, 1e-3, 0, 1e12);
    c.kappa = 1e-3; c.ncpu = 1; c.share = 2;
    KT_CHECK(near(cm_allreduce(&c, CM_RD, 2, 1000), 4), "cpu bound %g", cm_allreduce(&c, CM_RD, 2, 1000));
}

static void test_auto_rule(void) {
    cm_net n = unit_net(0, 0, 0, 1 << 20);
    KT_CHECK(cm_runs(CM_AUTO, 8, 512 << 10, &n) == CM_RD, "at small_bytes: rd");
    KT_CHECK(cm_runs(CM_AUTO, 8, (512 << 10) + 4, &n) == CM_RHD, "past it, 8 ranks: rhd");
    KT_CHECK(cm_runs(CM_AUTO, 8, (16 << 20) + 4, &n) == CM_RING, "past 16 MiB: ring");
    KT_CHECK(cm_runs(CM_AUTO, 6, 1 << 20, &n) == CM_RING, "6 ranks: ring");
    KT_CHECK(cm_runs(CM_AUTO, 2, 1 << 20, &n) == CM_RING, "2 ranks: ring");
    KT_CHECK(cm_runs(CM_AUTO, 1024, 16 << 20, &n) == CM_RHD, "1024 ranks, 16 MiB: rhd");
    n.q = 8;
    KT_CHECK(cm_runs(CM_AUTO, 1024, 1 << 20, &n) == CM_HIER, "groups: hier");
    KT_CHECK(cm_runs(CM_AUTO, 1024, 4096, &n) == CM_HIER, "groups, small: hier (issue 30)");
}

/* ---- AUTO against kvps_ring.h ---------------------------------------------------------------- */

/* Every rank all-reduces *(const size_t *)arg bytes once; the algorithm its ring ran, read from
   its timeline state, goes to chk_algo[rank] (-2: the all-reduce failed, -3: no timeline). */
static int chk_algo[KT_MAXR];

static void chk_main(kt_rk *x) {
    size_t bytes = *(const size_t *)x->t->arg;
    float *buf = (float *)calloc(bytes / 4 + 1, 4);
    if (kt_rk_call(x, kvps_ring_allreduce(x->r, buf, buf, bytes / 4, KVPS_FLOAT32, KVPS_SUM), "allreduce"))
        chk_algo[x->rank] = x->r->tl ? x->r->tl->algo : -3;
    free(buf);
}

/* The algorithm kvps_ring.h runs for one all-reduce of `bytes` on `size` ranks (groups of 2 or
   none, small_bytes `small`), a team of rings as threads (kt_team): the one every rank ran, -1
   when they differ (a rank that failed, reported by kt_team_run, has -2). */
static int kvps_choice(const char *tl, int size, size_t bytes, int groups, size_t small) {
    int grp[KT_MAXR];
    for (int i = 0; i < size; i++) grp[i] = i / 2;
    for (int i = 0; i < size; i++) chk_algo[i] = -2;
    kt_team t;
    kt_team_init(&t, "AUTO", chk_main, size, 0, 30000);
    t.base.small_bytes = small;
    t.base.groups = groups ? grp : NULL;
    t.base.timeline = tl;
    t.base.shm = -1; /* costmodel.h models the ring over ZeroMQ (TCP); on one host AUTO may pick DIRECT */
    t.arg = &bytes;
    kt_team_run(&t); /* (a rank that failed is reported) */
    int algo = chk_algo[0];
    for (int i = 1; i < size; i++)
        if (chk_algo[i] != algo) algo = -1;
    return algo;
}

static void test_auto_matches_kvps(void) {
    char tl[] = "/tmp/test_costmodel-XXXXXX";
    KT_CHECK(mkdtemp(tl) != NULL, "mkdtemp");
    int cases = 0;
    for (int si = 0; si < 2; si++) {
        size_t sm = si ? 64 << 10 : 512 << 10;
        for (int size = 2; size <= 8; size++) {
            size_t sizes[] = {4096, sm, sm + 4, 1 << 20, 16 << 20, (16 << 20) + 4};
            int nsz = size == 4 || size == 6 ? 6 : 4; /* 16 MiB (RHD's limit) at 4 (RHD) and 6 (RING) ranks */
            for (int j = 0; j < nsz; j++)
                for (int g = 0; g < 2; g++) {
                    if (g && size < 3) continue;
                    cm_net n;
                    memset(&n, 0, sizeof n);
                    n.q = g ? 2 : 1;
                    n.small = (double)sm;
                    int kv = kvps_choice(tl, size, sizes[j], g, sm), me = cm_runs(CM_AUTO, size, (double)sizes[j], &n);
                    KT_CHECK(kv == me, "%d ranks, %zu B, groups %s, small_bytes %zu: kvps_ring.h %s, costmodel.h %s", size,
                             sizes[j], g ? "of 2" : "none", sm, kv >= 0 ? cm_algo_names[kv] : "?", cm_algo_names[me]);
                    cases++;
                }
        }
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tl);
    KT_CHECK(system(cmd) == 0, "rm %s", tl);
    printf("  %d cases of AUTO compared with kvps_ring.h's own choice\n", cases);
}

int main(void) {
    KT_RUN(test_formulas);
    KT_RUN(test_auto_rule);
    KT_RUN(test_auto_matches_kvps, 120);
    return kt_finish();
}
