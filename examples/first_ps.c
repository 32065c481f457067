/* first_ps.c - a first program of one's own, written from hello_ps.c the way a new user would
   (issue 17): fit y = 3x - 1 by least squares with 2 servers and 3 workers, the servers applying
   the SGD rule to the mean gradient (BSP). Launched only:
       scripts/kvps-run -s 2 -w 3 build/first_ps      (or mpirun / srun -n 5, KVPS_SERVERS set)
   Each worker prints the fitted (w, b); exit 0 when it is (3, -1). */
#define KVPS_IMPLEMENTATION
#include "kvps.h"
#include <math.h>
#include <stdio.h>

static int serve(const kvps_env *e) {
    kvps_server *s = NULL;
    kvps_result rc = kvps_server_create(&(kvps_server_desc){.endpoint = e->endpoint, .rank = e->rank,
                                                            .num_workers = e->num_workers}, &s);
    if (rc == KVPS_OK) rc = kvps_server_run(s); /* until every worker has finished */
    kvps_server_destroy(&s);
    return rc == KVPS_OK ? 0 : 1;
}

static int work(const kvps_env *e) {
    kvps_worker *w = NULL;
    kvps_tensor t;
    kvps_req q;
    float p[2] = {0, 0}, g[2]; /* (w, b), as the servers hold them */
    kvps_result rc = kvps_worker_create(&(kvps_worker_desc){.servers = e->servers, .rank = e->rank,
                                                            .num_workers = e->num_workers, .min_slice = 1}, &w);
    if (rc == KVPS_OK) rc = kvps_worker_tensor(w, "wb", 2, &t);
    if (rc == KVPS_OK && e->rank == 0) { /* the rule, set once; everyone waits for it */
        rc = kvps_worker_tensor_optim(w, t, &(kvps_optim){.rule = KVPS_RULE_SGD, .lr = 0.5f}, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    }
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    for (int step = 0; step < 200 && rc == KVPS_OK; step++) {
        g[0] = g[1] = 0;
        for (int i = 0; i < 50; i++) { /* this worker's 50 points of x in [-1, 1) */
            float x = (float)(e->rank * 50 + i) / 75.0f - 1.0f, err = p[0] * x + p[1] - (3 * x - 1);
            g[0] += 2 * err * x / 50;
            g[1] += 2 * err / 50;
        }
        rc = kvps_worker_pushpull_tensor(w, t, g, p, &q);
        if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, -1);
    }
    if (rc != KVPS_OK) fprintf(stderr, "worker %d: %s\n", e->rank, kvps_worker_last_error(w));
    kvps_worker_destroy(&w); /* says goodbye: the servers stop once every worker has */
    int ok = rc == KVPS_OK && fabsf(p[0] - 3) < 1e-3f && fabsf(p[1] + 1) < 1e-3f;
    printf("first_ps: worker %d: w = %.4f, b = %.4f (want 3, -1): %s\n", e->rank, p[0], p[1], ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}

int main(void) {
    kvps_env e;
    if (kvps_env_read(&e) != KVPS_OK) {
        fprintf(stderr, "first_ps: run me under scripts/kvps-run -s 2 -w 3, mpirun or srun\n");
        return 2;
    }
    return e.role == KVPS_ROLE_SERVER ? serve(&e) : work(&e);
}
