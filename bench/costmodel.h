/* costmodel.h - an alpha-beta-gamma (Hockney, with a reduction term) cost model of kvps's
   all-reduce algorithms and of its parameter server, and a copy of kvps_ring.h's AUTO rule.
   Plain C99 + libm, no kvps: bench/costmodel.c (the tables), tests/test_costmodel.c (the
   formulas against hand-computed cases, AUTO against kvps_ring.h's own choice) include it.

   Constants (seconds, seconds per byte):
     a    alpha: one message's latency, end to end (software + wire)
     b    beta: per byte on a link (each host: one full-duplex port)
     g    gamma: per byte reduced (float32 sum, kvps_reduce_into on a piece in cache)
     o    per-message overhead on a receiver that takes many messages (a PS server: per request)
     c    the pipeline piece (.chunk_bytes, 1 MiB)
     a_in, b_in  the same inside a host (HIER's groups, ranks sharing a host): kvps over loopback
     q    ranks per host (1: one rank a host; HIER's groups are the hosts)
   Pieces: a block of m bytes goes as np = ceil(m / c) messages of cp = m / np. A step that
   reduces what it receives overlaps the reduction of a piece with the transfer of the next (the
   ring's thread reduces while ZeroMQ's I/O thread moves bytes), so its steady rate is
   max(b, g) per byte, plus one piece of both at the ends:
     step(m, red) = a + cp (b + red g) + (np - 1) cp max(b, red g)
   RING (reduce-scatter then all-gather, 2(p-1) steps of S/p; a piece is forwarded as soon as it is
   reduced, so steps overlap too): the first piece's way round the ring, or the port's bytes,
   whichever is longer:
     chain = (p-1)(a + cp(b+g)) + (p-1)(a + cp b) + (np-1) cp max(b,g)
     port  = a + cp g + (p-1) np cp max(b,g) + (p-1) np cp b
     T     = max(chain, port)
   BIRING: two rings of S/2 in opposite directions through the same port (one NIC per host): the
     same bytes per port as RING, twice the messages per step: RING(S) + 2(p-1) o (p < 3: RING).
   RD (recursive doubling, whole buffer, one message a step; p2 = largest power of two <= p,
     rem = p - p2 ranks folded in first and answered last):
     T = log2(p2) (a + S(b+g)) + [rem > 0] ((a + S(b+g)) + (a + S b))
   RHD (Rabenseifner; p a power of two, else RING): halving steps k = 1..log2 p of m = S / 2^k
     (reduce), then doubling (copy): sum of step(S/2^k, 1) + step(S/2^k, 0).
   HIER (groups of q ranks on one host, G = p / q hosts; kvps_ring.h's hier: large = S > small):
     reduce in the group to its first rank: large: ring reduce-scatter + gather of q-1 blocks to
       the root; small: binomial tree, ceil(log2 q) (a_in + S(b_in+g))
     leaders: RING (large) or RD (small) over G hosts with a, b
     broadcast in the group: large: pipelined chain (q-1)(a_in + cp b_in) + (np-1) cp b_in;
       small: binomial tree ceil(log2 q)(a_in + S b_in)
   Ranks sharing hosts (q > 1) for the flat algorithms: a step between ranks of one host uses
   a_in / b_in; a step across hosts uses a / b, and where every rank of a host crosses at once
   (RD and RHD partners at distance >= q) they share the port: b x q. RING and BIRING cross with
   one rank per host per step.
   PS (n servers, m workers, the model S cut into n slices, BSP push+pull of K tensors):
     separate hosts: push = max(S b, m S/n b, m S/n g), pull = max(S b, m S/n b)
     colocated (n = m, a server and a worker on every host): push = pull = (m-1)/m S b
       (the server's own worker's slice stays in the host), reduction max'ed in as above
     T = 2a + push + pull + m K o   (request and reply; the server takes m K requests)
   CPU (a second resource, optional): a rank's work is mu per message and kappa per byte it sends
   or receives, g per byte it reduces; `share` ranks on `ncpu` CPUs take at least
     share x work / ncpu
   and the time is the larger of that and the link model above. Here (2 vCPUs) every rank and
   every namespace host shares the two CPUs: share = p, ncpu = 2.
*/
#ifndef COSTMODEL_H
#define COSTMODEL_H
#include <math.h>
#include <stddef.h>

enum { CM_AUTO = 0, CM_RING = 1, CM_BIRING = 2, CM_RD = 3, CM_HIER = 4, CM_RHD = 5, CM_ALGOS = 6 };
static const char *const cm_algo_names[CM_ALGOS] = {"auto", "ring", "biring", "rd", "hier", "rhd"};

typedef struct cm_net {
    double a, b, g, o, c;
    double a_in, b_in;
    int q;              /* ranks per host (groups of q for HIER); 1: one rank a host */
    double small;       /* .small_bytes (AUTO and HIER's large/small), 512 KiB */
    /* CPU (0: not modelled): kappa s per byte sent or received, mu s per message sent or received,
       ncpu CPUs shared by `share` ranks (loopback and the namespaces here: all ranks on 2 vCPUs) */
    double kappa, mu, ncpu;
    int share;
} cm_net;

static double cm_max(double x, double y) { return x > y ? x : y; }
static int cm_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }
static int cm_log2(int p) { int l = 0; while ((1 << (l + 1)) <= p) l++; return l; }
static int cm_clog2(int p) { int l = 0; while ((1 << l) < p) l++; return l; }

/* Pieces of a block of m bytes. */
static void cm_pieces(double m, double c, double *np, double *cp) {
    *np = m > c ? ceil(m / c) : 1;
    *cp = m / *np;
}

/* One exchange step of m bytes each way, pipelined in pieces; red: the received bytes are reduced. */
static double cm_step(double a, double b, double g, double c, double m, int red) {
    if (m <= 0) return 0;
    double np, cp, gr = red ? g : 0;
    cm_pieces(m, c, &np, &cp);
    return a + cp * (b + gr) + (np - 1) * cp * cm_max(b, gr);
}

/* The ring over p ranks with per-hop constants a, b (reduce-scatter: rs, all-gather: ag). */
static double cm_ring_ab(double a, double b, double g, double c, int p, double S, int rs, int ag) {
    if (p < 2 || S <= 0) return 0;
    double m = S / p, np, cp;
    cm_pieces(m, c, &np, &cp);
    double chain = 0, port = a;
    if (rs) { chain += (p - 1) * (a + cp * (b + g)); port += cp * g + (p - 1) * np * cp * cm_max(b, g); }
    if (ag) { chain += (p - 1) * (a + cp * b); port += (p - 1) * np * cp * b; }
    chain += (np - 1) * cp * (rs ? cm_max(b, g) : b);
    return cm_max(chain, port);
}

/* The constants of a step between ranks at distance d (in rank order) when q ranks share a host;
   all: every rank of the host crosses at once (RD, RHD), so they share the port. */
static void cm_hop(const cm_net *n, int p, int d, int all, double *a, double *b) {
    if (n->q <= 1) { *a = n->a; *b = n->b; return; }
    if (d < n->q || p <= n->q) { *a = n->a_in; *b = n->b_in; return; } /* partners in one host */
    *a = n->a;
    *b = all ? n->b * n->q : n->b;
    if (*b < n->b_in) *b = n->b_in;
}

static double cm_ring(const cm_net *n, int p, double S) {
    double a = n->a, b = n->b;
    if (n->q > 1) { /* a ring in rank order: steps mix hops inside and across hosts, the slowest sets the pace */
        a = p > n->q ? cm_max(n->a, n->a_in) : n->a_in;
        b = p > n->q ? cm_max(n->b, n->b_in) : n->b_in;
    }
    return cm_ring_ab(a, b, n->g, n->c, p, S, 1, 1);
}

static double cm_biring(const cm_net *n, int p, double S) {
    if (p < 3) return cm_ring(n, p, S);
    return cm_ring(n, p, S) + 2.0 * (p - 1) * n->o;
}

static double cm_rd(const cm_net *n, int p, double S) {
    if (p < 2 || S <= 0) return 0;
    int p2 = 1 << cm_log2(p), rem = p - p2;
    double t = 0, a, b;
    for (int mask = 1; mask < p2; mask <<= 1) {
        /* partners nid ^ mask; with the fold, rank distance about 2 mask for the first ranks */
        cm_hop(n, p, mask, 1, &a, &b);
        t += a + S * (b + n->g);
    }
    if (rem > 0) {
        cm_hop(n, p, 1, 0, &a, &b);
        t += (a + S * (b + n->g)) + (a + S * b);
    }
    return t;
}

static double cm_rhd(const cm_net *n, int p, double S) {
    if (!cm_pow2(p)) return cm_ring(n, p, S);
    if (p < 2 || S <= 0) return 0;
    double t = 0, m = S, a, b;
    for (int mask = p >> 1; mask >= 1; mask >>= 1) {
        m /= 2;
        cm_hop(n, p, mask, 1, &a, &b);
        t += cm_step(a, b, n->g, n->c, m, 1) + cm_step(a, b, n->g, n->c, m, 0);
    }
    return t;
}

/* kvps_ring.h's hier: groups of q = n->q ranks (hosts); without groups (q <= 1 or one group) RING. */
static double cm_hier(const cm_net *n, int p, double S) {
    int q = n->q;
    if (q <= 1 || p <= q || p % q) return cm_ring(n, p, S);
    int G = p / q, large = S > n->small;
    cm_net lead = *n;
    lead.q = 1; /* leaders: one a host */
    double t = 0, np, cp;
    if (large) {
        t += cm_ring_ab(n->a_in, n->b_in, n->g, n->c, q, S, 1, 0);
        t += (q - 1) * (n->a_in + S / q * n->b_in);
        t += cm_ring(&lead, G, S);
        cm_pieces(S, n->c, &np, &cp);
        t += (q - 1) * (n->a_in + cp * n->b_in) + (np - 1) * cp * n->b_in;
    } else {
        int l = cm_clog2(q);
        t += l * (n->a_in + S * (n->b_in + n->g));
        t += cm_rd(&lead, G, S);
        t += l * (n->a_in + S * n->b_in);
    }
    return t;
}

/* kvps_ring.h's AUTO rule (kvps_ring__allreduce_algo): HIER at every size when the groups are
   several and one has more than one rank, else RD up to small_bytes, else RHD for 4 or more ranks
   up to 16 MiB (a size that is not a power of two runs RING), else RING. multi: the groups rule
   holds. */
static int cm_auto(int p, double S, double small, int multi) {
    int algo = multi ? CM_HIER : S <= small ? CM_RD : p >= 4 && S <= (double)(16 << 20) ? CM_RHD : CM_RING;
    if (algo == CM_RHD && !cm_pow2(p)) algo = CM_RING;
    return algo;
}

/* What kvps runs when algo is forced (the fallbacks of kvps_ring.h). */
static int cm_runs(int algo, int p, double S, const cm_net *n) {
    if (algo == CM_AUTO) return cm_auto(p, S, n->small, n->q > 1 && p > n->q);
    if (algo == CM_RHD && !cm_pow2(p)) return CM_RING;
    if (algo == CM_HIER && (n->q <= 1 || p <= n->q || p % n->q)) return CM_RING;
    if (algo == CM_BIRING && p < 3) return CM_RING;
    return algo;
}

/* CPU work of one rank: messages and bytes sent + received, bytes reduced (the second resource:
   where ranks share a few CPUs, as on this machine, the time is at least the CPUs' share of it). */
static double cm_cpu(const cm_net *n, int algo, int p, double S) {
    if (n->ncpu <= 0 || p < 2 || S <= 0) return 0;
    double msgs, bytes, red, np, cp;
    int p2 = 1 << cm_log2(p), l = cm_log2(p2);
    switch (algo) {
    case CM_RD:
        msgs = 2.0 * l + (p > p2 ? 4.0 * (p - p2) / p : 0);
        bytes = S * msgs;
        red = S * (l + (p > p2 ? (double)(p - p2) / p : 0));
        break;
    case CM_RHD:
        cm_pieces(S / p, n->c, &np, &cp);
        msgs = 4.0 * l * np;
        bytes = 4.0 * (p - 1) / p * S;
        red = (double)(p - 1) / p * S;
        break;
    case CM_HIER: /* (without groups HIER runs RING: cm_runs) */
        { /* averaged over a group's ranks */
            double q = n->q, G = p / n->q;
            if (S > n->small) { /* ring reduce-scatter and gather in the group, leaders' ring, chain broadcast */
                double npq, npg, nps;
                cm_pieces(S / q, n->c, &npq, &cp);
                cm_pieces(S / G, n->c, &npg, &cp);
                cm_pieces(S, n->c, &nps, &cp);
                msgs = 2 * (q - 1) * npq + 2 * (q - 1) / q + 4 * (G - 1) * npg / q + 2 * (q - 1) / q * nps;
                bytes = S * (2 * (q - 1) / q + 2 * (q - 1) / (q * q) + 4 * (G - 1) / (G * q) + 2 * (q - 1) / q);
                red = S * ((q - 1) / q + (G - 1) / (G * q));
            } else { /* trees in the group, RD among the leaders */
                msgs = 4 * (q - 1) / q + 2 * cm_log2(p / n->q) / q;
                bytes = S * msgs;
                red = S * ((q - 1) / q + cm_log2(p / n->q) / q);
            }
        }
        break;
    default: /* RING, BIRING (twice the messages) */
        cm_pieces(S / p, n->c, &np, &cp);
        msgs = 4.0 * (p - 1) * np * (algo == CM_BIRING ? 2 : 1);
        bytes = 4.0 * (p - 1) / p * S;
        red = (double)(p - 1) / p * S;
    }
    return (n->share > 1 ? n->share : 1) * (msgs * n->mu + bytes * n->kappa + red * n->g) / n->ncpu;
}

static double cm_allreduce_link(const cm_net *n, int algo, int p, double S);
static double cm_allreduce(const cm_net *n, int algo, int p, double S) {
    int a = cm_runs(algo, p, S, n);
    return cm_max(cm_allreduce_link(n, a, p, S), cm_cpu(n, a, p, S));
}

static double cm_allreduce_link(const cm_net *n, int algo, int p, double S) {
    switch (cm_runs(algo, p, S, n)) {
    case CM_RING: return cm_ring(n, p, S);
    case CM_BIRING: return cm_biring(n, p, S);
    case CM_RD: return cm_rd(n, p, S);
    case CM_RHD: return cm_rhd(n, p, S);
    case CM_HIER: return cm_hier(n, p, S);
    default: return 0;
    }
}

/* Parameter server: ns servers, m workers, S bytes as K tensors, BSP push+pull per step. */
static double cm_ps(const cm_net *n, int ns, int m, double S, int K, int colocated) {
    double push, pull, srv = m * S / ns;
    if (colocated) {
        double x = (double)(m - 1) / m * S;
        push = cm_max(x * n->b, srv * n->g);
        pull = x * n->b;
    } else {
        push = cm_max(cm_max(S * n->b, srv * n->b), srv * n->g);
        pull = cm_max(S * n->b, srv * n->b);
    }
    double t = 2 * n->a + push + pull + (double)m * K * n->o;
    if (n->ncpu > 0) { /* every worker sends and receives S, the servers together 2 m S; 4 messages per slice */
        double cpu = (4.0 * m * S * n->kappa + m * S * n->g + 4.0 * m * ns * K * n->mu) / n->ncpu;
        if (n->share <= 1) cpu = (2.0 * S * n->kappa + 4.0 * ns * K * n->mu + cm_max(0, (double)m / ns - 1) * 2 * S * n->kappa) / n->ncpu;
        t = cm_max(t, cpu);
    }
    return t;
}
#endif
