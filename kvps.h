/* kvps.h - v0.2 - sharded parameter server over ZeroMQ for distributed training - MIT licence

   Do this:
       #define KVPS_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.
   Link with libzmq (`pkg-config --cflags --libs libzmq`), -pthread and -lm.
   It stands on kvps_core.h (results, logging, clocks, ZeroMQ contexts, the timeline writer) and
   kvps_codec.h (the codecs), which it includes; keep the four files together. Its own switch,
   KVPS_PS_IMPLEMENTATION, implements it and those two (kvps_core.h: IMPLEMENTATION SWITCHES).

   CONTENTS
     1. What it is
     2. Step by step: server
     3. Step by step: worker
     4. Keys, tensors and sharding
     5. Consistency and update rules
     6. Wire format
     7. Ownership and threads
     8. Errors and logging
     9. Environment (launchers)
    10. Config macros
    11. Faults: heartbeats, re-sends, lost workers, checkpoints
    12. Security: CURVE, only the job talks to the job
    13. Timeline
    14. Revision history

   1. WHAT IT IS
   Workers push gradients and pull aggregated values or updated weights. Keys are sharded over
   n servers, each holding about 1/n of the bytes, so one synchronisation costs O(bytes/n) per
   server. Every worker operation is non-blocking and returns a request handle; `wait` and
   `test` complete it, and any number of requests may be in flight at once.

   2. STEP BY STEP: SERVER
       kvps_server *s = NULL;
       kvps_result r = kvps_server_create(&(kvps_server_desc){
           .endpoint = "tcp://127.0.0.1:5555",   // "tcp://127.0.0.1:*" picks a free port
           .num_workers = 4,
           .consistency = KVPS_BSP,              // 0 -> BSP
           .update = KVPS_UPDATE_SGD, .lr = 0.1f // 0 -> KVPS_UPDATE_MEAN (aggregate only)
       }, &s);
       if (r != KVPS_OK) { fprintf(stderr, "kvps: %s\n", kvps_result_str(r)); exit(1); }
       kvps_server_run(s);          // returns once all 4 workers have finished (CLEAN FINISH),
       kvps_server_destroy(&s);     // or at kvps_server_stop(s) (thread- and signal-safe)
   Or kvps_server_start(s) to serve from a background thread (kvps_server_wait(s, -1) waits
   for it to stop and returns what kvps_server_run returned). Several servers may live in one
   process (on inproc:// they must share a ZeroMQ context: set .zmq_ctx). examples/hello_ps.c
   is a whole program, server and worker.
   CLEAN FINISH. A worker says goodbye when it is done (kvps_worker_finish, or by itself in
   kvps_worker_destroy); once every one of num_workers workers has, the server stops by
   itself: a job under kvps-run, mpirun or srun ends with its last worker, exit 0, with no
   "lost" warning. A finished worker's closed connection is no loss; one that comes back (or
   a new process with its rank) is simply not finished any more. kvps_worker_finish also waits,
   up to its timeout, for a server it has not reached yet (one that started late, after the
   worker's last request), so that it too hears the goodbye; destroy does not wait for those,
   and finish names one that never connected. A pull or barrier that needs
   a push from a worker that has finished is answered KVPS_ERR_PEER_LOST at once ("worker 1
   has finished ... but round 7 of tensor 'w' needs its push"); under .elastic the finished
   worker leaves the aggregation instead. A job that lost a worker (FAULTS) ends too: once
   every worker has finished or is lost, the server stops by itself (under .elastic
   peer_timeout_ms later, unless a lost one has come back by then) and kvps_server_run returns
   KVPS_ERR_PEER_LOST, its log naming the lost and the finished ("server 0: the job has ended
   with workers lost: lost 2, finished 0-1 (of 3); stopping"); until then a lost worker may come
   back and nothing changes. A worker that never connected is neither: it is waited for.
   .keep_serving = 1: a long-lived server that serves job after job until kvps_server_stop.

   3. STEP BY STEP: WORKER
       kvps_worker *w = NULL;
       kvps_worker_create(&(kvps_worker_desc){
           .servers = "tcp://10.0.0.1:5555,tcp://10.0.0.2:5555",
           .rank = 0, .num_workers = 4 }, &w);
       kvps_tensor t;
       kvps_worker_tensor(w, "layer1.weights", 784 * 128, &t);   // same call on every worker
       kvps_req q;
       if (rank == 0) { kvps_worker_init_tensor(w, t, w0, &q); kvps_worker_wait(w, q, -1); }
       kvps_worker_barrier(w, &q); kvps_worker_wait(w, q, -1);
       for (step...) {
           compute_gradient(grad);
           kvps_worker_pushpull_tensor(w, t, grad, weights, &q);  // one round trip
           ... compute something else while the bytes move ...
           if (kvps_worker_wait(w, q, -1) != KVPS_OK) { ...kvps_worker_last_error(w)... }
       }                                          // -1: as long as the servers live (TIMEOUTS)
       kvps_worker_destroy(&w);                   // says goodbye: the servers stop once all have
   FIRST CONTACT. kvps_worker_create sends each server a hello with what must agree: the
   protocol release, num_workers, the server list (its count and a hash of it, and this
   server's place in it, which must be its rank), min_slice and max_slice, and the worker's
   rank and incarnation. The first worker a server accepts sets the reference (until all
   those that said hello have finished); a worker that disagrees, or takes the rank of a
   live worker, is refused with KVPS_ERR_CONFIG (KVPS_ERR_VERSION for the protocol) and
   both values named ("worker 3 was told num_workers = 4, server 0 (tcp://...) was told
   3"), in the server's log and in the worker's next wait, which returns it within a round
   trip; everything else that worker sends is refused the same way: destroy it. Tensor names
   go to every server when registered: one registered elsewhere with another length or cut
   into other slices is refused by name ("tensor 'w': worker 1 registered it with 10 floats,
   worker 0 with 8"), and that tensor's calls then return that error.

   4. KEYS, TENSORS AND SHARDING
   Raw keys are uint64_t values below 2^63 with float32 values of any length >= 1 (a key's length
   is fixed by its first use on the server; a later mismatch is an error). Raw key k lives on
   server mix64(k) mod n (strictly: on the server of virtual shard mix64(k) mod V, V = 256 n,
   which is server v mod n until a RESHARD moves virtual shards). A named tensor is registered once per worker with kvps_worker_tensor;
   it is cut into min(n, ceil(len / min_slice)) slices of equal size (+-1 element) (n: the first
   list's server count, before any RESHARD), slice i on
   server (h + i) mod n where h = hash(name) mod n, so each server holds about 1/n of every
   large tensor's bytes. Where those slices would be longer than max_slice, the tensor is cut
   into the next multiple of n slices that are not (at most len, at most 65536), so every server
   still holds as many: a server then sums or sends one piece while the next is on the wire,
   and each piece fits in a core's L2 cache on its way through (BytePS cuts at 4 MB; here 1 MiB
   pieces beat 4 MiB ones by up to 1.7x at 16 MB, see BENCHMARKS.md). A push, pull or
   pushpull of such a tensor sends one message per slice, all in flight at once, and is still
   one request. Slice keys have bit 63 set (reserved for tensors). Every worker must use the
   same server list (same order), min_slice and max_slice. They decide the slice keys and
   lengths, so a checkpoint keeps to them too: workers with another layout get
   KVPS_ERR_LEN_MISMATCH from the restored servers (tensors over 1 MiB saved before max_slice
   existed: pass max_slice = 268435456).
   RESHARD. kvps_worker_reshard(w, list, timeout) grows or shrinks the server set while training
   goes on: every worker calls it at the same point with nothing in flight and the same list (the
   old one with servers added at its end or removed from its end; server 0 stays). Keys live in
   V = 256 n0 virtual shards (n0: the first list's servers): a raw key in mix64(key) mod V, slice
   i of a tensor in (fnv1a(name) mod V + i) mod V, a sparse table's row in mix64(id ^
   mix64(table)) mod V. At a barrier, worker 0 asks each old server for its keys (op KEYS) and
   plans the new map by the bytes each shard holds (kvps__vmap_plan): a grow fills each new
   server with small shards up to V / n' of them (keys made later fall on it too), then, from
   the fullest old servers, with the largest shards that fit under the mean; a shrink deals the
   leaving servers' shards, largest first, to the servers with the fewest bytes; then a server
   left over 1.08x the mean gives its smallest shards to the emptiest. Only moved shards' bytes
   travel, about 1/n' of them (bench/placement_sim.c at 10-1000 servers: 1.00-1.06x the ideal
   share, max/mean <= 1.08 after any join or leave). Worker 0 takes the records of the keys whose shard moves
   (EXPORT: the checkpoint's key record, with optimizer state (a user rule's too), its step,
   rounds and per-worker counters),
   gives them to their new server (IMPORT), has the old one forget them (DROP), does the same for
   sparse tables' rows (EXPORT_ROWS, IMPORT_ROWS, DROP_ROWS: with their optimizer state; every
   table's configuration reaches the new servers, so rows first touched after a grow are made
   there), and tells every server of the new set the new placement (PLACE); the others wait at
   a second barrier, read it from server 0 (PLACE_GET) and check that it follows theirs; then
   every worker places its tensors' slices anew (a slice keeps its key). Nothing moves but
   those keys, no push is in flight, so no update is lost or doubled, and BSP results keep
   their bits. Servers that leave get a goodbye and stop. Tensors are not cut again (a tensor
   cut for n servers keeps its slices: two may share a server, and its requests then go out in
   more rounds; tensors registered after a reshard are cut for the first list's n too, as a
   restarted job cuts them). The placement is the list of server counts the job went through
   ("2 > 3 > 2") with each change's moves (a few KiB a change: about V / n' shards); servers
   record it in their checkpoints (and replicas in their snapshots), and a hello from a worker
   that does not know it is answered with it. A worker's first keyed call (a tensor, a table, a
   push, pull or init, a reshard) waits for the first hello's answer (up to timeout_ms): a job
   restarted from checkpoints written after reshards takes their placement by itself, given
   the last list. A worker whose placement differs is refused (KVPS_ERR_MISMATCH, both named),
   one listing another number of servers than the placement's last is told which
   (KVPS_ERR_CONFIG), and a server refuses the keyed requests of a worker that has not taken its
   placement (which only happens when no server answered within timeout_ms), so no key lands on
   the wrong server (a server that refuses the worker's handshakes ends that first wait at once:
   the call returns KVPS_ERR_AUTH, no request made). At most 63 reshards per placement. A CURVE
   worker connects to the new servers with the key pair it was created with
   (kvps_worker_reshard_keys takes the new servers' public keys when each server has its own).
   bench/placement_sim.c compares placements at scale.
   FUSION. A model of many small tensors (ResNet-50: 161) costs a message per slice per call,
   and small messages cost round trips. kvps_worker_push_tensors / pull_tensors /
   pushpull_tensors take a list of tensors and send each server one message with all of its
   slices of all of them (split at fusion_bytes, 256 KiB: with ResNet-50's 161 tensors, 4
   workers and 2 servers, 4 MiB messages made a step 1.2-1.3x slower than one request per
   tensor, as a server sums a big message only once it is all in, and 64-512 KiB ones were level
   with it: bench/bench_fusion.c), one request for the caller; BSP results
   are the same bits as one request per tensor (tests/test_fuse.c). A tensor's priority
   (kvps_worker_tensor_priority, default 0) orders the slices in those messages, highest first,
   and, with credit_bytes set, orders every request: at most credit_bytes are in flight to one
   server (one message always is), the rest wait in the worker and go highest priority first as
   replies come back, so an early layer's pull made late overtakes the bulk of later layers'
   pushes (BytePS's scheduling). Among peers the same idea is kvps_fuse.h (buckets for
   kvps_ring all-reduces).

   5. CONSISTENCY AND UPDATE RULES
   Round numbers, in messages and in the timeline, count from 1: round t of a key is the t-th it
   applies, the one a worker's t-th push of the key goes into; barrier b is each worker's b-th.
   KVPS_BSP: the server applies round t of a key when all m workers have pushed it; contributions
   are summed in rank order 0..m-1, whatever order they arrive in, so results are bit-identical
   run to run. A pull from worker r waits until the key has applied as many rounds as r has
   pushed, so "push(t); pull" returns the value after step t.
   KVPS_ASYNC: each push is applied on arrival as a round of one contribution; pulls never wait.
   KVPS_SSP (.staleness = k): rounds as under BSP, but a pull from a worker that has pushed c
   rounds waits only for round c - k: a worker runs at most k steps ahead of the slowest, and
   still sees every update older than that (k = 0 is BSP; a large k never waits).
   KVPS_ADAPTIVE: SSP whose k the server moves between .staleness_min and .staleness: every 16
   rounds it looks at the share of pulls that stalled; above 10% it allows one more step of
   staleness, at 0% one less. Each switch is logged (info), counted in stats and passed to
   .on_switch. A worker is never more than the k in force ahead.
   Per tensor, kvps_worker_tensor_optim picks a kvps_rule (aggregate sum/mean/max/min,
   accumulate, SGD, momentum, Nesterov, Adagrad, Adam, AdamW) with its hyper-parameters; the
   formulas are at kvps_rule, computed in float32 in exactly that order.
   ADAM AND ADAMW. KVPS_RULE_ADAM keeps beta1^t and beta2^t as running products in float
   (b1t *= beta1 each step) and has no weight decay; KVPS_RULE_ADAMW is PyTorch's
   torch.optim.AdamW (its single-tensor path, torch 1.13): decoupled weight decay
   (.weight_decay, w *= 1 - lr * wd before the moments) and the bias corrections 1 - beta^t
   computed with pow in double from the key's step t (1 at its first update after its CONFIG;
   a float running product and pow differ in the last bits from step 2, so the two rules give
   other bits even with weight_decay 0). Its exact order, f(x) being x rounded to float and
   everything else float32 (g = sum / count):
       d  = f(1 - (double)lr * (double)wd)        a1 = f(1 - (double)beta1)   a2 = f(1 - (double)beta2)
       s  = f((double)lr / (1 - pow(beta1, t)))   c2 = f(sqrt(1 - pow(beta2, t)))
       w = w * d;  m = fmaf(a1, g, beta1 * m);  v = fmaf(a2 * g, g, beta2 * v);
       w = w - (s * m) / (sqrtf(v) / c2 + eps)
   (fmaf: a * b + c with one rounding) which is torch's param.mul_(1 - lr*wd),
   exp_avg.mul_(b1).add_(g, alpha=1-b1), exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2), denom
   = exp_avg_sq.sqrt() / sqrt(bc2) + eps, param.addcdiv_(exp_avg, denom, value=-lr/bc1), with
   its Python doubles rounded to float where they meet a float tensor, and its vectorised CPU
   kernels' order: add with alpha and addcmul fuse their last multiply-add (measured against
   Debian's torch 1.13 on x86-64 with AVX2: with two roundings instead, 10500 of 100000 first
   moments and 332 of 100000 second moments differed from torch's after one step, and the
   weights by up to 68 ulps after 24 steps); addcdiv computes self + (value * t1) / t2.
   tests/test_rules.c holds the servers to a C loop of these lines, bit for bit;
   tests/adamw_torch.py replays the same gradients through torch.optim.AdamW where python3-torch
   is installed (Debian's python3) and fails past 8 ulps: measured 0 ulps over 24 steps x 300
   weights at three settings (a torch built without FMA kernels would differ by rounding). AdamW
   counts steps per key, so sparse tables (whose rows keep no step) refuse it.
   USER RULES, PER TENSOR, WITH STATE. A server registers rules of its own in
   .user_rules (num_user_rules, at most 64): each a kvps_rule_fn and n_state (0 to
   KVPS_MAX_RULE_STATE, 8) floats of state per element. A tensor names user rule i as rule
   KVPS_RULE_USER + i through kvps_worker_tensor_optim, as it names a built-in rule, with the
   same hyper-parameters (weight_decay too) handed to the function resolved. For each round kvps
   calls fn with the key's value, the round's sum and count, n_state arrays of len floats (kvps
   allocates them per key, zeroed, at the first update), the step (1, 2, ...) and the optim; the
   function updates value and state in place, on the serving thread (it must not block, and it
   must be deterministic: replicas apply it too). That state and the step are the key's as a
   built-in rule's are: they go into checkpoints, replicas' snapshots and replicated rounds, and
   reshard moves, so a job with a user rule survives a restore, a primary's SIGKILL and a
   2 -> 3 reshard with the same bits (tests/test_rules.c). Every server of a job registers the
   same rules in the same order: a tensor that names a rule its server lacks is refused, and
   that CONFIG's wait returns KVPS_ERR_INVALID_ARG ("server 0: tensor 'w' names user rule 5
   (rule id 69), which server 0 does not have (it has 2 user rules)"); a checkpoint or snapshot
   holding a key of a rule the server lacks (or with another n_state) is refused, naming the key
   and the rule. Not for sparse tables (their rows keep no step). desc.update_fn stays the
   whole-server rule for keys without a rule of their own; its state is the caller's.
   The update rule turns a round's sum into the stored value:
     KVPS_UPDATE_MEAN        value = sum / count      (aggregate-only: pull returns mean gradient)
     KVPS_UPDATE_ACCUMULATE  value += sum             (accumulating key-value store; its old name,
                                                      KVPS_UPDATE_SUM, still works)
     KVPS_UPDATE_SGD         value -= lr * (sum / count)  (the server holds the weights)
   the same words as kvps_rule's (KVPS_RULE_SUM: value = sum of the round, is another rule).
     .update_fn        your own kvps_update_fn
   A key starts as zeros, or as .init_fn writes it, or as worker r sets it with kvps_worker_init
   (no summing; replaces the stored value).
   JOIN (uneven data: Horovod's join): a worker whose data ends first calls kvps_worker_join(w)
   (blocking, to every server). Each server takes it out of the aggregation for good, as a lost
   worker under .elastic (the same code), except that what it pushed before counts: every round
   and barrier then completes over the workers in, MEAN and SGD dividing by the contributions the
   round has (k workers pushed step t: sum / k). The joined worker may still pull (the weights
   after the others' rounds); its pushes and barriers are refused (KVPS_ERR_STATE, "worker 2
   has joined (kvps_worker_join): it may pull and finish, not push"); it finishes (or is
   destroyed) as any worker, and the servers stop once every worker has (CLEAN FINISH). A joined
   worker that dies stops no round or barrier (nothing waits for it); the job then ends as one
   that lost a worker does (FAULTS). Under async, join changes nothing but the refusals.
   A scalar all-reduce (a loss, a count of samples): kvps_worker_allreduce_scalar(w, &x,
   KVPS_SCALAR_MEAN) (SUM, MEAN, MIN, MAX), blocking, through server 0 as a barrier is (the same
   generations: it is one): every worker gets the same double, the values taken in rank order;
   MEAN divides by the workers that took part (not those joined or left). Workers that pass
   different ops, or one a barrier, get KVPS_ERR_MISMATCH naming both.

   6. WIRE FORMAT (little-endian; one ZeroMQ multipart message per request)
     worker -> server : [meta][values]        values only for the ops that take them (OPS)
     server -> worker : [meta][values]        values only for a successful answer that has them
                        [meta][text]          when meta.status < 0: a message naming the problem
     meta = header (32 bytes) followed by nkeys entries of { u64 key; u64 len } (16 bytes each)
       offset size field
       0      4    magic   0x5350564B ("KVPS")
       4      1    version 1
       5      1    op      one of OPS below; replies set 0x80
       6      2    flags   1 CODED: the values frame holds, per key, [u32 bytes][codec blob]
                           2 CODED_REPLY: answer the pull coded with the codec whose id is aux
                           (in the reply, flags echo it); other bits are rejected
       8      4    rank    worker rank, 0..m-1
       12     4    nkeys
       16     8    req_id  echoed in the reply; (sequence << 24) | slot, the sequence rising
                           per worker (what the server de-duplicates re-sends by)
       24     4    status  replies: a kvps_result (0 or negative); requests: the worker's
                           incarnation (random, nonzero; 0 = a raw client, not de-duplicated)
       28     4    aux     CODED_REPLY: codec id; otherwise ignored. Replies that succeeded: the
                           server's checkpoint stamp, 0 when it writes none (FAULTS, checkpoints)
     values = the keys' float32 values concatenated in meta order (sum(len) * 4 bytes)
     OPS (protocol release 9: a HELLO names it and both sides must speak the same; test_api checks
     this list against the code's). nkeys 0 where no keys are named.
       op  name         values frame; answer
        1  PUSH         the keys' values (maybe CODED)
        2  PULL         none; answered with the keys' values (maybe CODED_REPLY)
        3  PUSHPULL     as PUSH; answered as PULL, with the round's result
        4  INIT         the keys' values, stored as they are (no summing)
        5  BARRIER      none (server 0 only)
        6  CONFIG       per key { u32 rule; f32 lr, momentum, beta1, beta2, eps, weight_decay }
                        (rule: a kvps_rule, or KVPS_RULE_USER + i, a user rule the server has)
        7  PUSH_ROWS    rows x dim floats (table ops, below)
        8  PULL_ROWS    none; answered with rows x dim floats
        9  TABLE        CONFIG record + { f32 init_scale; u64 seed }, no ids
       10  HELLO        u32 protocol 9, u32 num_workers, u32 servers in the list, u32 this
                        server's place, u64 list hash, u64 min_slice, u64 max_slice, u64 the
                        placement's hash (0 before any reshard), u64 the job token's digest
                        (0: none), u32 again (1: said again after a reconnect), u32 the last
                        checkpoint stamp the worker heard from this server (0: none; FAULTS,
                        checkpoints); answered with the server's placement when the worker's
                        is 0 and the server has one
       11  BYE          none: the worker has finished
       12  STATUS       none (req_id: the request asked about); answered with text
       13  NAME         u64 base key, u64 length, u32 slices, u32 name bytes, the name
       14  REPL         primary -> backup (REPLICAS; kvps__rhdr): rank = kind: 0 a worker's request follows
                        as [routing id][meta][values?], 1 a snapshot [checkpoint bytes][session],
                        2 worker u32 lost, 3 the rounds a request completed under BSP
                        [done][records] (kvps__round_note), 4 hello [u64 job token digest, u64
                        chain hash], first on each connection of a link (SECURITY); nkeys =
                        epoch, req_id = sequence, aux = sender's place
       15  KEYS         none (RESHARD); answered with n x {u64 key, u64 len}
       16  EXPORT       n x u64 key; answered with their records, as in a checkpoint
       17  IMPORT       key records, taken in (new keys only)
       18  DROP         n x u64 key, forgotten (moved elsewhere)
       19  PLACE        u32 V, u32 count, u32 server counts[count], u32 moves[count], then the
                        moves' (virtual shard, server) pairs: the placement, first to last
       20  EXPORT_ROWS  u32 V, u32 virtual shards[]; answered with every table's record, only
                        the rows in those shards
       21  IMPORT_ROWS  table records; tables made or found the same, rows taken in (new ids)
       22  DROP_ROWS    as EXPORT_ROWS: the rows in those shards forgotten
       23  PLACE_GET    none; answered with the server's placement (as PLACE's values)
       24  READ         REPLICAS under BSP, .read_local: a pull whose values frame is u64 the
                        sequence of the worker's push it waits for; answered by any replica, a
                        backup too, or KVPS_ERR_NOT_PRIMARY with aux 1 when it never will
       25  JOIN         none: the worker's data has ended (kvps_worker_join); to every server
       26  ALLREDUCE    f64 x, u32 kvps_scalar_op, u32 0 (server 0 only; a barrier with a value);
                        answered with the f64 result
     table ops (PUSH_ROWS, PULL_ROWS, TABLE): meta = header (nkeys = rows) + { u64 table; u32 dim;
     u32 0 } + rows x u64 id (TABLE: no ids)
   Anything else gets an error reply and changes nothing: a message is checked whole before
   any stored value is touched. A worker call that spans several servers sends one message to
   each; each server accepts or rejects its own part (so a push whose key on server 1 has the
   wrong length is still applied on server 0, and wait reports the error).

   MEMORY. ZeroMQ allocates every received message. With glibc's defaults, large buffers are
   returned to the kernel when freed and faulted in afresh on the next message (about 3 us per
   4 KiB page here, more than the copy itself), which halves throughput at 1 MB and up. So the
   first server or worker created sets M_MMAP_THRESHOLD to 32 MiB and M_TRIM_THRESHOLD to 1 GiB
   (mallopt): freed message buffers are reused. This is process-wide; .no_malloc_tuning = 1 on
   every desc leaves malloc alone. One case it does not cover: the I/O thread allocates from an
   arena of its own, made of 64 MiB heaps that glibc unmaps whenever one empties. With
   max_slice raised to 4 MiB, a process that held views (kvps_worker_pull_tensor_view) of 64 MB
   tensors got fresh pages again, and MALLOC_ARENA_MAX=1 in its environment took those views
   from 2.5 to 3.0-3.4 GB/s here; with the default 1 MiB slices it made no difference. kvps
   does not set it itself, as one arena serialises every thread's malloc.

   7. OWNERSHIP AND THREADS
   kvps_x_destroy(&x) frees x and sets it to NULL; destroying NULL is harmless. Buffers passed to
   a non-blocking call are borrowed until kvps_worker_wait (or kvps_worker_test reporting done)
   returns for that request: push values may be sent without a copy, pull destinations are
   written when replies arrive. After KVPS_ERR_TIMEOUT (or PEER_LOST, or AUTH) the request is
   still in flight and the buffers stay borrowed: wait again, or destroy the worker (which drops
   what is in flight) before reusing them. kvps_worker_pull_tensor_view pulls without the copy into your buffer:
   the view points into the received messages until kvps_view_release. A worker is used by one thread at a time; use one worker per thread.
   Servers are driven by the thread in kvps_server_run; kvps_server_stop may be called from any
   thread or a signal handler. THREADING MODEL: a server is one thread (plus ZeroMQ's I/O
   thread): it handles requests one at a time, so no locks guard its keys and tables. Measured
   on 2 vCPUs, one server thread moves 4.5 M small keys/s (1 M keys in one request) and 3.6 M
   sparse rows/s (BENCHMARKS.md), so it is not the limit; to use more cores, run more servers
   (keys and rows spread over them).
   A worker is not thread-safe and has no thread of its own: replies are read when its caller
   waits or tests.
   WHAT A DESC LENDS. kvps_server_create copies its desc, but these pointers in it are kept and
   must stay valid (and unchanged) until kvps_server_destroy: codecs (the array and each
   codec's functions and user pointer: read for every coded request), checkpoint_path (read at
   each checkpoint), zmq_ctx (a context you passed is used, not owned: terminate it after
   destroying the server), and update_user, init_user and switch_user (passed back to your
   functions). user_rules is copied (the array), but each rule's name and user pointer are kept.
   Not kept (read during the call only): endpoint (the server holds the resolved
   one), curve_secret_key, curve_clients, io_cpus. kvps_worker_create keeps none of its
   desc's strings (servers, CURVE keys, io_cpus are read during the call; a CURVE worker keeps
   a copy of its key pair and of the servers' public keys, for the servers a reshard adds, and
   destroy zeroes the secret) and only borrows zmq_ctx; kvps_ring_create likewise keeps
   neither peers nor io_cpus, and copies groups.
   CPU PINNING. .io_cpus = "3" (or "0-3", "0,2-3": taskset -c's list) pins the ZeroMQ I/O
   thread(s) of a server's, worker's or ring's own context to those CPUs; NULL leaves them where
   the OS puts them. Each CPU must be one the calling thread may run on (KVPS_ERR_CONFIG
   otherwise). A context you pass as zmq_ctx is yours to pin: kvps_zmq_ctx_pin(ctx, cpus)
   before its first socket (its threads start then; they inherit the affinity of the thread
   that makes that socket, so a process bound to one core needs neither). The list is read
   during create only. Waking a thread on another vCPU is dear in a VM (a 4 KB ZeroMQ one-way
   message: 50 us across two vCPUs, 23 us on one; raw TCP 3.5 us). With each rank's I/O thread
   on a CPU of its own, ring all-reduce ran 1.47x faster at 4 MB with 2 ranks and 1.12-1.34x at
   1-16 MB with 4, but 0.93x at 1 MB with 2 (paired runs, BENCHMARKS.md). For a server and a
   worker on one machine it was mixed (bench_pushpull --io-cpus split, three paired runs).

   8. ERRORS AND LOGGING
   Every fallible call returns kvps_result (KVPS_OK = 0, errors < 0, banded: -1.. arguments and
   state, -100.. configuration, -200.. network, -300.. wire/protocol, -400.. GPU).
   kvps_result_str(r) names it. A server's error reply reaches the worker as the result of wait,
   and its text as kvps_worker_last_error(w); every other error a worker call returns leaves
   there what was wrong, naming the argument or thing ("push: keys[1] = ... is 2^63 or more",
   "tensor_optim of tensor 'w': beta1 (in [0, 1)) out of range"). A ring's mismatch names both
   calls ("rank 1 called allreduce of 100 float64 (sum, root 0); this rank (0) called ..."),
   with kvps_dtype_name, kvps_redop_name, kvps_coll_name, kvps_algo_name.
   TIMEOUTS. Slow is not dead: a wait with no deadline (the default) on live servers lasts as
   long as it takes, logged (warn) at .stall_ms (60 s) and every stall_ms after. A dead server
   ends it within peer_timeout_ms (5 s): KVPS_ERR_PEER_LOST naming it. A deadline is yours to set.
   In more words: every blocking call takes a timeout in ms: 0 looks and returns at once (like
   zmq_poll's 0), > 0 waits that long (KVPS_ERR_TIMEOUT; the request stays valid), -1 means the
   object's: desc.timeout_ms when set, else none. A live server is one whose connection is up
   (it answers heartbeats), even while it waits itself, under BSP, for a slow worker. A server
   whose connection has been down for peer_timeout_ms (it died, or its heartbeats went
   unanswered: FAULTS) ends a wait with no deadline (KVPS_ERR_PEER_LOST "server 0 (tcp://...)
   unreachable for 5012 ms"; with heartbeat_ms -1 only a closed connection tells), and so do one
   that never connected (after 30 s), a shard none of whose replicas answers (each tried for
   failover_ms, then peer_timeout_ms), and a server that refuses our handshakes (KVPS_ERR_AUTH). A server stopped with SIGSTOP answers no heartbeats:
   it counts as dead, about 2 x peer_timeout_ms after it stopped (over the network a stopped
   process cannot be told from a dead host or a cut link; servers treat a silent worker the same
   way). Short exchanges that wait on no slow peer keep a bound of their own when desc.timeout_ms
   is not set: kvps_worker_finish(w, -1) and destroy's goodbye, and the first hello's answer
   (10 s). kvps_server_wait(s, -1) waits for the server to stop (its workers decide when).
   STALLS. A wait that has lasted .stall_ms (default 60 s; -1: off) asks each server still owing
   a reply what the request waits for (STATUS; at most 0.3 s) and logs it (warn), again every
   stall_ms: "worker 0: stalled for 60 s in a wait for request 12 (tensor 'w') with 1 of 1
   replies missing; server 0 (tcp://...): pull of tensor 'w' slice 0 of 1 waits for round 3,
   which workers 1 (connected) have not pushed". A timed-out wait (not one of 0 ms) asks the
   same and says it in last_error: "request timed out after 10000 ms
   ...; server 0 (tcp://...): pull of tensor 'w' slice 1 of 2 waits for round 6, which workers
   2 (never connected), 3 (lost 12 s ago) have not pushed" (or "barrier 4 waits for workers
   ..."). A worker's state is one of: connected, never connected, disconnected, lost, finished,
   refused. A server that was never reached is said so, with its endpoint ("server 1
   (tcp://10.0.0.2:5555) never connected: nothing accepted a connection there ...",
   KVPS_ERR_PEER_LOST), apart from one that was reached and went away ("unreachable for N ms").
   The server's own stall inspector logs the same (warn) for every pull or barrier that has
   waited .stall_ms (default 60 s, as Horovod's; -1: off), one line per key or barrier, again
   every stall_ms while it waits. Logging goes to stderr (or kvps_log_set_fn's callback, which may be set from any thread
   at any time; it is called from the thread that logs), level from KVPS_LOG =
   none|error|warn|info|debug (default warn), or kvps_log_set_level.
   WHAT AN ERROR MEANS FOR THE REQUEST: whether its pushes (push, pushpull, init, push_rows)
   were applied on the servers, and what to do, by the result of wait (or of test):
   - KVPS_OK: applied, exactly once. The handle has ended.
   - An error of the call itself (INVALID_ARG, NOMEM, TENSOR, STATE, KEY_RESERVED, ...): nothing
     was sent, no handle was made.
   - KVPS_ERR_TIMEOUT, and KVPS_ERR_PEER_LOST with "server i (endpoint) unreachable ...":
     unknown, parts may have been applied. The handle stays valid: wait again.
   - KVPS_ERR_PEER_LOST with "server i: a worker is lost ..." (or "worker r lost"): applied; the
     pull or barrier is not done, it needs that worker. The handle stays valid: wait again.
   - KVPS_ERR_AUTH: not applied (that server let no data in). The handle stays valid.
   - An error a server answered (MALFORMED, TRUNCATED, LEN_MISMATCH, TOO_LARGE, DUP_KEY, CODEC,
     RANK, HYPERPARAM, TABLE, OP, VERSION, MAGIC, NOT_BARRIER, CONFIG): not applied by that
     server, which checks a request whole before it changes anything; a request spread over
     several servers was applied by those that answered OK. The handle has ended.
   - KVPS_ERR_NOMEM answered by a server, KVPS_ERR_REPLAY (the request is older than the 65536
     the server remembers), KVPS_ERR_ZMQ: unknown. The handle has ended.
   - KVPS_ERR_MALFORMED / TRUNCATED found by the worker in a reply ("bad coded pull reply",
     "pull reply of N bytes"): applied; the pulled values could not be read. Ended.
   While the handle is valid, waiting again is always safe: every part still owed is re-sent
   with the same sequence number, and a server applies no push twice (it answers a re-sent push
   with an acknowledgement and a re-sent pushpull with its pull; a barrier refused because a
   worker was lost is entered again). A wait that re-sends parts answered "a worker is lost"
   rides the loss out until its timeout, re-sending every 100 ms, and says KVPS_ERR_PEER_LOST
   again if the worker is still gone (the first such answer is reported at once; with no
   deadline it rides it out for peer_timeout_ms). Never push
   the same gradient again in a new request after an error that leaves the handle valid: that
   one is a new push and would be applied as well. To give up, destroy the worker (which drops
   what is in flight: OWNERSHIP AND THREADS).

   9. ENVIRONMENT (launchers)
   kvps_env_read fills a kvps_env from KVPS_ROLE (server|worker), KVPS_RANK (else
   OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID), KVPS_SERVERS (comma-separated endpoints),
   KVPS_NUM_WORKERS. Without KVPS_SERVERS, from a rendezvous (kvps_launch.h): the launcher's rank
   and size (RANK / WORLD_SIZE and the rest, kvps_launch.h section 1), MASTER_ADDR and
   MASTER_PORT (or KVPS_RENDEZVOUS=host:port) and KVPS_NUM_SERVERS: ranks 0..n-1 serve, each on
   a port of its network card (KVPS_IFNAME) held for it until kvps_server_create binds it, the
   rest work (num_workers = size - n); env.servers is the table's list, kept until the next
   kvps_env_read. Every process must call it (the rendezvous waits for all of them). Under mpirun/srun without KVPS_ROLE, ranks 0..n-1 are servers and the rest
   workers (worker rank = rank - n). With REPLICAS (entries "a|b"), a server's env has its
   replica (KVPS_REPLICA; under mpirun/srun the first n x r ranks serve, process p being shard
   p % n, replica p / n), its shard's chain and KVPS_REPLACEMENT. kvps_env_launched() tells whether a launcher started this
   process: one of KVPS_ROLE, KVPS_SERVERS, KVPS_RANK, KVPS_RING_PEERS, KVPS_RENDEZVOUS,
   OMPI_COMM_WORLD_RANK or PMI_RANK is set (not empty), or RANK with WORLD_SIZE (torchrun), or
   SLURM_PROCID with SLURM_NTASKS > 1 (one task alone, e.g. a
   batch script's, is not a job of several). A program that runs standalone or launched checks it.

   10. CONFIG MACROS
   KVPS_API        linkage of public functions (default extern; define as static for a private copy)
   KVPS_ASSERT(x)  programmer-error checks (default assert)
   The implementation uses POSIX (pthreads, pipe, posix_memalign, clock_gettime). Included
   before any system header, it asks for POSIX itself in a strict -std=c99 file, so no feature
   macro is needed; after one, that file needs -D_POSIX_C_SOURCE=200809L (an #error says so;
   -pthread also serves). Link with `pkg-config --libs libzmq`, -pthread and -lm.

   11. FAULTS
   Heartbeats: every connection carries ZMTP heartbeats (.heartbeat_ms, default 1000); one
   silent for .peer_timeout_ms (default 5000) is closed. A worker reconnects by itself.
   Re-sends, exactly once: a worker keeps each request's frames (references, not copies) until
   its reply. When a server connection comes back (after a drop, or a server restarted on the
   same endpoint), every request still waiting for that server is sent again, in order. The
   server remembers, per worker incarnation, which of the last 65536 request sequence numbers
   it applied: a re-sent push, init, config or row push is answered without being applied
   again, a re-sent pushpull gets its pull, so nothing is summed twice. While a server is
   unreachable, wait returns KVPS_ERR_PEER_LOST at its timeout instead of KVPS_ERR_TIMEOUT, or,
   with no deadline, once it has been unreachable for peer_timeout_ms (TIMEOUTS; the request stays valid: wait again to ride out a restart; ERRORS AND LOGGING has what each
   error means for a request's effect). Stable routing ids (incarnation,
   rank, server) and ROUTER handover let answers to requests parked before a drop reach the
   reconnected socket.
   Lost workers: a server notes which connection each worker speaks from; when it closes (the
   process died, or heartbeats stopped) and the worker has not come back within
   .peer_timeout_ms, the worker is lost. Under BSP/SSP, pulls and barriers that wait for it are
   answered KVPS_ERR_PEER_LOST, and so are new ones that would wait, until it returns (a
   pushpull's push is applied all the same; waiting again on the same handle re-sends the pull,
   and completes once the worker is back). With
   .elastic = 1 it leaves the aggregation instead: rounds complete over the workers left (MEAN
   and SGD divide by the contributions the round has), barriers complete without it, and a
   worker with its rank (a restart or a replacement) joins again from the next round and can
   pull the current weights first. Only tcp:// and ipc:// workers are watched (inproc has no
   connections to lose). Workers cannot be added beyond num_workers. The job has ended once
   every worker has finished or is lost: the server stops by itself (at once; under .elastic
   after peer_timeout_ms more, for a lost worker to come back, which starts the wait again)
   and kvps_server_run returns KVPS_ERR_PEER_LOST, logging the lost and the finished workers'
   ranks (CLEAN FINISH; not with .keep_serving). A backup ends with its primary's job (REPLICAS).
   Checkpoints: .checkpoint_path with .checkpoint_every = N writes the shard every N rounds
   (and kvps_server_checkpoint on request): values, optimizer state (a user rule's too) and
   steps, rounds, per-worker round
   counters, sparse tables, barrier counts, elastic membership and the re-send windows, with
   a CRC-32, written to a temporary file, fsynced and renamed (and the directory fsynced). It
   is written when no round is half summed (under BSP that is each round's end; under SSP with
   k > 0 it can wait for a lull). A write that fails (a full disk: logged as an error) is tried
   again at the next checkpoint, checkpoint_every rounds on, not every round. The temporary file
   is PATH.tmp.PID; those a writer killed mid-write left (no process with that PID on this
   machine) are removed at the next successful write and at start (kvps_server_create with that
   checkpoint_path, kvps_server_restore from it); a live process's are not.
   kvps_server_restore loads it into a fresh server before
   kvps_server_start; restart the server on the same endpoint and its workers carry on, and
   lose nothing. Before its first checkpoint a server has nothing to restore from:
   kvps_server_checkpoint(s, 0) before kvps_server_start writes the empty shard.
   A RESTORE KEEPS ROUNDS ALIGNED. A checkpoint lacks what its server applied after it, and the
   workers had been answered for some of that, each for a different amount (one worker's push of
   step t + 1 is answered while another's of step t is still on its way): a restored shard that
   took only the re-sent requests summed one worker's step t with another's t + 1, and the job
   ended in KVPS_ERR_PEER_LOST (issue 27). So the workers send that again. Every reply that
   succeeds carries the server's checkpoint stamp (1 + the checkpoints it has written, counted
   on across restores; 0 from a server without checkpoint_path): a request answered with stamp
   g was applied before checkpoint g was written, so that checkpoint and every later one hold
   it. A worker keeps each request that changed a checkpointing server's state (push, pushpull
   as the push it carried, init, config, push_rows, table, barrier) from its answer until that
   server answers with a higher stamp: about checkpoint_every rounds of what it pushed there
   (references to the frames it sent; a zero-copy push is copied when answered). When a
   server's connection comes back, a worker whose hello it had accepted says hello again
   (naming the last stamp it heard) and sends behind it, in the order it first sent them, what
   it keeps for that server and every request still waiting for it. A restored server serves
   each worker only from that hello on: what arrives before it (sent or queued before the
   worker saw the connection come back) is dropped unanswered and comes again behind the
   hello; the re-send windows drop what the checkpoint holds. THE GUARANTEE: a server restored
   from its newest checkpoint applies every request its workers were answered for or still
   wait for, each exactly once and each worker's in the order it made them. Under BSP (and
   SSP) every round's sum after a restore holds exactly one push from every worker, the one of
   that round's step, so the values are the bits a run without the fault computes, and shards
   that checkpoint at different rounds need nothing from each other; under async each push is
   applied once. The application is told nothing and rolls nothing back: its waits ride out the
   restart (KVPS_ERR_PEER_LOST while the server is down: wait again). A hello naming a stamp
   the server has not reached (it was restored from an older checkpoint, or restarted without
   one) is refused, and every later wait of that worker returns KVPS_ERR_CHECKPOINT saying so:
   what was applied after that checkpoint is lost and the rounds would not align. Limits: the
   workers must outlive the restore (a worker process that dies takes what it kept along); at
   most 65536 requests of a worker between two checkpoints of a server (the re-send window);
   a worker that had finished is not sent again (nor its goodbye: the restored server waits
   for it); a reshard's moves are not sent again (checkpoint every server after a reshard); a
   server whose shard is never quiet writes no checkpoint, and its workers keep everything.
   tests/test_faults.c test_restore_keeps_rounds: servers SIGKILLed at random points and
   restarted from their checkpoints, every round of every worker checked.
   REPLICAS. A shard may be a chain of r servers: its entry of the server list names them
   joined by '|' ("tcp://a:5555|tcp://b:5555,tcp://c:5556|tcp://d:5556" is 2 shards x 2
   replicas; workers take the list as it is). Each server of a chain is created with .endpoint
   its own, .replicas its shard's entry and .replica its place in it (kvps_env gives all three:
   KVPS_REPLICA, or under mpirun/srun process p is shard p % n, replica p / n; kvps-run
   --replicas R starts them). Place 0 starts as the primary. Under BSP (not elastic) the
   primary sends each round it applies, as one record: the round's sum and which workers'
   requests it holds, so a backup receives 1 / num_workers of the pushed bytes and applies the
   same sum through the same code (the same bits, optimizer state, a user rule's state and
   steps, and round counters); a push
   is answered once every round it is in has been applied and sent (as a pushpull's pull is:
   under BSP with replicas, a worker that waits for its push's answer waits for the round). A
   push in flight when the primary dies is re-sent to the backup that takes over, which applies
   the parts whose rounds it does not hold (a request of several keys may have been half
   replicated) and nothing twice. Every other request that can change state (all but pulls and
   STATUS), and every request under async, SSP, adaptive or elastic (where a push is its own
   round, or is answered before its round completes), goes to each backup as it is, in the
   order the primary serves it, and each backup serves it through the same code, its replies
   going nowhere: async pushes in arrival order, optimizer state, sparse tables, SSP counters,
   the exactly-once windows and the sessions all come out the same bits. A reply is held until
   every live backup has acknowledged every message sent before it, so whatever a worker was
   told survives the primary (pulls are not sent; stats repl_bytes counts what is). A backup
   joins with a snapshot (a checkpoint's bytes and the session state)
   taken when no round is half summed, then the requests served after it, while training goes
   on; that is also how a replacement catches up (a server started with .replacement = 1,
   KVPS_REPLACEMENT=1, on a lost replica's endpoint: it waits for its snapshot, then holds the
   shard). A backup that goes away is dropped from the chain with a warning and the shard goes
   on; one of the first chain that has not connected within peer_timeout_ms is not waited for.
   A backup ends with the job as its primary does (CLEAN FINISH, FAULTS: every worker finished
   or lost), from the goodbyes and losses the primary sends it and its snapshot carries; a
   primary that stops waits (up to 1 s) until its backups hold all it sent them. Replicas
   leaving after the job has ended are no fault: nothing is logged above info.
   Failover: a worker whose shard's server has been unreachable for .failover_ms (1000) moves
   to the next replica, round the chain, and re-sends what was in flight there (exactly once, by
   the windows the backup holds). A backup takes over as primary when a worker's request comes
   and its primary's connection is gone (epoch + 1, and the others get a snapshot from it);
   while the primary's connection is alive it answers KVPS_ERR_NOT_PRIMARY and the worker moves
   on. A primary that stood still past peer_timeout_ms (stopped, as by SIGSTOP, or starved) may
   have been replaced meanwhile, with requests it never saw forwarded still in its socket: it
   holds every reply until a backup takes a snapshot of its epoch from it again (then it is still
   the primary), and a backup that answers with a later epoch makes it step down, answering the
   replies it held KVPS_ERR_NOT_PRIMARY so that their workers send them to the new primary (a
   backup unreachable for peer_timeout_ms is not waited for, and none past 2 x peer_timeout_ms,
   by when a successor has said so); no reply of a stale primary reaches a worker (test_replicas'
   test_stopped_primary_steps_down). READS FROM A LOCAL REPLICA: under BSP the round's sum reaches every backup anyway, so a
   worker created with .read_local = 1 (or KVPS_READ_LOCAL=1; kvps-run passes the environment)
   reads a pushpull's result from a replica of the shard on its own host (ipc, inproc, or a TCP
   address the host can bind; the first such past place 0), and only sends the push to the
   primary: the pull's bytes then stay off the link. The pushpull goes as a push and a READ
   chained behind it (one handle); the READ names the push's sequence and the replica answers
   it once the round holding that worker's push is applied there (each key keeps, per worker,
   the request whose contribution the last applied round held): the same bits the primary
   would answer with. The READs pending when the replica's connection drops, those made while
   it is gone, and every READ while the worker speaks to that replica as its primary go to the
   shard's server (where the push goes) as READs, answered there the same way, in whatever
   order the push and the READ arrive. A READ that cannot be told (the first step, just after a
   snapshot, a key not held, a shard that is not BSP: then the worker stops asking its replica)
   is answered KVPS_ERR_NOT_PRIMARY and goes to the shard's server as a pull once the push has
   been answered there, not before: a pull is served the rounds of the pushes its server has
   received, and after a dropped connection a pull sent behind its push can arrive first (what
   ZeroMQ queued while the connection was down goes before the re-sent push), which returned
   the round before (issue 27). The push is still answered only once its round is replicated,
   so a wait means what it meant. Not with credit_bytes (a pull could pass its push in the
   queue) nor CURVE (such a worker reads from the primaries). A chain of CURVE servers
   replicates over CURVE links with the chain's keys (.curve_replica_keys, SECURITY). test_replicas'
   test_bsp_read_local checks every step against the oracle, test_read_local_cut too with the
   connections cut under load; bench/ethernet.sh claim 6's r2l run measures it. No replica left: waits return KVPS_ERR_PEER_LOST naming the shard and its endpoints. A
   snapshot from another shard or job (rank, number of workers) is refused and that replica
   stays out. Limits: a primary cut off from its backups while still reachable by some workers
   is not detected (there is no quorum: a backup takes over once it has lost the primary's
   connection and a worker comes); parked barrier waits are not in a snapshot (a replacement
   that takes over before a barrier completes answers its re-sent entries at once); tensor
   names (NAME) are not in a snapshot. Growing or shrinking the server set is RESHARD's: with
   replicated shards its moves are requests to each shard's primary, which forwards them as any
   other (test_replicas grows 2 -> 3 chains and kills the new shard's primary: sums exact).
   Finished is not lost: a worker that said goodbye (CLEAN FINISH) and then closed its
   connection is not reported lost. Limit: a backup that takes over knows a worker is lost only
   from its old primary (LOST) or from a connection of the worker's to it (READs, or requests
   after the failover): a worker that died before its old primary said so and never reached
   the new one is not found lost, and keeps that shard's job from ending (kvps-run stops such
   a server --server-wait seconds after the last worker).

   12. SECURITY: CURVE, ONLY THE JOB TALKS TO THE JOB
   Make certificates with `make certs` (or kvps-keygen NAME: NAME.cert is public, NAME.cert_secret
   is secret; CZMQ's zcert format). kvps_cert_load reads them. A server with .curve_secret_key
   encrypts every connection and admits only workers whose public key is in .curve_clients (its
   own ZAP handler; needs the server's own ZeroMQ context). A worker sets .curve_server_keys (the
   servers' public keys), .curve_public_key and .curve_secret_key. A client without a key, with
   an unlisted key, or expecting another server key gets no data and changes nothing; its wait
   returns KVPS_ERR_AUTH. CURVE WITH REPLICAS: each server of a chain also sets
   .curve_replica_keys (else $KVPS_CURVE_REPLICA_KEYS): the chain's public keys in chain order,
   joined by '|' as .replicas is, or one key for all (a CURVE worker's curve_server_keys has one
   key per shard, so for its failover the replicas of a shard share one key pair); entry
   .replica must be the server's own public key (derived from its secret), and no key may be a
   worker's too. The primary's link to each backup is then a CURVE client with the server's own
   key pair and the backup's public key; the ZAP handler admits the chain's keys besides
   .curve_clients and names each connection's key in its User-Id ("worker KEY" / "replica KEY"),
   so that REPL of every kind (the REPL hello included) is served only from a connection whose
   key is the key of the replica the message names (aux), and a replica's key is no worker (its
   hello, push or BYE is refused): a worker holding the token and the chain cannot speak for a
   replica. Refused as ONLY THE JOB TALKS TO THE JOB says (KVPS_ERR_AUTH, counted, logged once).
   CURVE and a chain without the keys is KVPS_ERR_CONFIG at create, naming curve_replica_keys.
   When the replicas share a key pair the key proves membership of the chain, not the place.
   tests/test_curve.c test_curve_replicas: a 1 x 2 CURVE chain of server processes, 2 workers,
   a worker key's REPL hello (right token and chain) and forged epoch refused, the primary
   SIGKILLed, every sum exact on the backup. Size limits: the server sets ZMQ_MAXMSGSIZE to .max_msg_bytes (default
   max_value_len floats + 64 MiB), so no peer makes it allocate more for one frame (ZeroMQ drops
   that connection), and checks every length before allocating (KVPS_ERR_TOO_LARGE).
   ONLY THE JOB TALKS TO THE JOB. With or without CURVE, a server serves a connection (tcp://,
   ipc://; inproc:// is its own process) only once it has accepted a worker's hello on it, and
   then only that worker's requests (its routing id names its rank and incarnation); replica
   traffic (REPL of every kind: forwarded requests, snapshots, rounds, a later epoch) only from a
   connection on which a replica of the same chain proved itself with a REPL hello. Everything
   else (a stranger's push, BYE, DROP, PLACE, a forged epoch) is answered KVPS_ERR_AUTH, changes
   nothing, is counted (stats.strangers) and logged once per connection with its address. A
   server restored from a checkpoint admits the workers its re-send windows record, and serves
   each worker only once it has said hello again on its new connection (FAULTS, checkpoints):
   what it sends before is dropped, unanswered. A worker that says hello again to a server that
   does not know it (restarted without its checkpoint) is refused (KVPS_ERR_AUTH).
   JOB TOKEN: a secret shared by the job's processes (.job_token, else $KVPS_JOB_TOKEN; kvps-run
   makes a fresh one per job, or passes on the one in its environment; under mpirun or srun set
   it yourself, e.g. mpirun -x KVPS_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')).
   Hellos and REPL hellos carry its digest, and a server refuses one that differs from its own
   (KVPS_ERR_AUTH, naming KVPS_JOB_TOKEN). Without a token, a hello that matches the job's
   configuration is all a process needs to join, and a replica link needs only the chain: set a
   token wherever strangers can reach the servers' ports. The digest travels in plaintext:
   against eavesdroppers, CURVE. Without CURVE the job's own processes are trusted (a worker
   holds the token, so it could forge a replica's hello); with CURVE a replica's hello needs a
   replica's key (CURVE WITH REPLICAS above).

   13. TIMELINE
   KVPS_TIMELINE=DIR in the environment, or .timeline = "DIR" in a server's, worker's or ring's
   desc ("" turns it off whatever the environment says), makes the object write what it does as
   Chrome trace-event JSON into DIR (made if missing; one that cannot be made or written is
   KVPS_ERR_CONFIG at create): kvps-server-RANK-PID.json, kvps-worker-RANK-PID.json,
   kvps-ring-RANK-PID.json (-2, -3, ... for more objects of one rank in a process), each with
   its process named ("server 1", "worker 0", "ring rank 2"). Open one in
   https://ui.perfetto.dev or chrome://tracing, or merge a job's: `scripts/kvps-timeline DIR`
   writes DIR/timeline.json (each file's process with a pid of its own, servers' tensor slices
   named after the tensors), prints a summary per process and, with --png, draws the job with
   gnuplot; `kvps-run --timeline DIR` sets the variable for every process and merges at the end.
   Timestamps are CLOCK_REALTIME in microseconds: the files of one machine line up (of several,
   as far as their clocks agree).
     worker  every push, pull, pushpull, init, barrier, push_rows and pull_rows, from the call
             to its completion as the worker sees it (in wait or test; a request destroyed in
             flight has none), on a row per tensor ("tensor fc1.w"), "keys", "rows", "barrier";
             args: op, tensor (raw keys: keys, how many; rows: rows), slices, bytes, servers
             (the indices of the servers it went to), result ("ok", or the result's name)
     server  BSP, SSP, adaptive: every round of every key, from the arrival of its first
             contribution to its application; args: key (a string: JSON readers keep 53 bits),
             slice (a tensor's slice number), round (1 the first), contributions, bytes,
             straggler_wait_us (first to last contribution: the wait for stragglers), apply_us
             (last contribution to the round's end). Async: pushes are applied one by one, up
             to millions a second, so they are counted: an "async applies" event per 100 ms
             that saw any (pushes, keys, bytes). A round of a tensor's slice is named after
             the tensor ("round w[3]", arg tensor), as its workers named it (FIRST CONTACT);
             raw keys by number ("round key 42"); kvps-timeline names any slice still by
             number from the workers' files.
     ring    every collective from its call (kvps_ring_post: its post) to its end; args: coll,
             seq, dtype, count, bytes, op, root, wire, algorithm (as chosen), ranks, queued_us
             (posted ones), result; its phases nested under it (kvps_ring.h, 3. ALGORITHMS).
   Requests in flight together overlap in time: each row has lanes ("tensor w (lane 2)") so
   that events on one row nest, as the viewers want.
   Cost. Off: one predictable branch per hook (callgrind: 15 more instructions per request in
   kvps's own code). On: an event is formatted into a 64 KiB buffer without printf (about 110 ns
   for a request, 170 ns for a round, two clock reads of 20 ns included) and the buffer is
   written when full, at the first event a second after the last write, and at destroy (a
   write moves 200-300 bytes per event). Measured in bench_pushpull --timeline: BENCHMARKS.md,
   Timeline. After every write the file ends with its closing brackets (the next write goes
   over them), so it is whole JSON after destroy and after each write: a process that dies
   leaves a file that loads, short of at most its last second.

   14. REVISION HISTORY
   0.1  sharded push/pull/pushpull/barrier, BSP and async, MEAN/SUM/SGD/custom updates, tensors.
   0.2  codecs, SSP/adaptive, optimizers, sparse tables, zero-copy pulls, faults (re-sends,
        exactly-once, lost workers, elastic BSP, checkpoints) and CURVE.
        Every public enum ends with a _COUNT member (KVPS_RULE_COUNT, KVPS_DTYPE_COUNT, ...): a
        switch over one without a default now draws -Wswitch for it. Defaults are named
        (KVPS_DEFAULT_LR, ...); the built-in codecs are KVPS_CODEC_TABLE.
        The timeline (13): KVPS_TIMELINE and a .timeline field last in each desc.
        Sessions (CLEAN FINISH, FIRST CONTACT, STALLS), wire protocol 3 (ops HELLO, BYE,
        STATUS, NAME). What changes for existing programs: a server stops by itself once all
        its workers have finished (kvps_worker_destroy says goodbye): a server meant to outlive
        its workers sets .keep_serving = 1; two live workers of one rank are refused; a server
        never reached is KVPS_ERR_PEER_LOST "never connected" at the wait's timeout, as one
        that was lost, rather than KVPS_ERR_TIMEOUT.
        Replicated shards (FAULTS, REPLICAS): '|' in a server list entry, desc fields
        .replicas/.replica/.replacement (server) and .failover_ms (worker), op REPL (kinds FWD,
        SNAP, LOST, ROUND: under BSP each round's sum, not the pushes), stats repl_bytes,
        KVPS_ERR_NOT_PRIMARY, stats primary/replicas_live/takeovers/snapshots; .read_local
        (last in the worker desc), op READ, stats reads, protocol release 6. For existing
        programs: a request of more than 2 frames is refused (KVPS_ERR_MALFORMED) by every op.
        FUSION: kvps_worker_push_tensors / pull_tensors / pushpull_tensors,
        kvps_worker_tensor_priority, desc fields fusion_bytes and credit_bytes (last in the
        desc); kvps_fuse.h (kvps_ring_allreduce_many, kvps_fuse_*).
        RESHARD: kvps_worker_reshard, kvps_worker_reshard_keys, ops KEYS, EXPORT, IMPORT, DROP,
        PLACE, EXPORT_ROWS, IMPORT_ROWS, DROP_ROWS, PLACE_GET; placement through virtual shards
        (the same servers as before until a reshard); checkpoint version 3 records the
        placement with its moves (versions 2 and 1 are still read); HELLO's last 8 bytes carry
        the worker's placement hash, and its answer may carry the server's placement; a
        worker's first keyed call waits for the first hello's answer. Protocol release 4
        (HELLO): reshards planned by bytes, sparse tables' rows move; a worker and a server of
        different releases refuse each other at the hello, with both named.
        A job that lost a worker ends (CLEAN FINISH, FAULTS): for existing programs, a server
        whose workers have all finished or are lost (one lost) stops by itself and
        kvps_server_run (and kvps_server_wait) returns KVPS_ERR_PEER_LOST where it served on
        before (.keep_serving = 1 keeps that); a snapshot's session bytes carry each worker's
        loss (bit 1 of its finished byte). Checkpoints: a failed write is tried again at the
        next checkpoint, not every round; dead writers' PATH.tmp.PID files are removed.
        A restore keeps BSP rounds aligned (FAULTS, checkpoints; issue 27): replies that
        succeed carry the server's checkpoint stamp in aux; a worker keeps what a server's
        checkpoints may lack and sends it again, in order, behind a second hello (HELLO of 64
        bytes: again, the stamp heard); a restored server serves a worker from that hello on,
        and refuses one that heard of a newer checkpoint than it holds (KVPS_ERR_CHECKPOINT);
        checkpoint version 4 records the server's checkpoint count (versions 3, 2, 1 still
        read); tensor_optim's CONFIG and the table ops carry the worker's incarnation, so they
        too are applied once and sent again after a reconnect. Protocol release 8.
        CURVE with REPLICAS (SECURITY; issue 27): server desc field curve_replica_keys (last;
        else $KVPS_CURVE_REPLICA_KEYS); replica links are CURVE clients; REPL only from the
        named replica's key, no worker op from a replica's key. For existing programs: a
        server with curve_secret_key and a chain of replicas without the keys is now refused
        at create (KVPS_ERR_CONFIG); before, such a chain could not replicate at all.
        One header per concern (issue 28): kvps_core.h and kvps_codec.h hold what kvps.h and
        kvps_ring.h share (every name unchanged); each header has its own implementation
        switch, and KVPS_IMPLEMENTATION still implements every header included. For existing
        programs: kvps_ring.h no longer includes kvps.h, so a program that uses the parameter
        server (or kvps_ring_rendezvous, now declared here) having included only kvps_ring.h
        adds `#include "kvps.h"`. The update rule that adds a round's sum to the stored value is
        KVPS_UPDATE_ACCUMULATE, kvps_rule's word for it (KVPS_UPDATE_SUM stays as its alias). The
        server's ops are one table (KVPS__OPS); WIRE FORMAT lists them all (OPS) and test_api
        holds the list to the code. kvps_codec.h's KVPS_CODEC_TABLE rows changed shape (see its
        revision history).
        AdamW and user rules (issue 31; CONSISTENCY AND UPDATE RULES): KVPS_RULE_ADAMW,
        kvps_optim.weight_decay (last; 0: none; refused with a rule that does not use it), user
        rules per tensor with per-element state (kvps_server_desc.user_rules / num_user_rules,
        last; kvps_user_rule, kvps_rule_args, KVPS_RULE_USER, KVPS_MAX_RULE_STATE), carried by
        checkpoints, replicas and reshards. Protocol release 9: the CONFIG record is 28 bytes
        (weight_decay), the TABLE record's seed follows init_scale; checkpoint version 5 adds
        each key's weight_decay and step (version 4 and older still read). For existing
        programs: rule ids 64-127 are user rules, so a worker no longer refuses them itself
        (the server does, naming the tensor).
        Slow is not dead (TIMEOUTS; issue 31): desc.timeout_ms 0 is no deadline (was 10 s), so
        wait(-1) waits as long as the servers live; dead ones end it (peer_timeout_ms). Worker
        desc field stall_ms (last): the worker's stall inspector. For existing programs: a job
        that relied on the 10 s default to give up on a live but stuck job sets .timeout_ms.
        kvps_ring.h likewise (its section 5): .timeout_ms 0 is none (was 30 s), fields stall_ms
        and peer_timeout_ms (last), heartbeats and a monitor on each peer's ZeroMQ connection.
        Join and a scalar all-reduce (issue 31): kvps_worker_join (op JOIN),
        kvps_worker_allreduce_scalar (op ALLREDUCE, kvps_scalar_op), in protocol release 9 with
        the CONFIG record's weight_decay. For
        existing programs: round and barrier numbers count from 1 everywhere (CONSISTENCY): the
        timeline's round arg was 0 for a key's first round, and barriers in messages were
        numbered from 0.
*/
/* kvps.h stands on kvps_core.h (results, logging, clocks, ZeroMQ contexts, frames, the timeline
   writer) and kvps_codec.h (the codecs and element-wise numerics); KVPS_PS_IMPLEMENTATION turns
   on this header's implementation and theirs (KVPS_IMPLEMENTATION: of every kvps header). */
#ifndef KVPS__CORE_ZMQ
#define KVPS__CORE_ZMQ /* (core's ZeroMQ part: contexts and frames) */
#endif
#include "kvps_core.h"
#include "kvps_codec.h"
#include "kvps_launch.h"

#ifndef KVPS_H
#define KVPS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvps_consistency {
    KVPS_BSP = 0, KVPS_ASYNC = 1,
    KVPS_SSP = 2,      /* bounded staleness: .staleness = k */
    KVPS_ADAPTIVE = 3, /* k moved by the server between .staleness_min and .staleness */
    KVPS_CONSISTENCY_COUNT
} kvps_consistency;

/* Per-tensor rules (kvps_worker_tensor_optim); g = the round's sum / count (mean gradient). */
typedef enum kvps_rule {
    KVPS_RULE_DEFAULT = 0,    /* the server's desc.update */
    KVPS_RULE_MEAN = 1,       /* aggregate-only: value = mean of the round */
    KVPS_RULE_SUM = 2,        /*   value = sum of the round */
    KVPS_RULE_MAX = 3,        /*   value = element-wise max over the round's contributions */
    KVPS_RULE_MIN = 4,        /*   value = element-wise min */
    KVPS_RULE_ACCUMULATE = 5, /* value += sum of the round */
    KVPS_RULE_SGD = 6,        /* w -= lr * g */
    KVPS_RULE_MOMENTUM = 7,   /* v = mu * v + g; w -= lr * v */
    KVPS_RULE_NESTEROV = 8,   /* v = mu * v + g; w -= lr * (g + mu * v) */
    KVPS_RULE_ADAGRAD = 9,    /* h += g * g; w -= lr * g / (sqrt(h) + eps) */
    KVPS_RULE_ADAM = 10,      /* b1t *= b1; b2t *= b2 (from 1); m = b1 * m + (1 - b1) * g;
                                 v = b2 * v + (1 - b2) * (g * g);
                                 w -= lr * (m / (1 - b1t)) / (sqrt(v / (1 - b2t)) + eps) */
    KVPS_RULE_ADAMW = 11,     /* PyTorch's torch.optim.AdamW, t the key's step (1 at its first
                                 update), in float but for d, s, c2 in double (f(x): x rounded
                                 to float): d = f(1 - (double)lr * wd); w = w * d;
                                 m = b1 * m + f(1 - b1) * g; v = b2 * v + (f(1 - b2) * g) * g;
                                 s = (double)lr / (1 - pow(b1, t)); c2 = sqrt(1 - pow(b2, t));
                                 w = w - (f(s) * m) / (sqrtf(v) / f(c2) + eps) */
    KVPS_RULE_COUNT,
    /* A server's user rules (kvps_server_desc.user_rules): rule i is KVPS_RULE_USER + i */
    KVPS_RULE_USER = 64,
    KVPS_RULE_USER_LAST = 127
} kvps_rule;

/* Zero means default: lr 0.01, momentum 0.9, beta1 0.9, beta2 0.999, eps 1e-8; weight_decay 0
   is none (ADAMW's and user rules' only: set with another rule it is refused). Out of range
   (lr < 0, momentum / beta outside [0, 1), eps <= 0, weight_decay < 0, not finite) is
   KVPS_ERR_HYPERPARAM. The optimizer state (v, h, m; a user rule's) lives on the server shard
   that owns each slice. */
typedef struct kvps_optim {
    kvps_rule rule;
    float lr, momentum, beta1, beta2, eps;
    float weight_decay; /* last, so that positional initialisers keep their meaning */
} kvps_optim;

/* USER RULES (CONSISTENCY AND UPDATE RULES): what a user rule sees when a round of a key is
   applied (one call per round). state[j] holds len floats of the key's per-element state j
   (j < n_state), zero before the first step, kept by kvps with the key (checkpoints, replicas,
   reshards). step is 1 at the first update under this rule and counts on (a CONFIG resets it
   and the state). */
typedef struct kvps_rule_args {
    uint64_t key;
    float *value;          /* the stored value, updated in place */
    const float *sum;      /* this round's contributions, summed in rank order */
    int count;             /* contributions summed: m under BSP, 1 under async */
    float *const *state;   /* n_state arrays of len floats */
    size_t len;            /* floats */
    uint64_t step;         /* 1, 2, ... */
    const kvps_optim *opt; /* the key's hyper-parameters, defaults resolved */
    void *user;            /* the rule's user pointer */
} kvps_rule_args;
typedef void (*kvps_rule_fn)(const kvps_rule_args *a);
typedef struct kvps_user_rule {
    const char *name;   /* for messages ("momentum-ema"); NULL: "user rule i" */
    kvps_rule_fn fn;    /* required */
    int n_state;        /* per-element state floats, 0 to KVPS_MAX_RULE_STATE */
    void *user;
} kvps_user_rule;
#define KVPS_MAX_RULE_STATE 8

/* Defaults written once (a zero field in a desc, an optim or a codec means these). */
#define KVPS_DEFAULT_LR 0.01f
#define KVPS_DEFAULT_MOMENTUM 0.9f
#define KVPS_DEFAULT_BETA1 0.9f
#define KVPS_DEFAULT_BETA2 0.999f
#define KVPS_DEFAULT_EPS 1e-8f
#define KVPS_DEFAULT_HEARTBEAT_MS 1000
#define KVPS_DEFAULT_PEER_TIMEOUT_MS 5000

/* The server's update rule for every key without a rule of its own. The names are kvps_rule's
   (one vocabulary): MEAN is KVPS_RULE_MEAN, ACCUMULATE is KVPS_RULE_ACCUMULATE, SGD is KVPS_RULE_SGD. */
typedef enum kvps_update {
    KVPS_UPDATE_MEAN = 0,       /* value = sum / count */
    KVPS_UPDATE_ACCUMULATE = 1, /* value += sum */
    KVPS_UPDATE_SGD = 2,        /* value -= lr * (sum / count) */
    KVPS_UPDATE_CUSTOM = 3,
    KVPS_UPDATE_COUNT,
    /* The old name of ACCUMULATE, kept for programs that use it: it never meant KVPS_RULE_SUM
       (value = sum of the round). */
    KVPS_UPDATE_SUM = KVPS_UPDATE_ACCUMULATE
} kvps_update;


typedef enum kvps_role { KVPS_ROLE_NONE = 0, KVPS_ROLE_SERVER = 1, KVPS_ROLE_WORKER = 2, KVPS_ROLE_COUNT } kvps_role;

/* What an update rule sees when a round of a key is applied (one call per round). */
typedef struct kvps_update_args {
    uint64_t key;
    float *value;      /* the stored value, updated in place */
    const float *sum;  /* contributions of this round, summed in rank order */
    size_t len;        /* floats */
    int count;         /* contributions summed: m under BSP, 1 under async */
    uint64_t round;    /* rounds applied to this key before this one */
    void *user;        /* desc.update_user */
} kvps_update_args;
typedef void (*kvps_update_fn)(const kvps_update_args *a);
/* Writes a new key's initial value (called once, when the key is first used). */
typedef void (*kvps_init_fn)(void *user, uint64_t key, float *value, size_t len);

/* Server configuration; zero means default.
   | field          | default               |
   | endpoint       | required              |
   | num_workers    | required (>= 1)       |
   | rank           | 0 (server index, for logs; server 0 also serves barriers) |
   | consistency    | KVPS_BSP              |
   | update         | KVPS_UPDATE_MEAN (KVPS_UPDATE_CUSTOM when update_fn is set) |
   | lr             | 0.01 for SGD; refused with another update (it would be ignored) |
   | max_value_len  | 1 << 28 floats (1 GiB) per key |
   | zmq_ctx        | a context of its own  |
   | io_threads     | 1 (own context only)  |
   | no_malloc_tuning | 0: tune glibc malloc (see MEMORY in the manual); 1: leave it alone |
   | io_cpus        | NULL: the OS places the I/O thread; "0-3": pinned (see CPU PINNING) |
   | timeline       | NULL: $KVPS_TIMELINE, else none; "DIR": a timeline in DIR (see TIMELINE) |
   | user_rules     | none: rule KVPS_RULE_USER + i is user_rules[i] (USER RULES, in section 5) | */
typedef struct kvps_server_desc {
    const char *endpoint;
    int num_workers;
    int rank;
    kvps_consistency consistency;
    kvps_update update;
    float lr;                /* KVPS_UPDATE_SGD's rate (0: 0.01); set with any other update: refused */
    kvps_update_fn update_fn;
    void *update_user;
    kvps_init_fn init_fn;
    void *init_user;
    uint64_t max_value_len;
    void *zmq_ctx;
    int io_threads;
    int no_malloc_tuning;
    const struct kvps_codec *codecs; /* user codecs (ids >= KVPS_CODEC_USER) this server decodes */
    int num_codecs;
    int staleness;      /* KVPS_SSP: k; KVPS_ADAPTIVE: the largest k it may choose */
    int staleness_min;  /* KVPS_ADAPTIVE: the smallest k (0 = BSP) */
    void (*on_switch)(void *user, int old_k, int new_k); /* KVPS_ADAPTIVE: told of each change */
    void *switch_user;
    int heartbeat_ms;        /* ZMTP heartbeats: 1000 (-1: none) */
    int peer_timeout_ms;     /* a worker silent or disconnected this long is lost: 5000 (at least
                                2 x heartbeat_ms, else refused); under elastic, also how long a job
                                whose workers have all finished or are lost waits for a lost one */
    const char *checkpoint_path; /* where kvps_server_checkpoint (and checkpoint_every) write (via
                                    PATH.tmp.PID; dead writers' are removed, FAULTS) */
    int checkpoint_every;    /* also write one every this many rounds (0: only on request); a failed
                                write is tried again this many rounds later */
    /* CURVE (see SECURITY): this server's secret key (Z85, 40 characters) turns encryption on;
       only workers whose public key is in curve_clients get in. Needs a ZeroMQ context of the
       server's own (zmq_ctx NULL): the context's authentication handler is this server's. */
    const char *curve_secret_key;
    const char *const *curve_clients;
    int num_curve_clients;
    int elastic; /* 1: a lost worker leaves the aggregation (means over those left) and may join again
                    (once every worker has finished or is lost, for peer_timeout_ms more) */
    int64_t max_msg_bytes; /* largest frame ZeroMQ accepts (a bigger one drops that connection):
                              max_value_len floats + 64 MiB */
    int max_queued_replies; /* per worker: replies waiting to be read (10000); more are dropped */
    const char *io_cpus;    /* CPUs for the I/O thread(s) of the server's own context (CPU PINNING) */
    int keep_serving; /* 0: kvps_server_run returns KVPS_OK by itself once every one of num_workers
                         workers has finished (kvps_worker_finish or destroy: CLEAN FINISH), and
                         KVPS_ERR_PEER_LOST once every one has finished or is lost, one lost
                         (FAULTS; elastic: peer_timeout_ms later); 1: serves until
                         kvps_server_stop (a long-lived server) */
    int stall_ms;     /* the stall inspector: a pull or barrier waiting this long is logged (warn)
                         with the workers it waits for, again every stall_ms: 60000 (-1: off) */
    /* last, so that positional initialisers keep their meaning: */
    const char *timeline;   /* a directory to write this server's timeline into (TIMELINE); NULL: the
                               KVPS_TIMELINE environment variable, else none; "": none */
    /* REPLICAS: the chain of this server's shard, "tcp://a:5555|tcp://b:5555" (its entry of
       KVPS_SERVERS; NULL or one endpoint: no replicas), and this server's place in it (0 is
       the first primary). replacement = 1: started in place of a lost replica, it starts as a
       backup and waits for the primary's snapshot whatever its place. */
    const char *replicas;
    int replica;
    int replacement;
    /* JOB TOKEN (SECURITY): a secret every process of the job shares; a worker's hello and a
       replica's link must carry it. NULL: $KVPS_JOB_TOKEN (kvps-run sets one), else none; "": none */
    const char *job_token;
    /* CURVE with REPLICAS (SECURITY): the public keys (Z85) of the chain's servers, in chain order,
       joined by '|' as .replicas is ("K0|K1"), or one key for all when the replicas share a key pair
       (a CURVE worker's curve_server_keys has one key per shard, so its failover needs that). The
       replica links speak CURVE with them (each server's own key pair, the target's public key),
       and only they may send REPL; entry .replica must be this server's own public key. Required
       when curve_secret_key and a chain of replicas are both set. NULL: $KVPS_CURVE_REPLICA_KEYS,
       else none; "": none */
    const char *curve_replica_keys;
    /* USER RULES: rule KVPS_RULE_USER + i is user_rules[i] (at most 64; the array is copied).
       Every server of a job registers the same rules in the same order. */
    const kvps_user_rule *user_rules;
    int num_user_rules;
} kvps_server_desc;

/* Counters read with kvps_server_stats (any thread). */
typedef struct kvps_server_stats {
    uint64_t keys;        /* keys held */
    uint64_t value_bytes; /* bytes of stored values */
    uint64_t pushes;      /* key contributions received */
    uint64_t pulls;       /* key values sent */
    uint64_t rounds;      /* rounds applied, all keys */
    uint64_t errors;      /* requests answered with an error (or dropped) */
    uint64_t stalls;      /* pulls that had to wait for a round */
    uint64_t switches;    /* KVPS_ADAPTIVE: changes of k */
    uint64_t staleness;   /* the k in force */
    uint64_t table_rows;  /* sparse rows held, all tables */
    uint64_t table_bytes; /* their memory: values + index (+ optimizer state, counted apart) */
    uint64_t table_state_bytes;
    uint64_t duplicates;  /* re-sent requests answered without being applied again */
    uint64_t peers_lost;  /* workers declared lost (no connection for peer_timeout_ms) */
    uint64_t checkpoints; /* checkpoint files written */
    uint64_t fused;       /* async pushes applied in one pass with others queued for their key */
    uint64_t replies_dropped; /* replies to a peer that did not read them (max_queued_replies) */
    /* REPLICAS */
    uint64_t primary;       /* 1 while this server is its shard's primary */
    uint64_t replicas_live; /* a primary: the replicas holding the shard, itself included; a
                               backup: 1 once it holds the shard (its snapshot came), else 0 */
    uint64_t takeovers;     /* times this server took over as primary */
    uint64_t snapshots;     /* snapshots sent (a primary) or loaded (a backup) */
    uint64_t repl_bytes;    /* a primary: bytes sent down the chain, to all backups together */
    uint64_t reads;         /* READs answered: pushpulls' pulls from workers with .read_local */
    uint64_t strangers;     /* messages refused as not from the job: no accepted hello on that
                               connection, nor a replica link of this chain (SECURITY) */
} kvps_server_stats;

/* Worker configuration; zero means default.
   | field         | default                                   |
   | servers       | required: comma-separated endpoints       |
   | rank          | 0                                         |
   | num_workers   | 0 = unchecked; else rank must be below it |
   | timeout_ms    | 0: none: a wait (-1) on live servers lasts as long as it takes (TIMEOUTS) |
   | min_slice     | 1024 floats: tensors are cut into slices no smaller than this (max_slice wins) |
   | max_slice     | 256 Ki floats (1 MiB): longer slices are cut again (see KEYS, TENSORS) |
   | zerocopy_min  | 65536 bytes: smaller pushes are copied into the message |
   | zmq_ctx       | a context of its own                      |
   | io_threads    | 1 (own context only)                      |
   | no_malloc_tuning | 0: tune glibc malloc (see MEMORY); 1: leave it alone |
   | heartbeat_ms  | 1000: ZMTP heartbeat interval on every connection (-1: none) |
   | peer_timeout_ms | 5000: a connection silent this long is dropped and re-made (at least 2 x heartbeat_ms) |
   | io_cpus       | NULL: the OS places the I/O thread; "0-3": pinned (see CPU PINNING) |
   | timeline      | NULL: $KVPS_TIMELINE, else none; "DIR": a timeline in DIR (see TIMELINE) |
   | failover_ms   | 1000: a shard's server unreachable this long: the next replica (REPLICAS) |
   | fusion_bytes  | 256 KiB: a fused request's message to one server carries slices up to this (FUSION) |
   | credit_bytes  | 0: every message goes at once; else the bytes in flight to one server, the rest wait, highest priority first (FUSION) |
   | read_local    | 0: $KVPS_READ_LOCAL (1: on), else off; 1: a BSP pushpull reads from a replica on this host (REPLICAS) |
   | stall_ms      | 60000: a wait this long is logged (warn) with what the servers wait for, again every stall_ms; -1: off |
   See FAULTS: a request whose server connection drops is re-sent when it comes back. */
typedef struct kvps_worker_desc {
    const char *servers;
    int rank;
    int num_workers;
    int timeout_ms;
    size_t min_slice;
    size_t zerocopy_min;
    void *zmq_ctx;
    int io_threads;
    int no_malloc_tuning;
    int heartbeat_ms;
    int peer_timeout_ms;
    /* CURVE: the servers' public keys (Z85; comma-separated, one per server, or one for all)
       and this worker's key pair. All three, or none (plaintext). */
    const char *curve_server_keys;
    const char *curve_public_key;
    const char *curve_secret_key;
    size_t max_slice; /* after the older fields, so that positional initialisers keep their meaning */
    const char *io_cpus; /* CPUs for the I/O thread(s) of the worker's own context (CPU PINNING) */
    /* last, so that positional initialisers keep their meaning: */
    const char *timeline; /* a directory to write this worker's timeline into (TIMELINE); NULL: the
                             KVPS_TIMELINE environment variable, else none; "": none */
    int failover_ms; /* REPLICAS: a shard's server unreachable this long: move to its next replica
                        (1000) */
    size_t fusion_bytes; /* FUSION: the most one message of a fused request carries (256 KiB) */
    size_t credit_bytes; /* FUSION: bytes in flight to one server (0: no limit); the rest wait, by priority */
    int read_local; /* REPLICAS under BSP: 1: a pushpull reads its result from a replica of the shard on
                       this host (READS FROM A LOCAL REPLICA); 0: $KVPS_READ_LOCAL, else off; -1: off */
    const char *job_token; /* JOB TOKEN (SECURITY): the job's secret, sent (digested) in the hello;
                              NULL: $KVPS_JOB_TOKEN, else none; "": none */
    int stall_ms; /* the stall inspector: a wait this long is logged (warn), naming the request and what
                     each server it waits for waits for, again every stall_ms: 60000 (-1: off) */
} kvps_worker_desc;

typedef struct kvps_server kvps_server;
typedef struct kvps_worker kvps_worker;
typedef uint64_t kvps_req; /* request handle; 0 is never a valid handle */
typedef int kvps_tensor;   /* tensor handle from kvps_worker_tensor */

typedef struct kvps_env {
    kvps_role role;
    int rank;          /* server index or worker rank */
    int num_servers;
    int num_workers;
    const char *servers;  /* KVPS_SERVERS as given */
    char endpoint[256];   /* for a server: its own endpoint (its replica's, with REPLICAS) */
    /* REPLICAS: a shard's entry of KVPS_SERVERS may list r endpoints joined by '|' */
    char replicas[1024];  /* for a server: its shard's entry of KVPS_SERVERS (the chain) */
    int replica;          /* for a server: its place in the chain: KVPS_REPLICA, else 0; under
                             mpirun/srun without KVPS_ROLE, server process p is shard p % n,
                             replica p / n */
    int replacement;      /* KVPS_REPLACEMENT=1: started in place of a lost replica */
} kvps_env;


KVPS_API kvps_result kvps_env_read(kvps_env *env);

KVPS_API kvps_result kvps_server_create(const kvps_server_desc *desc, kvps_server **out);
KVPS_API const char *kvps_server_endpoint(const kvps_server *s); /* resolved, e.g. port of '*' */
/* Serves until every worker has finished (CLEAN FINISH: KVPS_OK), or has finished or is lost
   (FAULTS: KVPS_ERR_PEER_LOST), or kvps_server_stop (KVPS_OK). */
KVPS_API kvps_result kvps_server_run(kvps_server *s);
KVPS_API kvps_result kvps_server_start(kvps_server *s); /* serves from a background thread */
KVPS_API void kvps_server_stop(kvps_server *s);
/* For a server serving from kvps_server_start: waits until it has stopped, by itself (every
   worker finished, or finished or lost) or by kvps_server_stop, and returns what
   kvps_server_run returned (KVPS_OK; KVPS_ERR_PEER_LOST: the job ended with workers lost), or
   KVPS_ERR_TIMEOUT after timeout_ms (-1: no limit; the server's own stall inspector says
   meanwhile what it waits for). */
KVPS_API kvps_result kvps_server_wait(kvps_server *s, int timeout_ms);
KVPS_API void kvps_server_stats_get(const kvps_server *s, kvps_server_stats *out);
KVPS_API void kvps_server_destroy(kvps_server **s);
/* Checkpoints (see FAULTS). kvps_server_checkpoint writes the shard (values, optimizer state,
   rounds, which requests were applied) to desc.checkpoint_path: a temporary file, fsync,
   rename, so the path always holds a whole checkpoint. From any thread; the serving thread
   writes it at the next moment no round is half summed, within timeout_ms.
   kvps_server_restore loads one into a server that has not started and holds no keys; a file
   that is torn, corrupt, of another version, or of another server (rank, workers) is refused
   with KVPS_ERR_CHECKPOINT and nothing loaded. Sparse tables are included. */
KVPS_API kvps_result kvps_server_checkpoint(kvps_server *s, int timeout_ms);
/* Reads a CURVE certificate file in CZMQ's zcert format (`make certs` writes them): the public
   key, and the secret key when the file is a secret certificate (else *secret_z85 = 0). */
KVPS_API kvps_result kvps_cert_load(const char *path, char public_z85[41], char secret_z85[41]);
KVPS_API kvps_result kvps_server_restore(kvps_server *s, const char *path);

KVPS_API kvps_result kvps_worker_create(const kvps_worker_desc *desc, kvps_worker **out);
/* Tells every server this worker is done: it sends nothing more. A server whose workers have
   all finished stops by itself (unless .keep_serving), so a job ends cleanly. Servers answer
   in order, after everything this worker sent before; waits up to timeout_ms (-1: the worker's
   desc.timeout_ms, else 10 s) for them. Servers that are unreachable are not waited for. kvps_worker_destroy
   does it by itself (waiting at most 1 s) when it was not called. */
KVPS_API kvps_result kvps_worker_finish(kvps_worker *w, int timeout_ms);
KVPS_API void kvps_worker_destroy(kvps_worker **w);
/* RESHARD: grows or shrinks the server set while training goes on. Every worker calls it at the
   same point (a collective, like a barrier), with no request in flight and the same new list:
   the old list with servers added at its end, or some removed from its end (the barrier server,
   server 0, stays). The keys whose placement changes (about 1/n of them) move, with their
   values, optimizer state (a user rule's too), steps and round counters, and nothing else does;
   the servers that leave
   stop by themselves. New servers must be running (rank = their place in the new list). The
   servers record the new placement in their checkpoints: workers of a job restarted from them
   take it from the servers by themselves. A CURVE worker connects to the new servers with its
   own key pair (kept from kvps_worker_create) and the servers' one public key, when it was
   given one for all; given one per server, it needs the new list's: kvps_worker_reshard_keys
   (curve_server_keys: one for all, or one per server of the new list, Z85). */
KVPS_API kvps_result kvps_worker_reshard(kvps_worker *w, const char *servers, int timeout_ms);
KVPS_API kvps_result kvps_worker_reshard_keys(kvps_worker *w, const char *servers, const char *curve_server_keys,
                                              int timeout_ms);
KVPS_API int kvps_worker_num_servers(const kvps_worker *w);
KVPS_API const char *kvps_worker_last_error(const kvps_worker *w);

/* Raw keys: vals holds the keys' values back to back, lens[i] floats for keys[i]. */
KVPS_API kvps_result kvps_worker_push(kvps_worker *w, const uint64_t *keys, const float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out);
KVPS_API kvps_result kvps_worker_pull(kvps_worker *w, const uint64_t *keys, float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out);
KVPS_API kvps_result kvps_worker_pushpull(kvps_worker *w, const uint64_t *keys,
                                          const float *grads, float *vals, const size_t *lens,
                                          size_t nkeys, kvps_req *out);
KVPS_API kvps_result kvps_worker_init(kvps_worker *w, const uint64_t *keys, const float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out);

/* Named dense tensors. */
KVPS_API kvps_result kvps_worker_tensor(kvps_worker *w, const char *name, size_t len,
                                        kvps_tensor *out);
KVPS_API size_t kvps_worker_tensor_slices(const kvps_worker *w, kvps_tensor t);
KVPS_API kvps_result kvps_worker_push_tensor(kvps_worker *w, kvps_tensor t, const float *grad,
                                             kvps_req *out);
KVPS_API kvps_result kvps_worker_pull_tensor(kvps_worker *w, kvps_tensor t, float *vals,
                                             kvps_req *out);
KVPS_API kvps_result kvps_worker_pushpull_tensor(kvps_worker *w, kvps_tensor t,
                                                 const float *grad, float *vals, kvps_req *out);
KVPS_API kvps_result kvps_worker_init_tensor(kvps_worker *w, kvps_tensor t, const float *vals,
                                             kvps_req *out);
/* FUSION: several tensors in one request (as Horovod's tensor fusion and PyTorch DDP's buckets):
   each server gets one message carrying all of its slices of all of them (split at
   fusion_bytes), instead of one per slice. grads[i] / vals[i] belong to ts[i]; a tensor at most
   once. Slices go out in the order of the tensors' priorities (kvps_worker_tensor_priority,
   highest first), then of the list. Tensors with a codec go as their own messages, in the same
   request. One handle: wait for it as for any request. */
KVPS_API kvps_result kvps_worker_push_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, const float *const *grads,
                                              kvps_req *out);
KVPS_API kvps_result kvps_worker_pull_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, float *const *vals,
                                              kvps_req *out);
KVPS_API kvps_result kvps_worker_pushpull_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, const float *const *grads,
                                                  float *const *vals, kvps_req *out);
/* A tensor's priority (default 0): among a fused request's slices, higher ones go first. */
KVPS_API kvps_result kvps_worker_tensor_priority(kvps_worker *w, kvps_tensor t, int priority);
/* Zero-copy pull (ps-lite's ZPull): the values stay in the received ZeroMQ messages and *view
   points into them, so nothing is copied on this worker. *view is created by the call (NULL on
   an immediate error) and is the caller's to release with kvps_view_release, whatever the
   request's result (but, like a pull's destination buffer, not while the request is still in
   flight); its parts are readable once kvps_worker_wait / test returns KVPS_OK. Part i
   holds the tensor's floats [offset, offset + len) (one part per slice, in tensor order). */
typedef struct kvps_view kvps_view;
KVPS_API kvps_result kvps_worker_pull_tensor_view(kvps_worker *w, kvps_tensor t, kvps_view **view, kvps_req *out);
KVPS_API size_t kvps_view_parts(const kvps_view *v);
KVPS_API const float *kvps_view_part(const kvps_view *v, size_t i, size_t *offset, size_t *len);
KVPS_API void kvps_view_release(kvps_view **v);

/* Compression per tensor (see CODECS): pushes encoded with push (NULL: none), with error
   feedback kept per slice on this worker when error_feedback is 1; pulls answered encoded with
   pull (NULL: none; one of the built-in dense codecs, or a user codec the server knows). The
   server decodes and aggregates whatever each worker sends; top-k is summed sparsely. */
KVPS_API kvps_result kvps_worker_tensor_codec(kvps_worker *w, kvps_tensor t, const kvps_codec *push,
                                              const kvps_codec *pull, int error_feedback);
typedef struct kvps_tensor_stats {
    uint64_t pushes, push_raw_bytes, push_wire_bytes; /* raw = float32 bytes, wire = payload sent */
    uint64_t pulls, pull_raw_bytes, pull_wire_bytes;
} kvps_tensor_stats;
KVPS_API kvps_result kvps_worker_tensor_stats(const kvps_worker *w, kvps_tensor t, kvps_tensor_stats *out);

/* Sets the update rule and hyper-parameters of a tensor on the servers that hold its slices
   (any worker may do it, before the tensor is trained; a change resets optimizer state). */
KVPS_API kvps_result kvps_worker_tensor_optim(kvps_worker *w, kvps_tensor t, const kvps_optim *o, kvps_req *out);

/* Elastic averaging (EASGD): pulls the centre c, e = alpha * (local - c), pushes e (the centre's
   servers use KVPS_RULE_ACCUMULATE, so c += e), local -= e. Blocking, within timeout_ms. */
KVPS_API kvps_result kvps_worker_easgd(kvps_worker *w, kvps_tensor t, float *local, float alpha, int timeout_ms);

/* SPARSE TABLES (embeddings): rows of dim floats under any uint64_t id, sharded over the servers
   by id, created on first touch (pull or push) with the table's initialiser. Pushes carry
   gradients for the rows a batch touched and are applied on arrival, row by row, with the
   table's rule (optimizer state per row), whatever the server's consistency; a pull returns the
   rows' current values (a row not there yet: its initial value). Duplicate ids in one call are
   merged on the worker (gradients added in call order; one fetch per id). */
typedef int kvps_table;
typedef struct kvps_table_desc {
    const char *name;
    uint32_t dim;
    kvps_optim opt;   /* rule DEFAULT: SGD; aggregate rules store the last gradient */
    float init_scale; /* new rows uniform in [-init_scale, init_scale), from (seed, id, j); 0: zeros */
    uint64_t seed;
} kvps_table_desc;
/* Registers the table on this worker and configures it on every server (same call on every
   worker; a table already there with another dim or rule is KVPS_ERR_TABLE). */
KVPS_API kvps_result kvps_worker_table(kvps_worker *w, const kvps_table_desc *d, kvps_table *out, kvps_req *req);
KVPS_API kvps_result kvps_worker_push_rows(kvps_worker *w, kvps_table t, const uint64_t *ids, const float *grads,
                                           size_t nrows, kvps_req *out);
KVPS_API kvps_result kvps_worker_pull_rows(kvps_worker *w, kvps_table t, const uint64_t *ids, float *rows, size_t nrows,
                                           kvps_req *out);

/* Completes when all workers have entered the barrier (served by server 0). */
KVPS_API kvps_result kvps_worker_barrier(kvps_worker *w, kvps_req *out);

/* A scalar all-reduce among the workers, through server 0, in one blocking call (a loss, a
   count): every worker passes its *x and gets the same result in *x, summed in rank order; a
   round like a barrier's (the workers that have joined or left take no part; MEAN divides by
   those that do). Every worker must pass the same op: else KVPS_ERR_MISMATCH on all of them. */
typedef enum kvps_scalar_op {
    KVPS_SCALAR_SUM = 0, KVPS_SCALAR_MEAN = 1, KVPS_SCALAR_MIN = 2, KVPS_SCALAR_MAX = 3, KVPS_SCALAR_OP_COUNT
} kvps_scalar_op;
KVPS_API kvps_result kvps_worker_allreduce_scalar(kvps_worker *w, double *x, kvps_scalar_op op);
KVPS_API const char *kvps_scalar_op_name(kvps_scalar_op op); /* "sum", "mean", "min", "max"; "?" */

/* JOIN (CONSISTENCY AND UPDATE RULES): this worker's data has ended. Blocking: every server takes
   it out of the aggregation for good, what it pushed before counting; BSP / SSP rounds and
   barriers then complete over the other workers (MEAN and SGD divide by the contributions a
   round has). It may still pull (the weights after the others' rounds); its pushes and barriers
   are refused (KVPS_ERR_STATE). Finish or destroy it as usual: the job ends once every worker has. */
KVPS_API kvps_result kvps_worker_join(kvps_worker *w);

/* Waits for a request; timeout_ms -1 = the worker's desc.timeout_ms, by default none: as long
   as its servers live (TIMEOUTS; the stall inspector logs a long wait). On KVPS_ERR_TIMEOUT, or
   KVPS_ERR_PEER_LOST (a server it waits for was disconnected, or answered that a worker it
   needs is lost), or KVPS_ERR_AUTH (that server refused our handshake), the request stays
   valid: wait again, which re-sends what is owed and applies no push twice (ERRORS AND
   LOGGING: what an error means for the request). Any other return ends the request and frees
   its handle. */
KVPS_API kvps_result kvps_worker_wait(kvps_worker *w, kvps_req req, int timeout_ms);
/* Never blocks: *done = 1 when the request has ended (its result returned, handle freed).
   KVPS_ERR_PEER_LOST with *done = 0: a server answered that a worker is lost; the request
   stays valid and each later test (at most every 100 ms) or wait re-sends it. */
KVPS_API kvps_result kvps_worker_test(kvps_worker *w, kvps_req req, int *done);

/* Endpoint exchange for a ring (kvps_ring.h) through kvps server(s) whose num_workers == size:
   every rank calls it with a worker of that rank and its ring's endpoint; peers_out receives the
   comma-separated list, in rank order, for KVPS_RING_PEERS or kvps_ring_desc.peers. */
KVPS_API kvps_result kvps_ring_rendezvous(kvps_worker *w, int rank, int size, const char *endpoint,
                                          char *peers_out, size_t cap, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_H */

/* ============================================================================================ */
#if defined(KVPS_IMPLEMENTATION) || defined(KVPS_PS_IMPLEMENTATION)
#ifndef KVPS__IMPLEMENTED
#define KVPS__IMPLEMENTED
/* THE IMPLEMENTATION, in layer order (each section uses only those above it and the headers
   under this one, kvps_core.h and kvps_codec.h; find one with `// >>name`):
     config     heartbeat settings, kvps_env_read (the launcher's variables)
     wire       the request header and key entries, the coded-frame iterator, sockets, placement
     rules      the update-rule table, CONFIG records, the rules' maths
     state      the server's types and struct kvps_server
     exactly-once  the per-worker window of applied requests
     replies    sending; the reply-header builder; error and ack replies
     keys       the key store and stored values
     consistency  contributions, applying a round, BSP/SSP/adaptive, parked pulls, barriers,
                async deferral
     liveness   lost, back, leaving and rejoining workers
     tables     sparse tables' storage
     dispatch   the ops table, kvps__handle (parse, liveness, exactly-once, handler) and the
                handlers of keyed and table ops, each a sequence of named checks and steps
     session    HELLO (configuration checked at first contact), BYE (clean finish), tensor
                names, STATUS and the stall inspector
     checkpoint writing and restoring a shard
     replicas   chains of replicas: forwarding, acknowledgements, failover, fences
     curve      CURVE and its ZAP handler
     server-api create, run, start, stop, destroy
     client, tensor, rows, progress   the worker: requests, named tensors, sparse rows, and
                reading replies (re-sends, handshake failures, waiting)
     rendezvous a ring's peers found through the servers (kvps_ring_rendezvous)
     timeline-events  what a server and a worker put in their timelines: rounds, async
                windows, requests from post to completion */
#include <zmq.h>

// >>config
/* Heartbeats that can work: a peer timeout (0: the default) of at least two heartbeat intervals
   (0: the default; -1: no heartbeats), else an idle connection is dropped between two PINGs and
   made again, over and over. Logs what is wrong. */
static int kvps__heartbeat_ok(int heartbeat_ms, int peer_timeout_ms, const char *who) {
    int hb = kvps__def(heartbeat_ms, KVPS_DEFAULT_HEARTBEAT_MS), to = kvps__def(peer_timeout_ms, KVPS_DEFAULT_PEER_TIMEOUT_MS);
    if (heartbeat_ms < -1 || to < 0) {
        kvps__log(KVPS_LOG_ERROR, "%s desc: heartbeat_ms %d / peer_timeout_ms %d: heartbeat_ms is > 0, 0 (default %d) or -1 "
                                  "(none); peer_timeout_ms is > 0 or 0 (default %d)", who, heartbeat_ms, peer_timeout_ms,
                  KVPS_DEFAULT_HEARTBEAT_MS, KVPS_DEFAULT_PEER_TIMEOUT_MS);
        return 0;
    }
    if (hb > 0 && to < 2 * hb) {
        kvps__log(KVPS_LOG_ERROR, "%s desc: peer_timeout_ms %d is less than twice heartbeat_ms %d: an idle connection "
                                  "would be dropped between two heartbeats; make the timeout at least %d ms", who, to, hb, 2 * hb);
        return 0;
    }
    return 1;
}
/* Replicas per shard ('|' in an entry of KVPS_SERVERS): the same for every shard (the mpirun
   mapping needs it); -1 when they differ. */
static int kvps__env_reps(char **eps, int n) {
    int reps = 1;
    for (int i = 0; i < n; i++) {
        int c = 1;
        for (const char *p = eps[i]; *p; p++) c += *p == '|';
        if (i == 0) reps = c;
        else if (c != reps) reps = -1;
    }
    return reps;
}

/* The process's role and rank: KVPS_ROLE and the launcher's rank (KVPS_RANK, MPI's, Slurm's);
   without KVPS_ROLE (mpirun/srun) the first n x reps ranks serve. KVPS_OK, or KVPS_ERR_ENV logged. */
static kvps_result kvps__env_role(kvps_env *env, int reps) {
    static const char *rank_vars[] = {"KVPS_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    int rank = -1, got = 0;
    const char *role = getenv("KVPS_ROLE");
    for (int i = 0; i < 4 && !got; i++) {
        got = kvps__env_int(rank_vars[i], &rank);
        if (got < 0) {
            kvps__log(KVPS_LOG_ERROR, "%s is not a non-negative integer", rank_vars[i]);
            return KVPS_ERR_ENV;
        }
    }
    if (!got) {
        kvps__log(KVPS_LOG_ERROR, "no rank: set KVPS_RANK (or run under mpirun/srun)");
        return KVPS_ERR_ENV;
    }
    if (role && strcmp(role, "server") == 0) {
        env->role = KVPS_ROLE_SERVER;
    } else if (role && strcmp(role, "worker") == 0) {
        env->role = KVPS_ROLE_WORKER;
    } else if (role && *role) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_ROLE must be 'server' or 'worker', not '%s'", role);
        return KVPS_ERR_ENV;
    } else if (rank < env->num_servers * reps) { /* mpirun/srun: the first n x r ranks serve */
        env->role = KVPS_ROLE_SERVER;
        env->replica = rank / env->num_servers;
        rank %= env->num_servers;
    } else {
        env->role = KVPS_ROLE_WORKER;
        rank -= env->num_servers * reps;
    }
    env->rank = rank;
    if (env->role == KVPS_ROLE_SERVER && role && *role && kvps__env_int("KVPS_REPLICA", &env->replica) < 0) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_REPLICA is not a non-negative integer");
        return KVPS_ERR_ENV;
    }
    return KVPS_OK;
}

/* A server's own endpoint and its shard's chain, from its entry of KVPS_SERVERS (eps). */
static kvps_result kvps__env_chain(kvps_env *env, char **eps) {
    int rank = env->rank, rep_flag = 0;
    if (kvps__env_int("KVPS_REPLACEMENT", &rep_flag) == 1) env->replacement = rep_flag != 0;
    if (rank >= env->num_servers) {
        kvps__log(KVPS_LOG_ERROR, "server rank %d but KVPS_SERVERS lists %d", rank, env->num_servers);
        return KVPS_ERR_ENV;
    }
    char **chain = NULL;
    int nchain = kvps__split_by(eps[rank], '|', &chain);
    kvps_result r = KVPS_OK;
    if (nchain < 1 || env->replica >= nchain || strlen(eps[rank]) >= sizeof env->replicas ||
        strlen(chain[env->replica]) >= sizeof env->endpoint) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_SERVERS entry %d ('%s') is malformed, too long, or has no replica %d", rank,
                  eps[rank], env->replica);
        r = KVPS_ERR_ENV;
    } else {
        snprintf(env->endpoint, sizeof env->endpoint, "%s", chain[env->replica]);
        snprintf(env->replicas, sizeof env->replicas, "%s", eps[rank]);
    }
    kvps__free_strv(chain, nchain);
    return r;
}

/* A job formed at a rendezvous (kvps_launch.h): KVPS_NUM_SERVERS and the launcher's rank and
   size; the first num_servers ranks serve, each on a port of the chosen card, the rest work.
   env->servers points at the table's servers, kept until the next kvps_env_read. */
static char *kvps__env_servers;
static pthread_mutex_t kvps__env_mu = PTHREAD_MUTEX_INITIALIZER;
static kvps_result kvps__env_meet(kvps_env *env, const kvps_launch *l) {
    int ns = 0;
    const char *role = getenv("KVPS_ROLE");
    if (kvps__env_int("KVPS_NUM_SERVERS", &ns) != 1 || ns < 1 || ns >= l->size) {
        kvps__log(KVPS_LOG_ERROR, "ps env: a rendezvous at %s (%s) with %d ranks needs KVPS_NUM_SERVERS, 1 to %d (the first "
                  "ranks serve, the rest work); it is %s%.40s%s", l->rendezvous, l->rendezvous_var, l->size, l->size - 1,
                  getenv("KVPS_NUM_SERVERS") ? "'" : "not set", getenv("KVPS_NUM_SERVERS") ? getenv("KVPS_NUM_SERVERS") : "",
                  getenv("KVPS_NUM_SERVERS") ? "'" : "");
        return KVPS_ERR_ENV;
    }
    int serves = l->rank < ns;
    if (role && *role && strcmp(role, serves ? "server" : "worker") != 0) {
        kvps__log(KVPS_LOG_ERROR, "ps env: KVPS_ROLE is '%s' but rank %d (%s) of a rendezvous job with KVPS_NUM_SERVERS=%d is a %s: "
                  "the first ranks serve", role, l->rank, l->rank_var, ns, serves ? "server" : "worker");
        return KVPS_ERR_ENV;
    }
    char shape[32], ip[64];
    snprintf(shape, sizeof shape, "ps %d", ns);
    kvps_result rc = KVPS_OK;
    if (serves) {
        rc = kvps__launch_bind_ip(l, ip, sizeof ip);
        if (rc == KVPS_OK) rc = kvps__reserve_port(ip, "server", env->endpoint, sizeof env->endpoint);
    }
    char **table = NULL;
    if (rc == KVPS_OK) rc = kvps__launch_meet(l, shape, env->endpoint, &table);
    char *all = NULL;
    if (rc == KVPS_OK) {
        size_t len = 1;
        for (int i = 0; i < ns; i++) len += strlen(table[i]) + 1;
        all = (char *)malloc(len);
        for (int i = 0; all && i < ns; i++) {
            if (!table[i][0]) { free(all); all = NULL; break; }
            snprintf(all + (i ? strlen(all) : 0), len - (i ? strlen(all) : 0), "%s%s", i ? "," : "", table[i]);
        }
        if (!all) rc = kvps__launch_fail(KVPS_ERR_MALFORMED, "the rendezvous at %s gave a server no endpoint (or no memory)",
                                         l->rendezvous);
        kvps__free_strv(table, l->size);
    }
    if (rc != KVPS_OK) {
        kvps__log(KVPS_LOG_ERROR, "ps env: %s", kvps_launch_last_error());
        return rc;
    }
    pthread_mutex_lock(&kvps__env_mu);
    free(kvps__env_servers);
    kvps__env_servers = all;
    pthread_mutex_unlock(&kvps__env_mu);
    env->servers = all;
    env->num_servers = ns;
    env->num_workers = l->size - ns;
    env->role = serves ? KVPS_ROLE_SERVER : KVPS_ROLE_WORKER;
    env->rank = serves ? l->rank : l->rank - ns;
    if (serves) snprintf(env->replicas, sizeof env->replicas, "%s", env->endpoint);
    return KVPS_OK;
}

KVPS_API kvps_result kvps_env_read(kvps_env *env) {
    if (!env) return KVPS_ERR_INVALID_ARG;
    memset(env, 0, sizeof *env);
    env->servers = getenv("KVPS_SERVERS");
    if (!env->servers || !*env->servers) {
        kvps_launch l;
        if (kvps_launch_read(&l) == KVPS_OK && l.rendezvous[0]) return kvps__env_meet(env, &l);
        kvps__log(KVPS_LOG_ERROR, "ps env: KVPS_SERVERS is not set (comma-separated server endpoints), and no rendezvous "
                  "address with the launcher's rank and size is (MASTER_ADDR and MASTER_PORT, or KVPS_RENDEZVOUS=host:port, "
                  "with KVPS_NUM_SERVERS)%s%s", l.rendezvous[0] || !kvps_launch_last_error()[0] ? "" : ": ",
                  l.rendezvous[0] ? "" : kvps_launch_last_error());
        return KVPS_ERR_ENV;
    }
    char **eps = NULL;
    env->num_servers = kvps__split(env->servers, &eps);
    if (env->num_servers < 1) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_SERVERS is malformed: '%s'", env->servers);
        return KVPS_ERR_ENV;
    }
    kvps_result r = KVPS_OK;
    int reps = kvps__env_reps(eps, env->num_servers);
    if (reps < 1) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_SERVERS: every shard must list the same number of replicas ('|'): '%s'", env->servers);
        r = KVPS_ERR_ENV;
    } else if (kvps__env_int("KVPS_NUM_WORKERS", &env->num_workers) != 1 || env->num_workers < 1) {
        kvps__log(KVPS_LOG_ERROR, "KVPS_NUM_WORKERS is missing or not a positive integer");
        r = KVPS_ERR_ENV;
    }
    if (r == KVPS_OK) r = kvps__env_role(env, reps);
    if (r == KVPS_OK && env->role == KVPS_ROLE_SERVER) r = kvps__env_chain(env, eps);
    else if (r == KVPS_OK && env->rank >= env->num_workers) {
        kvps__log(KVPS_LOG_ERROR, "worker rank %d but KVPS_NUM_WORKERS=%d", env->rank, env->num_workers);
        r = KVPS_ERR_ENV;
    }
    kvps__free_strv(eps, env->num_servers);
    return r;
}
/* The events of servers and workers (>>timeline-events, at the end: they need the server's and
   the worker's types); the hooks that call them are one line each where things happen. */
struct kvps__key;
struct kvps__req;
static void kvps__tl_arrive(kvps_server *s, struct kvps__key *k, uint64_t c);
static void kvps__tl_round(kvps_server *s, struct kvps__key *k, int count);
static void kvps__tl_async(kvps_server *s, struct kvps__key *k, uint64_t n);
static void kvps__tl_server_end(kvps_server *s);
static void kvps__tl_post(struct kvps__req *q, int op, uint64_t bytes, uint64_t n);
static void kvps__tl_req_end(kvps_worker *w, struct kvps__req *q);
static uint64_t kvps__tl_floats(const size_t *lens, size_t n);

// >>wire
/* THE OPS, one row each, in op-number order: the number on the wire, the name, the handler, then
   what the op is, as kvps__op_spec's fields by name, in their order (a field left out is 0; see
   kvps__op_spec in >>dispatch).
   The enum KVPS__OP_*, kvps__ops (the dispatch table) and the names in messages all come from
   here; a new op is a row here plus its handler, and KVPS__PROTO moves on (a peer of another
   release is refused at the hello). The manual's WIRE FORMAT lists them (test_api checks it). */
#define KVPS__OPS(X)                                                                                                   \
    X(PUSH, 1, "push", kvps__serve_keys, .values = 1, .coded = 1, .mutates = 1, .kept = 1, .chain = KVPS__CHAIN_ROUNDS, .placed = 1, \
      .dup = KVPS__DUP_UNLESS_PENDING)                                                                                 \
    X(PULL, 2, "pull", kvps__serve_keys, .pulls = 1, .chain = KVPS__CHAIN_LOCAL, .placed = 1)                          \
    X(PUSHPULL, 3, "pushpull", kvps__serve_keys, .values = 1, .coded = 1, .pulls = 1, .mutates = 1, .kept = 1,         \
      .chain = KVPS__CHAIN_ROUNDS, .placed = 1, .dup = KVPS__DUP_AS_PULL)                                              \
    X(INIT, 4, "init", kvps__serve_keys, .values = 1, .coded = 1, .mutates = 1, .kept = 1, .placed = 1)                \
    X(BARRIER, 5, "barrier", kvps__serve_barrier, .mutates = 1, .kept = 1, .dup = KVPS__DUP_UNLESS_OPEN)               \
    X(CONFIG, 6, "config", kvps__serve_keys, .values = 1, .mutates = 1, .kept = 1, .placed = 1)                        \
    X(PUSH_ROWS, 7, "push_rows", kvps__serve_table, .values = 1, .mutates = 1, .kept = 1, .placed = 1)                 \
    X(PULL_ROWS, 8, "pull_rows", kvps__serve_table, .chain = KVPS__CHAIN_LOCAL, .placed = 1)                           \
    X(TABLE, 9, "table", kvps__serve_table, .values = 1, .mutates = 1, .kept = 1, .placed = 1)                         \
    /* a worker's first message: what must agree (kvps__hello); served before it counts as alive */                    \
    X(HELLO, 10, "hello", kvps__serve_hello, .values = 1, .hello = 1)                                                  \
    X(BYE, 11, "bye", kvps__serve_bye, .unordered = 1) /* the worker has finished */                                   \
    /* what is request req_id waiting for? answered with text */                                                       \
    X(STATUS, 12, "status", kvps__serve_status, .chain = KVPS__CHAIN_LOCAL, .unordered = 1)                            \
    X(NAME, 13, "name", kvps__serve_name, .values = 1) /* a tensor's name and layout (kvps__name_rec) */               \
    /* primary -> backup replica (REPLICAS; its header is a kvps__rhdr); never a worker's request */                   \
    X(REPL, 14, "repl", kvps__serve_not_request, .chain = KVPS__CHAIN_LOCAL)                                           \
    /* RESHARD: which keys does this server hold? (answered: n x {u64 key, u64 len}) */                                \
    X(KEYS, 15, "keys", kvps__serve_move, .placed = 1)                                                                 \
    /* RESHARD: values = n x u64 key; answered with their key records */                                               \
    X(EXPORT, 16, "export", kvps__serve_move, .values = 1, .placed = 1)                                                \
    /* RESHARD: values = key records, taken in (new keys only) */                                                      \
    X(IMPORT, 17, "import", kvps__serve_move, .values = 1, .mutates = 1, .placed = 1)                                  \
    /* RESHARD: values = n x u64 key, forgotten (moved elsewhere) */                                                   \
    X(DROP, 18, "drop", kvps__serve_move, .values = 1, .mutates = 1, .placed = 1)                                      \
    /* RESHARD: values = the new placement (kvps__place), recorded */                                                  \
    X(PLACE, 19, "place", kvps__serve_move, .values = 1, .mutates = 1, .placed = 1)                                    \
    /* RESHARD: values = u32 V, u32 virtual shards[]; answered with the record of every table                          \
       (kvps__table_put), only the rows in those shards */                                                             \
    X(EXPORT_ROWS, 20, "export_rows", kvps__serve_move, .values = 1, .placed = 1)                                      \
    /* RESHARD: values = table records; tables made or found the same, rows taken in (new ids only) */                 \
    X(IMPORT_ROWS, 21, "import_rows", kvps__serve_move, .values = 1, .mutates = 1, .placed = 1)                        \
    /* RESHARD: values as EXPORT_ROWS: the rows in those shards forgotten */                                           \
    X(DROP_ROWS, 22, "drop_rows", kvps__serve_move, .values = 1, .mutates = 1, .placed = 1)                            \
    /* RESHARD: answered with the server's placement (kvps__place_enc) */                                              \
    X(PLACE_GET, 23, "place_get", kvps__serve_move, .placed = 1)                                                       \
    /* REPLICAS under BSP: a pushpull's pull from another replica (values: u64 the push's sequence, checked in         \
       kvps__serve_read); served by a backup as it is */                                                               \
    X(READ, 24, "read", kvps__serve_read, .pulls = 1, .chain = KVPS__CHAIN_LOCAL, .backup = 1, .placed = 1)            \
    /* the worker's data has ended (kvps_worker_join): rounds and barriers go on without it */                         \
    X(JOIN, 25, "join", kvps__serve_join, .mutates = 1, .kept = 1)                                                     \
    /* a scalar all-reduce among the workers, a round like a barrier's (server 0 only): values = f64 x, u32 op,        \
       u32 0; answered with the f64 result */                                                                          \
    X(ALLREDUCE, 26, "allreduce", kvps__serve_barrier, .values = 1, .mutates = 1, .kept = 1, .dup = KVPS__DUP_UNLESS_OPEN)

enum {
#define KVPS__OP_ENUM(op, num, name, ...) KVPS__OP_##op = num,
    KVPS__OPS(KVPS__OP_ENUM)
#undef KVPS__OP_ENUM
};
/* The rows are in order with no gap (1, 2, 3, ...), so a row's place is its number (checked per
   row) and KVPS__OP_COUNT is one more than the last. */
enum {
    KVPS__OPIX_NONE_,
#define KVPS__OP_IX(op, num, name, ...) KVPS__OPIX_##op,
    KVPS__OPS(KVPS__OP_IX)
#undef KVPS__OP_IX
    KVPS__OP_COUNT
};
#define KVPS__OP_PLACE_CHECK(op, num, name, ...) typedef char kvps__op_place_##op[KVPS__OPIX_##op == num ? 1 : -1];
KVPS__OPS(KVPS__OP_PLACE_CHECK)
#undef KVPS__OP_PLACE_CHECK
enum {
    KVPS__MAGIC = 0x5350564Bu,
    KVPS__VERSION = 1,
    KVPS__PROTO = 9,      /* the protocol release a HELLO names: both sides must speak the same (6: READ;
                             7: the job token in HELLO, REPL hellos; 8: replies carry the server's checkpoint
                             stamp in aux, HELLO says whether it is sent again after a reconnect; 9: CONFIG
                             records carry weight_decay, JOIN, ALLREDUCE) */
    KVPS__HELLO_BYTES = 64,
    KVPS__NAME_REC = 24,  /* u64 base key, u64 len, u32 slices, u32 name bytes; then the name */
    KVPS__NAME_MAX = 255,
    KVPS__OPTREC = 28, /* CONFIG record: u32 rule + 6 x f32 */
    KVPS__TREC = KVPS__OPTREC + 12, /* TABLE record: CONFIG record + f32 init_scale, u64 seed */
    KVPS__OP_REPLY = 0x80,
    KVPS__FLAG_CODED = 1,       /* values frame: per key [u32 bytes][codec blob] */
    KVPS__FLAG_CODED_REPLY = 2, /* pull: answer coded with codec id aux */
    KVPS__HDR = 32,
    KVPS__ZC_REPLY_MIN = 32768, /* bytes: smaller pull replies are copied */
    KVPS__KENT = 16
};

typedef struct kvps__hdr {
    uint32_t magic;
    uint8_t version, op;
    uint16_t flags;
    uint32_t rank, nkeys;
    uint64_t req_id;
    int32_t status;
    uint32_t aux;
} kvps__hdr;

/* A worker out of the aggregation (kvps_server's out[]; a byte in checkpoints): left (.elastic, lost
   or finished), or joined (kvps_worker_join), for good. */
enum { KVPS__OUT_LEFT = 1, KVPS__OUT_JOINED = 2 };

typedef struct kvps__kent {
    uint64_t key, len;
} kvps__kent;

typedef char kvps__hdr_size_check[sizeof(kvps__hdr) == KVPS__HDR ? 1 : -1];
typedef char kvps__kent_size_check[sizeof(kvps__kent) == KVPS__KENT ? 1 : -1];
/* A REPL message's header (REPLICAS): kvps__hdr's bytes, named for what they carry there: the
   kind of message in rank's place, the sender's epoch in nkeys', its sequence number in
   req_id's, its place in the chain in aux's (kvps__rhdr_of, kvps__repl_hdr). */
typedef struct kvps__rhdr {
    uint32_t magic;
    uint8_t version, op;
    uint16_t flags;
    uint32_t kind, epoch;
    uint64_t seq;
    int32_t status;
    uint32_t place;
} kvps__rhdr;
typedef char kvps__rhdr_check[sizeof(kvps__rhdr) == sizeof(kvps__hdr) && offsetof(kvps__rhdr, kind) == offsetof(kvps__hdr, rank) &&
                              offsetof(kvps__rhdr, epoch) == offsetof(kvps__hdr, nkeys) &&
                              offsetof(kvps__rhdr, seq) == offsetof(kvps__hdr, req_id) &&
                              offsetof(kvps__rhdr, place) == offsetof(kvps__hdr, aux) ? 1 : -1];
static kvps__rhdr kvps__rhdr_of(const kvps__hdr *h) {
    kvps__rhdr r;
    memcpy(&r, h, sizeof r);
    return r;
}

/* A coded values frame: per key [u32 bytes][codec blob], walked in key order. */
typedef struct kvps__blobs {
    const unsigned char *p;
    size_t size, off;
} kvps__blobs;
static kvps__blobs kvps__blobs_of(zmq_msg_t *m) {
    kvps__blobs it;
    it.p = (const unsigned char *)zmq_msg_data(m);
    it.size = zmq_msg_size(m);
    it.off = 0;
    return it;
}
/* The next blob: 1 with *blob and *bytes; 0 when it runs past the frame (*bytes: its length);
   -1 when not even its length is there. */
static int kvps__blob_next(kvps__blobs *it, const unsigned char **blob, uint32_t *bytes) {
    *blob = NULL;
    *bytes = 0;
    if (it->size - it->off < 4) return -1;
    *bytes = kvps_el_get32(it->p + it->off);
    if (it->size - it->off - 4 < *bytes) return 0;
    *blob = it->p + it->off + 4;
    it->off += 4 + (size_t)*bytes;
    return 1;
}



/* A reply's text frame (fr[1], absent: "") as a string of at most cap - 1 bytes. */
static void kvps__frame_text(zmq_msg_t *fr, int nfr, char *buf, size_t cap) {
    size_t n = nfr > 1 ? zmq_msg_size(&fr[1]) : 0;
    if (n > cap - 1) n = cap - 1;
    if (n) memcpy(buf, zmq_msg_data(&fr[1]), n);
    buf[n] = 0;
}

/* The job token's digest (JOB TOKEN): kvps__token_digest, in kvps_launch.h (the rendezvous sends it too). */

/* With no desc.timeout_ms (TIMEOUTS), the bound of a worker's short exchanges, which wait on no
   slow peer: a goodbye's acknowledgements (kvps_worker_finish(-1), destroy) and the first hello's
   answer; and how long a wait waits for a server that never connected (it may start late). */
enum { KVPS__SHORT_MS = 10000, KVPS__CONNECT_MS = 30000 };

/* A random 32-bit number, never 0 (incarnations). */
static uint32_t kvps__random32(void) {
    uint32_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
        close(fd);
    }
    if (!r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (uint32_t)kvps__mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_sec);
    }
    return r ? r : 1u;
}

/* A PLACEMENT: how keys were placed on servers (RESHARD): V virtual shards (256 x the first
   server count), every server count the job went through, first to last, and what each change
   moved: m[i] (virtual shard, new server) pairs for change i (from n[i-1] to n[i] servers), in
   mv after those of the changes before it. m[i] = 0: the change followed kvps__vmap_change's
   rule by counts (placements written before changes were planned by bytes). One count is a
   job that never resharded (v mod n). Checkpoints record it, HELLO answers carry it, PLACE sets
   it, PLACE_GET reads it; on the wire: u32 V, u32 count, u32 n[count], u32 m[count], then
   u32 pairs[2 x the sum of m]. mv is owned (kvps__place_free, kvps__place_copy). */
enum { KVPS__PLACE_MAX = 64, KVPS__PLACE_SERVERS_MAX = 65536 };
typedef struct kvps__place {
    uint32_t V, count, n[KVPS__PLACE_MAX], m[KVPS__PLACE_MAX];
    uint64_t nmv;  /* pairs in mv: the sum of m */
    uint32_t *mv;  /* (shard, server) pairs */
} kvps__place;

static void kvps__place_free(kvps__place *p) {
    free(p->mv);
    p->mv = NULL;
    p->nmv = 0;
}

/* dst = src (dst's moves freed first); 0, or -1 out of memory (dst then unchanged). */
static int kvps__place_copy(kvps__place *dst, const kvps__place *src) {
    uint32_t *mv = NULL;
    if (src->nmv && !(mv = (uint32_t *)malloc(src->nmv * 8))) return -1;
    if (src->nmv) memcpy(mv, src->mv, src->nmv * 8);
    free(dst->mv);
    *dst = *src;
    dst->mv = mv;
    return 0;
}

static size_t kvps__place_size(const kvps__place *p) { return 8 + 8 * (size_t)p->count + 8 * (size_t)p->nmv; }

static size_t kvps__place_enc(const kvps__place *p, unsigned char *out) {
    kvps__put32(out, p->V);
    kvps__put32(out + 4, p->count);
    for (uint32_t i = 0; i < p->count; i++) kvps__put32(out + 8 + 4 * (size_t)i, p->n[i]);
    for (uint32_t i = 0; i < p->count; i++) kvps__put32(out + 8 + 4 * (size_t)(p->count + i), p->m[i]);
    if (p->nmv) memcpy(out + 8 + 8 * (size_t)p->count, p->mv, p->nmv * 8);
    return kvps__place_size(p);
}

/* Decodes and checks one into *p, which is overwritten (free what it held first); on a refusal
   it holds nothing to free: NULL, or what is wrong with it. The moves are checked against the
   counts: every server they name exists after its change. */
static const char *kvps__place_dec(kvps__place *p, const unsigned char *v, size_t nb) {
    uint32_t w[2];
    memset(p, 0, sizeof *p);
    if (nb < 8) return "shorter than its 8-byte head";
    memcpy(w, v, 8);
    if (w[1] < 1 || w[1] > KVPS__PLACE_MAX) return "a count of server counts out of range (1..64)";
    if (nb < 8 + 8 * (size_t)w[1]) return "shorter than its counts";
    p->V = w[0];
    p->count = w[1];
    memcpy(p->n, v + 8, 4 * (size_t)w[1]);
    memcpy(p->m, v + 8 + 4 * (size_t)w[1], 4 * (size_t)w[1]);
    for (uint32_t i = 0; i < p->count; i++) {
        if (p->n[i] < 1 || p->n[i] > KVPS__PLACE_SERVERS_MAX) return "a server count out of range";
        p->nmv += p->m[i];
    }
    if ((uint64_t)p->V != 256ull * p->n[0]) return "V is not 256 x its first server count";
    if (p->m[0] != 0) return "moves before the first change";
    /* what replaying it takes (kvps__vmap_of): a change by counts about V x (the servers it adds
       or removes + a sort's 16), a shrink by moves V (its check), a grow by moves only its moves;
       a placement from real reshards takes far fewer than 2^27 steps, a forged one must not take
       minutes */
    uint64_t cost = 0;
    for (uint32_t i = 1; i < p->count; i++) {
        uint32_t dn = p->n[i] > p->n[i - 1] ? p->n[i] - p->n[i - 1] : p->n[i - 1] - p->n[i];
        cost += (uint64_t)p->V * (p->m[i] ? p->n[i] < p->n[i - 1] : dn + 16u);
    }
    if (cost > (1ull << 27)) { p->nmv = 0; return "too large to replay (over 2^27 steps)"; }
    if ((nb - 8 - 8 * (size_t)w[1]) / 8 != p->nmv || (nb - 8 - 8 * (size_t)w[1]) % 8)
        return "its length does not match its moves";
    const unsigned char *mv = v + 8 + 8 * (size_t)w[1];
    for (uint32_t i = 1, at = 0; i < p->count; i++)
        for (uint32_t j = 0; j < p->m[i]; j++, at++) {
            uint32_t pair[2];
            memcpy(pair, mv + 8 * (size_t)at, 8);
            if (pair[0] >= p->V || pair[1] >= p->n[i]) {
                p->nmv = 0;
                return "a move of a shard out of range, or to a server past its change's count";
            }
        }
    if (p->nmv && !(p->mv = (uint32_t *)malloc(p->nmv * 8))) { p->nmv = 0; return "out of memory for its moves"; }
    if (p->nmv) memcpy(p->mv, mv, p->nmv * 8);
    return NULL;
}

/* 0 for a placement that never changed (the server list says it all), else FNV-1a of its
   encoding, never 0. */
static uint64_t kvps__place_hash(const kvps__place *p) {
    if (p->count < 2) return 0;
    uint64_t h = KVPS__FNV_BASIS;
    uint32_t head[2] = {p->V, p->count};
    const unsigned char *parts[4] = {(const unsigned char *)head, (const unsigned char *)p->n, (const unsigned char *)p->m,
                                     (const unsigned char *)p->mv};
    size_t sizes[4] = {8, 4 * (size_t)p->count, 4 * (size_t)p->count, 8 * (size_t)p->nmv};
    for (int k = 0; k < 4; k++) h = kvps__fnv(h, parts[k], sizes[k]);
    return h ? h : 1;
}

/* "2 > 3 > 2 servers" (at most cap bytes, cut short with "..."). */
static const char *kvps__place_text(const kvps__place *p, char *buf, size_t cap) {
    size_t at = 0;
    uint32_t i = 0;
    buf[0] = 0;
    for (; i < p->count && at + 24 < cap; i++) at += (size_t)snprintf(buf + at, cap - at, "%s%u", i ? " > " : "", p->n[i]);
    snprintf(buf + at, cap - at, "%s servers", i < p->count ? " ..." : "");
    return buf;
}

/* Placements recorded before reshards were planned by bytes (m[i] = 0) changed by counts: a grow
   gave each new server V / n' shards from the servers with the most shards, a shrink dealt the
   leaving servers' shards to those with the fewest. */
/* The order in which a grow takes virtual shards: by mix64(v), highest first (ties: by v). */
static int kvps__vshard_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint64_t hx = kvps__mix64(x), hy = kvps__mix64(y);
    return hx != hy ? (hx < hy) - (hx > hy) : (x > y) - (x < y);
}

static int kvps__vmap_change(uint32_t *vmap, uint32_t V, int n, int n2) {
    int top = n > n2 ? n : n2;
    uint64_t *cnt = (uint64_t *)calloc((size_t)top, sizeof *cnt);
    if (!cnt) return -1;
    for (uint32_t v = 0; v < V; v++) cnt[vmap[v]]++;
    if (n2 > n) { /* each new server takes V / n2 shards from the fullest servers, in a fixed
                     pseudo-random order of shards (mix64), so that they come from all over the
                     range and carry about their share of bytes, not a run of one tensor's slices */
        uint32_t *perm = (uint32_t *)malloc((size_t)V * sizeof *perm);
        uint32_t *curs = (uint32_t *)calloc((size_t)top, sizeof *curs);
        if (!perm || !curs) { free(perm); free(curs); free(cnt); return -1; }
        for (uint32_t v = 0; v < V; v++) perm[v] = v;
        qsort(perm, V, sizeof *perm, kvps__vshard_cmp);
        for (int j = n; j < n2; j++)
            while (cnt[j] < V / (uint32_t)n2) {
                int from = 0;
                for (int i = 1; i < n2; i++)
                    if (cnt[i] > cnt[from]) from = i;
                while (curs[from] < V && vmap[perm[curs[from]]] != (uint32_t)from) curs[from]++;
                if (curs[from] == V) break;
                vmap[perm[curs[from]]] = (uint32_t)j;
                cnt[from]--;
                cnt[j]++;
            }
        free(perm);
        free(curs);
    } else { /* the leaving servers' shards, in order, each to the emptiest server left */
        for (uint32_t v = 0; v < V; v++) {
            if (vmap[v] < (uint32_t)n2) continue;
            int to = 0;
            for (int i = 1; i < n2; i++)
                if (cnt[i] < cnt[to]) to = i;
            cnt[vmap[v]]--;
            vmap[v] = (uint32_t)to;
            cnt[to]++;
        }
    }
    free(cnt);
    return 0;
}

/* vmap for placement p, replayed from v mod n through each of its changes (moves, or the rule
   by counts); NULL with *why set when out of memory, or when p is not a placement (a change
   leaves a shard on a server past its count). */
static uint32_t *kvps__vmap_of(const kvps__place *p, const char **why) {
    uint32_t *vm = (uint32_t *)malloc((size_t)p->V * sizeof *vm + 1);
    *why = "out of memory";
    if (!vm) return NULL;
    for (uint32_t v = 0; v < p->V; v++) vm[v] = v % p->n[0];
    const uint32_t *mv = p->mv;
    for (uint32_t i = 1; i < p->count; i++) {
        if (p->m[i] == 0 && kvps__vmap_change(vm, p->V, (int)p->n[i - 1], (int)p->n[i]) != 0) { free(vm); return NULL; }
        for (uint32_t j = 0; j < p->m[i]; j++, mv += 2) vm[mv[0]] = mv[1];
        for (uint32_t v = 0; p->n[i] < p->n[i - 1] && v < p->V; v++) /* (a grow cannot leave one past n[i]) */
            if (vm[v] >= p->n[i]) {
                *why = "a change leaves a virtual shard on a server past its count";
                free(vm);
                return NULL;
            }
    }
    *why = NULL;
    return vm;
}

/* A reshard planned by bytes (what kvps_worker_reshard does): vmap, V virtual shards over n
   servers, becomes a map over n2, where bytes[v] is what shard v holds now. A grow fills each
   new server in turn: first with shards, the smallest of the server with the most, until it
   has V / n2 of them (keys made later fall evenly) or the next would pass the mean; then from
   the fullest old server above the mean that has one, the largest shard that still fits under
   the mean, until none fits. A
   shrink deals the leaving servers' shards, largest first, each to the server left with the
   fewest bytes (an empty shard: the fewest shards). Then, either way, while the fullest server
   holds over 1.08 x the mean, its smallest shard goes to the emptiest server, when that lowers
   the fullest (a shrink's largest leaving shards can otherwise land above 1.1 x the mean).
   Ties go to the lowest index, shards of equal
   bytes in a fixed pseudo-random order (mix64). Each shard that changes server is appended to
   *mv as a (shard, server) pair (*nmv counts them). 0, or -1 out of memory. */
typedef struct kvps__pshard { uint64_t b; uint32_t v; } kvps__pshard;
static int kvps__pshard_cmp(const void *a, const void *b) { /* bytes, highest first */
    const kvps__pshard *x = (const kvps__pshard *)a, *y = (const kvps__pshard *)b;
    if (x->b != y->b) return x->b < y->b ? 1 : -1;
    uint64_t hx = kvps__mix64(x->v), hy = kvps__mix64(y->v);
    if (hx != hy) return hx < hy ? 1 : -1;
    return (x->v > y->v) - (x->v < y->v);
}

static int kvps__vmap_plan(uint32_t *vmap, uint32_t V, int n, int n2, const uint64_t *bytes, uint32_t **mv, uint64_t *nmv) {
    int top = n > n2 ? n : n2, rc = -1;
    uint64_t *load = (uint64_t *)calloc((size_t)top, sizeof *load), *cnt = (uint64_t *)calloc((size_t)top, sizeof *cnt);
    uint32_t *start = (uint32_t *)calloc((size_t)top + 1, sizeof *start), *cur = (uint32_t *)calloc((size_t)top + 1, sizeof *cur);
    kvps__pshard *ps = (kvps__pshard *)malloc((size_t)V * sizeof *ps + 1);
    uint8_t *gone = (uint8_t *)calloc((size_t)V + 1, 1), *ex = (uint8_t *)calloc((size_t)top, 1);
    uint32_t *out = (uint32_t *)realloc(*mv, (*nmv + 2 * (uint64_t)V) * 8 + 8); /* every shard moves at most twice */
    if (out) *mv = out;
    if (load && cnt && start && cur && ps && gone && ex && out) {
        uint64_t total = 0;
        for (uint32_t v = 0; v < V; v++) {
            load[vmap[v]] += bytes[v];
            cnt[vmap[v]]++;
            total += bytes[v];
            start[vmap[v] + 1]++;
        }
        for (int i = 0; i < top; i++) start[i + 1] += start[i];
        memcpy(cur, start, ((size_t)top + 1) * sizeof *cur);
        for (uint32_t v = 0; v < V; v++) ps[cur[vmap[v]]++] = (kvps__pshard){bytes[v], v};
        for (int i = 0; i < top; i++) qsort(ps + start[i], start[i + 1] - start[i], sizeof *ps, kvps__pshard_cmp);
#define KVPS__MOVE(v_, to_)                                                                            \
        do {                                                                                                 \
            uint32_t mv_v = (v_), mv_to = (uint32_t)(to_);                                                   \
            load[vmap[mv_v]] -= bytes[mv_v]; cnt[vmap[mv_v]]--;                                              \
            load[mv_to] += bytes[mv_v]; cnt[mv_to]++;                                                        \
            vmap[mv_v] = mv_to; gone[mv_v] = 1;                                                              \
            out[2 * *nmv] = mv_v; out[2 * *nmv + 1] = mv_to; (*nmv)++;                                      \
        } while (0)
        if (n2 > n) {
            uint64_t T = total / (uint64_t)n2; /* the mean */
            for (int j = n; j < n2; j++) {
                memset(ex, 0, (size_t)top);
                while (cnt[j] < V / (uint32_t)n2) { /* shard count: the smallest shards that fit under the mean */
                    int d = -1;
                    for (int i = 0; i < n2; i++)
                        if (i != j && !ex[i] && (d < 0 || cnt[i] > cnt[d])) d = i;
                    if (d < 0 || cnt[d] <= cnt[j] + 1) break;
                    uint32_t at = start[d + 1]; /* (a new server's group is empty: it gives nothing) */
                    while (at > start[d] && gone[ps[at - 1].v]) at--;
                    if (at == start[d] || load[j] + ps[at - 1].b > T) { ex[d] = 1; continue; }
                    KVPS__MOVE(ps[at - 1].v, j);
                }
                memset(ex, 0, (size_t)top);
                while (load[j] < T) { /* bytes */
                    int d = -1;
                    for (int i = 0; i < n; i++)
                        if (!ex[i] && load[i] > T && (d < 0 || load[i] > load[d])) d = i;
                    if (d < 0) break;
                    uint64_t gap = T - load[j];
                    uint32_t lo = start[d], hi = start[d + 1];
                    while (lo < hi) { /* the first shard of d with at most gap bytes (sorted highest first) */
                        uint32_t mid = lo + (hi - lo) / 2;
                        if (ps[mid].b > gap) lo = mid + 1;
                        else hi = mid;
                    }
                    while (lo < start[d + 1] && gone[ps[lo].v]) lo++;
                    if (lo == start[d + 1] || ps[lo].b == 0) { ex[d] = 1; continue; }
                    KVPS__MOVE(ps[lo].v, j);
                }
            }
        } else {
            uint32_t nl = 0; /* the leaving servers' shards, gathered at the front of ps */
            for (int i = n2; i < n; i++)
                for (uint32_t k = start[i]; k < start[i + 1]; k++) ps[nl++] = ps[k];
            qsort(ps, nl, sizeof *ps, kvps__pshard_cmp);
            for (uint32_t k = 0; k < nl; k++) {
                int to = 0;
                for (int i = 1; i < n2; i++)
                    if (ps[k].b ? load[i] < load[to] : cnt[i] < cnt[to]) to = i;
                KVPS__MOVE(ps[k].v, to);
            }
        }
        /* then, while the fullest server holds over 1.08 x the mean, its smallest non-empty shard
           goes to the emptiest server when that lowers the fullest (a few more bytes move) */
        for (uint32_t it = 0; it < V; it++) {
            int d = 0, e = 0;
            for (int i = 1; i < n2; i++) {
                if (load[i] > load[d]) d = i;
                if (load[i] < load[e]) e = i;
            }
            if ((double)load[d] * n2 <= 1.08 * (double)total) break;
            uint32_t best = UINT32_MAX;
            for (uint32_t v = 0; v < V; v++)
                if (vmap[v] == (uint32_t)d && bytes[v] && (best == UINT32_MAX || bytes[v] < bytes[best])) best = v;
            if (best == UINT32_MAX || load[e] + bytes[best] >= load[d]) break;
            KVPS__MOVE(best, e);
        }
#undef KVPS__MOVE
        rc = 0;
    }
    free(load); free(cnt); free(start); free(cur); free(ps); free(gone); free(ex);
    return rc;
}

// >>rules
/* The update rules: their table, the CONFIG record's decoding, and their maths in float32. */
static int kvps__finite(float x) { return x == x && x - x == 0.0f; }

/* The first hyper-parameter of a resolved optim that is out of range, named with its range;
   NULL when all are in range. */
/* 1 when rule is a user rule's id (KVPS_RULE_USER + i), whether or not a server has rule i. */
static int kvps__rule_is_user(uint32_t rule) { return rule >= KVPS_RULE_USER && rule <= KVPS_RULE_USER_LAST; }

/* THE UPDATE RULES, one row each in kvps_rule order: name; optimizer-state floats per value (v,
   h; Adam's m and v); scalar state per key or row, starting at 1 (Adam's beta powers; at most
   2: kvps__key's b1t and b2t); whether async pushes of it may be deferred and applied together
   (a per-element formula with no per-call state); whether it uses weight_decay; whether it
   counts the key's steps (kvps__key's step; so not for sparse tables, whose rows have none).
   A new rule is a row here plus its case in kvps__rule_math. User rules (KVPS_RULE_USER + i)
   are the server's: their state is the rule's n_state, they decay and step, never defer. */
typedef struct kvps__rule_row {
    const char *name;
    uint8_t state, scalars, deferrable, decay, steps;
} kvps__rule_row;
static const kvps__rule_row kvps__rules[] = {
    {"default", 0, 0, 0, 0, 0},  {"mean", 0, 0, 1, 0, 0},       {"sum", 0, 0, 1, 0, 0},
    {"max", 0, 0, 1, 0, 0},      {"min", 0, 0, 1, 0, 0},        {"accumulate", 0, 0, 1, 0, 0},
    {"sgd", 0, 0, 1, 0, 0},      {"momentum", 1, 0, 1, 0, 0},   {"nesterov", 1, 0, 1, 0, 0},
    {"adagrad", 1, 0, 1, 0, 0},  {"adam", 2, 2, 0, 0, 0},       {"adamw", 2, 0, 0, 1, 1},
};
typedef char kvps__rules_check[sizeof kvps__rules / sizeof kvps__rules[0] == KVPS_RULE_COUNT ? 1 : -1];
static const kvps__rule_row kvps__user_rule_row = {"user", 0, 0, 0, 1, 1};
/* A rule's row (a user rule's state count is its server's: kvps__rule_nstate). */
static const kvps__rule_row *kvps__rule_row_of(uint32_t rule) {
    return rule < KVPS_RULE_COUNT ? &kvps__rules[rule] : &kvps__user_rule_row;
}

static const char *kvps__optim_bad_field(const kvps_optim *o) {
    return !kvps__finite(o->lr) || o->lr < 0                                  ? "lr (>= 0)"
           : !kvps__finite(o->momentum) || o->momentum < 0 || o->momentum >= 1 ? "momentum (in [0, 1))"
           : !kvps__finite(o->beta1) || o->beta1 < 0 || o->beta1 >= 1          ? "beta1 (in [0, 1))"
           : !kvps__finite(o->beta2) || o->beta2 < 0 || o->beta2 >= 1          ? "beta2 (in [0, 1))"
           : !kvps__finite(o->eps) || o->eps <= 0                              ? "eps (> 0, or 0: default)"
           : !kvps__finite(o->weight_decay) || o->weight_decay < 0             ? "weight_decay (>= 0)"
           : o->weight_decay != 0 && !kvps__rule_row_of(o->rule)->decay        ? "weight_decay (0: only ADAMW and user rules use it)"
                                                                               : NULL;
}

/* A CONFIG record: u32 rule, f32 lr momentum beta1 beta2 eps weight_decay (as given). */
static void kvps__optim_rec(const kvps_optim *o, unsigned char *rec) {
    uint32_t rule = (uint32_t)o->rule;
    float f[6] = {o->lr, o->momentum, o->beta1, o->beta2, o->eps, o->weight_decay};
    memcpy(rec, &rule, 4);
    memcpy(rec + 4, f, sizeof f);
}

/* Decodes (and resolves defaults of) a CONFIG record; checks every field (a user rule's id is
   in range; whether the server has it is the server's check). */
static kvps_result kvps__optim_read(const unsigned char *rec, kvps_optim *o) {
    uint32_t rule;
    float f[6];
    memcpy(&rule, rec, 4);
    memcpy(f, rec + 4, sizeof f);
    int known = rule < KVPS_RULE_COUNT || kvps__rule_is_user(rule);
    o->rule = (kvps_rule)(known ? rule : 0);
    o->lr = f[0] != 0.0f ? f[0] : KVPS_DEFAULT_LR;
    o->momentum = f[1] != 0.0f ? f[1] : KVPS_DEFAULT_MOMENTUM;
    o->beta1 = f[2] != 0.0f ? f[2] : KVPS_DEFAULT_BETA1;
    o->beta2 = f[3] != 0.0f ? f[3] : KVPS_DEFAULT_BETA2;
    o->eps = f[4] != 0.0f ? f[4] : KVPS_DEFAULT_EPS;
    o->weight_decay = f[5];
    if (!known) return KVPS_ERR_MALFORMED;
    return kvps__optim_bad_field(o) ? KVPS_ERR_HYPERPARAM : KVPS_OK;
}

/* The rules of kvps_rule, in float32, in the documented order, on n values w with state v (and
   m2 for Adam and AdamW; *b1t, *b2t Adam's bias-correction powers; t AdamW's step, 1 at the
   first). Shared by keys and table rows (no AdamW there: it needs the step). */
static void kvps__rule_math(const kvps_optim *o, float *w, const float *sum, float c, float *v, float *m2, float *b1t,
                            float *b2t, uint64_t t, size_t n) {
    switch (o->rule) {
    case KVPS_RULE_MEAN: kvps__mean_into(w, sum, c, n); break;
    case KVPS_RULE_SUM: case KVPS_RULE_MAX: case KVPS_RULE_MIN: memcpy(w, sum, n * sizeof(float)); break;
    case KVPS_RULE_ACCUMULATE: kvps__add(w, sum, n); break;
    case KVPS_RULE_SGD: kvps__sgd_step(w, sum, o->lr, c, n); break;
    case KVPS_RULE_MOMENTUM:
        for (size_t i = 0; i < n; i++) { float g = sum[i] / c; v[i] = o->momentum * v[i] + g; w[i] -= o->lr * v[i]; }
        break;
    case KVPS_RULE_NESTEROV:
        for (size_t i = 0; i < n; i++) { float g = sum[i] / c; v[i] = o->momentum * v[i] + g; w[i] -= o->lr * (g + o->momentum * v[i]); }
        break;
    case KVPS_RULE_ADAGRAD:
        for (size_t i = 0; i < n; i++) { float g = sum[i] / c; v[i] += g * g; w[i] -= o->lr * g / (sqrtf(v[i]) + o->eps); }
        break;
    case KVPS_RULE_ADAM: {
        *b1t *= o->beta1;
        *b2t *= o->beta2;
        float c1 = 1.0f - *b1t, c2 = 1.0f - *b2t;
        for (size_t i = 0; i < n; i++) {
            float g = sum[i] / c;
            v[i] = o->beta1 * v[i] + (1.0f - o->beta1) * g;
            m2[i] = o->beta2 * m2[i] + (1.0f - o->beta2) * (g * g);
            w[i] -= o->lr * (v[i] / c1) / (sqrtf(m2[i] / c2) + o->eps);
        }
        break;
    }
    case KVPS_RULE_ADAMW: { /* torch.optim.AdamW's single-tensor path: its double scalars, its float order */
        float d = (float)(1.0 - (double)o->lr * (double)o->weight_decay), a1 = (float)(1.0 - (double)o->beta1),
              a2 = (float)(1.0 - (double)o->beta2);
        float step = (float)((double)o->lr / (1.0 - pow((double)o->beta1, (double)t)));
        float c2 = (float)sqrt(1.0 - pow((double)o->beta2, (double)t));
        for (size_t i = 0; i < n; i++) {
            float g = sum[i] / c;
            w[i] = w[i] * d;
            v[i] = fmaf(a1, g, o->beta1 * v[i]);         /* torch's add_(g, alpha): one rounding (FMA) */
            m2[i] = fmaf(a2 * g, g, o->beta2 * m2[i]);   /* addcmul_(g, g, value): (value * g) fused with * g + */
            w[i] = w[i] - (step * v[i]) / (sqrtf(m2[i]) / c2 + o->eps);
        }
        break;
    }
    default: break;
    }
}

// >>state
/* The server's types: a buffered contribution, a parked pull, a stored value, a key, a deferred
   push, and the server itself (its fields grouped by concern). */
typedef struct kvps__pend { /* a contribution buffered until its rank's turn (BSP) */
    struct kvps__pend *next;
    uint32_t tag, pad;       /* REPLICAS under BSP: its request (kvps__preq index + 1) */
    float data[];
} kvps__pend;

typedef struct kvps__parked { /* a pull waiting for a key's round */
    struct kvps__parked *next;
    int stalled;
    int64_t since, warned; /* parked at, last named by the stall inspector (ms) */
    zmq_msg_t id;
    kvps__hdr hdr;
    uint32_t *idx; /* key indices in request order */
    uint64_t after; /* a READ: the sequence of the worker's push it waits for (0: a pull) */
    double val;     /* an ALLREDUCE: the worker's value, and its kvps_scalar_op */
    uint32_t sop;
} kvps__parked;

/* A stored value. ZeroMQ may still be sending it (zero-copy pull replies): refs counts the key's
   own reference plus one per frame in flight; the last release frees it. */
typedef struct kvps__vbuf {
    int refs;
    char pad[60]; /* data starts 64 bytes in, 64-byte aligned */
    float data[];
} kvps__vbuf;

typedef struct kvps__key {
    uint64_t key, len;
    float *value, *accum;  /* value == cur->data */
    kvps__vbuf *cur, *spare;
    uint64_t round;      /* rounds applied */
    uint32_t summed;     /* BSP: ranks 0..summed-1 are done for this round (in accum, or out) */
    uint32_t nin;        /* BSP: contributions in accum this round */
    uint64_t stamp;      /* duplicate detection within one request */
    uint64_t *recv;      /* per worker: contributions received */
    kvps__pend **qhead, **qtail; /* per worker: buffered contributions (lazily allocated) */
    kvps__parked *waiters;
    kvps_optim opt;      /* rule DEFAULT: the server's update rule */
    struct kvps__defer *def; /* async: pushes received, applied together by kvps__flush */
    uint32_t ndef;
    float *state;        /* optimizer state: v, h, or m then v (2 x len) */
    float b1t, b2t;      /* Adam: beta1^t, beta2^t */
    uint64_t step;       /* updates under the rule in force since its CONFIG (AdamW's and user rules' t) */
    struct kvps__tl_key *tl; /* timeline on: when this round's and the next's contributions came */
    uint32_t *ctag;      /* REPLICAS under BSP, a primary: per worker, the request (kvps__preq index + 1)
                            whose contribution is in accum this round; 0: none */
    uint64_t *dtag;      /* REPLICAS under BSP, a backup: per worker, the incarnation and sequence of
                            its request whose contribution the last applied round held */
} kvps__key;

struct kvps__gbuf { unsigned char *p; size_t len, cap; }; /* a growing byte buffer */

struct kvps_server {
    /* configuration and sockets */
    kvps_server_desc desc;    /* defaults resolved; the pointers it keeps: OWNERSHIP in the manual */
    int m;                    /* desc.num_workers */
    void *ctx, *router;
    int own_ctx;
    char endpoint[256];       /* resolved (the port of '*') */
    /* serving thread */
    pthread_t thread;
    int started;
    int stop_pipe[2];
    /* update rules */
    kvps_update_fn update_fn; /* your own rule, or NULL */
    kvps_optim default_opt;   /* desc.update as a kvps_rule (keys without their own rule) */
    kvps_user_rule urules[KVPS_RULE_USER_LAST - KVPS_RULE_USER + 1]; /* desc.user_rules, copied */
    int nurules;
    char why[256];            /* a restore's or import's refusal in words (serving thread, or before start) */
    /* key store: open addressing (key -> index + 1), grows at 1/2 load */
    kvps__key **keys;
    uint32_t nkeys, cap_keys;
    uint32_t *slots;
    uint64_t nslots;
    uint64_t stamp;           /* duplicate keys within one request */
    struct kvps__table *tables; /* sparse tables */
    /* consistency */
    int cur_k;                /* SSP / ADAPTIVE: staleness in force */
    uint64_t win_rounds, win_pulls, win_stalls; /* ADAPTIVE: the current window */
    kvps__parked *barrier_waiters;
    uint64_t *barrier_gen;    /* per worker: barriers entered */
    kvps__key **dirty;        /* async: keys with deferred pushes */
    uint32_t ndirty, cap_dirty;
    /* exactly-once */
    struct kvps__seen *seen;  /* per worker: which requests were applied */
    /* liveness: the socket each worker last spoke from, since when it has been gone, lost */
    void *mon;
    int *rank_fd;
    int64_t *gone_since;
    uint8_t *lost;
    int nlost;
    uint8_t *out;             /* left the aggregation: KVPS__OUT_LEFT (elastic) or KVPS__OUT_JOINED (kvps_worker_join) */
    double *ar_last;          /* per worker: the result of its last ALLREDUCE (a re-send after it completed gets it) */
    /* sessions: who said hello (and with what), who finished, tensor names; the stall inspector */
    uint32_t *live_inc;       /* per worker: the incarnation whose hello was accepted (0: none) */
    uint64_t token;           /* the job token's digest (0: none): hellos and REPL hellos must carry it */
    uint64_t stranger_logged[16]; /* the last strangers logged (connection keys), so each is logged once */
    unsigned nstranger_logged;
    int gate;                 /* test hook: 0: connections are held to the job's rules (kvps__admit),
                                 inproc is not; 1: inproc too; -1: nothing is */
    uint32_t *bad_inc;        /* per worker: an incarnation whose hello was refused, and why */
    char (*bad_text)[200];
    uint8_t *heard;           /* per worker: has spoken at all */
    uint8_t *done;            /* per worker: finished (BYE) */
    int ndone, finish;        /* finish: the serving loop ends (1: every worker finished; 2: the job has
                                 ended with workers lost, kvps__job_end) */
    int64_t end_at;           /* every worker finished or lost, one lost: when the loop ends (ms; 0: not so) */
    kvps_result run_result;   /* what kvps_server_run returned in the background thread (kvps_server_wait) */
    int ref_rank;             /* the worker whose hello set ref (-1: none yet): later ones must agree */
    unsigned char ref[KVPS__HELLO_BYTES];
    kvps__place place;        /* RESHARD: how this shard's keys were placed (count 0: never resharded) */
    uint8_t *place_wait;      /* per worker: said hello not knowing the placement: keyed requests are
                                 refused until its hello names it */
    int restored;             /* kvps_server_restore loaded a checkpoint */
    uint8_t *rejoin;          /* per worker, on a restored server: 1 until its hello comes (what it sends before is
                                 dropped unanswered: it sends it again after the hello), 2 once that was logged */
    struct kvps__tname *tnames; /* tensor names by base key: open addressing, grows at 1/2 load */
    uint32_t ntnames, cap_tnames;
    int64_t stall_next;       /* the stall inspector's next look (ms) */
    int stopped;              /* kvps_server_run has returned (kvps_server_wait; under ckpt_mu) */
    /* CURVE */
    void *zap;                /* the ZAP handler (REP on inproc://zeromq.zap.01) */
    uint8_t (*curve_ok)[32];
    int ncurve_ok;
    char (*curve_rep)[41];    /* CURVE with replicas: per place in the chain, its public key (Z85) */
    int ncurve_rep;
    uint8_t curve_pub[32], curve_sec[32]; /* this server's key pair (the replica links' client keys) */
    /* request scratch: key indices, unaligned values, decoded contributions */
    uint32_t *scratch_idx;
    size_t scratch_cap;
    float *scratch;
    size_t scratch_len;
    float *dscratch;
    size_t dscratch_len;
    /* checkpoints: asked for by other threads (ckpt_req), written by the serving thread */
    pthread_mutex_t ckpt_mu;
    pthread_cond_t ckpt_cv;
    uint64_t ckpt_req, ckpt_done, max_round, ckpt_round;
    uint32_t ckpt_gen;        /* checkpoints written (counted on from the restored file's): replies carry it + 1 */
    kvps_result ckpt_result;
    kvps_server_stats stats;  /* read by other threads: atomic adds */
    kvps__tl *tl;             /* the timeline, NULL when off */
    /* replicas (REPLICAS): the shard's chain, this server's role in it; a primary's links to
       the others and the replies it holds until every live backup has what they depend on */
    int nrep, role;           /* role: KVPS__ROLE_* */
    char **chain;
    struct kvps__link *links; /* per place in the chain (this server's own unused) */
    uint32_t epoch;           /* rises with each promotion: an older primary's messages are refused */
    uint64_t fwd_seq;         /* primary: messages sent down the chain; backup: the last one applied */
    uint64_t ack_due;         /* backup: the sequence to acknowledge after this batch */
    int ack_now;              /* backup: ack_due is to be sent (a snapshot's sequence may be 0) */
    struct kvps__held *held;  /* primary: replies held, oldest first (a ring) */
    size_t held_head, nheld, cap_held;
    int replaying;            /* backup: serving the primary's copy of a request (no liveness from it) */
    int primary_fd;           /* backup: the connection the primary speaks from (-1: none) */
    int *member_fd;           /* per replica of the chain: the connection whose REPL hello proved it a
                                 member (-2: none; -1: inproc) */
    uint64_t chain_hash;      /* FNV-1a of the chain, as REPL hellos name it */
    int64_t loop_at;          /* primary: when the serving loop last went round (a stop shows as a gap) */
    int fenced;               /* primary: it stood still past peer_timeout_ms; replies wait for a backup
                                 to take a snapshot from it again (kvps__repl_fence) */
    int64_t fence_at;         /* when it fenced: at most 2 x peer_timeout_ms later it goes on as before */
    int synced;               /* backup: holds the shard (a snapshot of this epoch) */
    int64_t repl_look;        /* primary: when to read the links even if nothing woke it (ms) */
    zmq_msg_t primary_id;     /* backup: the primary's routing id (acknowledgements go there) */
    /* REPLICAS under BSP (not elastic): the primary sends each round's sum, not the pushes */
    int rmode;
    struct kvps__preq *preq;  /* primary: pushes not yet in applied rounds (index + 1 is a tag) */
    uint32_t npreq, cap_preq, preq_free; /* preq_free: a free list through the unused (index + 1) */
    uint32_t cur_preq;        /* the push being served (its tag; 0: none) */
    struct kvps__gbuf rb, rd; /* rounds applied (rb_keys of them) and pushes completed since
                                 the last ROUND message */
    uint32_t rb_keys;
};

enum { KVPS__ROLE_NONE, KVPS__ROLE_PRIMARY, KVPS__ROLE_BACKUP };
/* REPL kinds (the header's rank). HELLO: a link's first message on each connection, [hdr][u64 job
   token digest, u64 chain hash]: proves the sender a member of this chain (the rest is refused). */
enum { KVPS__REPL_FWD, KVPS__REPL_SNAP, KVPS__REPL_LOST, KVPS__REPL_ROUND, KVPS__REPL_HELLO, KVPS__REPL_KINDS };
/* REPLICAS under BSP: a push whose contributions are not all in applied rounds yet. left
   counts them, plus one while the request is served; at 0 it is recorded as applied (the
   backups mark it in their re-send windows) and a PUSH is answered. */
typedef struct kvps__preq {
    uint32_t left, next_free;
    uint8_t ack;       /* a PUSH: answered here (a PUSHPULL's pull answers it) */
    uint8_t answered;  /* answered already (a refusal, or KVPS_ERR_PEER_LOST) */
    uint8_t refused;   /* refused part way: not recorded as applied */
    zmq_msg_t id;
    kvps__hdr hdr;
} kvps__preq;
struct kvps__rq;
/* REPLICAS: what the rest of the server asks of replication, all of it (>>replicas has the rest).
   The request path: */
static int kvps__repl_admit(kvps_server *s, zmq_msg_t *fr, int nfr, int fd, const kvps__hdr *h0, const char *uid);
                                         /* replica traffic, or a replica's CURVE key: 1 serve it, 0 refused
                                            (or a REPL hello taken), -1 no replication matter */
static int kvps__repl_inbound(kvps_server *s, zmq_msg_t *fr, int nfr, const kvps__hdr *h0);
                                         /* before parsing: a REPL served, or a backup that cannot take over:
                                            1 when the message is done with */
static void kvps__repl_forward(kvps_server *s, const struct kvps__rq *q, zmq_msg_t *fr, int nfr);
                                         /* a primary: the request down the chain, before it is served */
static int kvps__repl_track(kvps_server *s, const struct kvps__rq *q); /* a BSP push's rounds: 1 tracked, 0 not, -1 memory */
static void kvps__repl_untrack(kvps_server *s, int applied);          /* ... its own hold released */
static void kvps__repl_round(kvps_server *s, kvps__key *k, int count);  /* a BSP round applied: its sum goes down */
static void kvps__repl_after(kvps_server *s);                           /* after each message: those sums, sent */
static int kvps__repl_reply(kvps_server *s, zmq_msg_t *frames, int n);  /* a reply: 1 when replication took it */
static int kvps__repl_resent(kvps_server *s, const kvps__hdr *h, zmq_msg_t *id); /* a re-sent push still held: 1 */
static void kvps__repl_fail(kvps_server *s, kvps__key *k, const char *why);     /* held pushes answered with why */
static void kvps__repl_worker_lost(kvps_server *s, int r);  /* a primary tells its backups */
static void kvps__repl_disconnected(kvps_server *s, int fd); /* a connection closed */
static int kvps__repl_declines(kvps_server *s); /* a backup that serves no request now: 1 */
static void kvps__repl_answer(kvps_server *s, zmq_msg_t *id, uint64_t seq, kvps_result rc, const char *text);
/* The serving loop (kvps_server_run): */
static int kvps__repl_poll_items(kvps_server *s, zmq_pollitem_t *items, int n, int cap); /* the links, after n items */
static long kvps__repl_timeout(const kvps_server *s, long tmo);  /* a primary looks at its links 10 times a second */
static void kvps__repl_woke(kvps_server *s, long tmo);           /* after each poll: the fence */
static void kvps__repl_batch(kvps_server *s, const zmq_pollitem_t *links, int nlinks); /* after each batch */
static void kvps__repl_finish(kvps_server *s);                   /* the job ended: the last answers, down the chain */
static void kvps__worker_lost(kvps_server *s, int r);

#define KVPS__STAT_ADD(s, field, v) __atomic_fetch_add(&(s)->stats.field, (uint64_t)(v), __ATOMIC_RELAXED)

/* A single-key async push held back so that the pushes queued for a key are applied in one pass
   over its value (kvps__flush): its values (still in the message) and who to answer. */
enum { KVPS__DEFER_MAX = 8, KVPS__DEFER_MIN_LEN = 16384, KVPS__CHUNK = 4096 };
typedef struct kvps__defer {
    zmq_msg_t data, id;
    kvps__hdr hdr;
} kvps__defer;
static void kvps__defer_close(kvps__defer *d) {
    zmq_msg_close(&d->data);
    zmq_msg_close(&d->id);
}

// >>exactly-once
/* Exactly-once: per worker, its incarnation and a window of the request sequence numbers
   (handle >> 24, rising) already applied. A re-sent request inside the window is answered
   without being applied again; one older than the window is refused (KVPS_ERR_REPLAY).
   Incarnation 0 (a raw client) is not tracked. */
enum { KVPS__SEEN_WIN = 1 << 16 };
typedef struct kvps__seen {
    uint32_t inc;
    uint64_t hi;
    uint64_t bits[KVPS__SEEN_WIN / 64];
} kvps__seen;

static int kvps__seen_bit(const kvps__seen *w, uint64_t q) { return (int)(w->bits[(q / 64) % (KVPS__SEEN_WIN / 64)] >> (q % 64) & 1); }
static void kvps__seen_set(kvps__seen *w, uint64_t q, int on) {
    uint64_t *b = &w->bits[(q / 64) % (KVPS__SEEN_WIN / 64)], m = 1ull << (q % 64);
    *b = on ? *b | m : *b & ~m;
}
/* 1: new (now recorded); 0: applied before; -1: too old to tell. */
static int kvps__seen_check(kvps__seen *w, uint32_t inc, uint64_t q) {
    if (w->inc != inc) { memset(w, 0, sizeof *w); w->inc = inc; }
    if (q > w->hi) {
        if (q - w->hi >= KVPS__SEEN_WIN) memset(w->bits, 0, sizeof w->bits);
        else for (uint64_t x = w->hi + 1; x < q; x++) kvps__seen_set(w, x, 0);
        kvps__seen_set(w, q, 1);
        w->hi = q;
        return 1;
    }
    if (w->hi - q >= KVPS__SEEN_WIN) return -1;
    if (kvps__seen_bit(w, q)) return 0;
    kvps__seen_set(w, q, 1);
    return 1;
}

// >>replies
/* Sending a reply; the error and acknowledgement replies. */
/* Checks one request whole, then applies it. frames: [id][meta][values?]. */
/* Sends a reply; one that cannot be queued (the peer does not read its replies, or is gone)
   is dropped and counted. */
static int kvps__read_reply(zmq_msg_t *frames, int n) { /* a READ's answer: a backup sends it */
    return n >= 2 && zmq_msg_size(&frames[1]) >= KVPS__HDR &&
           ((const kvps__hdr *)zmq_msg_data(&frames[1]))->op == (KVPS__OP_READ | KVPS__OP_REPLY);
}
/* The checkpoint stamp (FAULTS, checkpoints): 0 when this server writes no checkpoints, else 1 + the
   checkpoints it has written, counted on across restores. A reply stamped g answers a request
   applied before checkpoint g was written, so checkpoint g and every later one hold it: a worker
   keeps what it must send again after a restore until it hears a higher stamp. */
static uint32_t kvps__stamp(const kvps_server *s) {
    return s->desc.checkpoint_path && *s->desc.checkpoint_path ? s->ckpt_gen + 1 : 0;
}
/* Every reply that succeeded carries the stamp in the header's aux (a READ's answer, from a
   replica that is not the worker's server, does not). */
static void kvps__stamp_reply(const kvps_server *s, zmq_msg_t *frames, int n) {
    if (n < 2 || zmq_msg_size(&frames[1]) < KVPS__HDR) return;
    unsigned char *p = (unsigned char *)zmq_msg_data(&frames[1]);
    kvps__hdr h;
    memcpy(&h, p, sizeof h);
    if (h.magic != KVPS__MAGIC || !(h.op & KVPS__OP_REPLY) || h.op == (KVPS__OP_READ | KVPS__OP_REPLY) || h.status != KVPS_OK)
        return;
    h.aux = kvps__stamp(s);
    memcpy(p + offsetof(kvps__hdr, aux), &h.aux, sizeof h.aux);
}
static void kvps__server_send(kvps_server *s, zmq_msg_t *frames, int n) {
    kvps__stamp_reply(s, frames, n);
    if (kvps__repl_reply(s, frames, n)) return; /* a backup's (the primary answers), or held for the backups */
    if (kvps__send_frames(s->router, frames, n) == 0) return;
    KVPS__STAT_ADD(s, replies_dropped, 1);
    kvps__log(KVPS_LOG_DEBUG, "server %d: reply dropped: %s", s->desc.rank, zmq_strerror(zmq_errno()));
}

/* Replies [id][hdr][text] with an error; id is copied, not consumed. */
/* A reply's header: the request's, with the reply bit and the status. An error reply carries
   only the op, who asked and which request (req NULL: no header could be read). */
static kvps__hdr kvps__reply_hdr(const kvps__hdr *req, kvps_result status) {
    kvps__hdr h;
    if (req && status == KVPS_OK) {
        h = *req;
    } else {
        memset(&h, 0, sizeof h);
        h.magic = KVPS__MAGIC;
        h.version = KVPS__VERSION;
        if (req) { h.op = req->op; h.rank = req->rank; h.req_id = req->req_id; }
    }
    h.op = (uint8_t)(h.op | KVPS__OP_REPLY);
    h.status = status;
    return h;
}

/* The first two frames of a reply: the routing id (copied, or moved out of *id) and the header. */
static void kvps__reply_start(zmq_msg_t f[2], zmq_msg_t *id, int move, const kvps__hdr *h) {
    if (move) {
        f[0] = *id;
        zmq_msg_init(id);
    } else {
        zmq_msg_init(&f[0]);
        zmq_msg_copy(&f[0], id);
    }
    kvps__msg_from_buf(&f[1], h, sizeof *h);
}

/* Replies [id][hdr][text] with an error; id is copied, not consumed. */
static void kvps__reply_errorv(kvps_server *s, zmq_msg_t *id, const kvps__hdr *req, kvps_result rc, const char *fmt,
                               va_list ap) {
    char text[256];
    vsnprintf(text, sizeof text, fmt, ap);
    KVPS__STAT_ADD(s, errors, 1);
    /* a rejected request was not applied: a re-send of it must not count as a duplicate */
    if (req && req->status != 0 && req->rank < (uint32_t)s->m && s->seen[req->rank].inc == (uint32_t)req->status &&
        rc != KVPS_ERR_REPLAY && s->seen[req->rank].hi - (req->req_id >> 24) < KVPS__SEEN_WIN)
        kvps__seen_set(&s->seen[req->rank], req->req_id >> 24, 0);
    kvps__log(KVPS_LOG_WARN, "server %d: rejected request from rank %u: %s (%s)", s->desc.rank,
              req ? req->rank : 0u, text, kvps_result_str(rc));
    kvps__hdr h = kvps__reply_hdr(req, rc);
    zmq_msg_t f[3];
    kvps__reply_start(f, id, 0, &h);
    kvps__msg_from_buf(&f[2], text, strlen(text));
    kvps__server_send(s, f, 3);
}
static void kvps__reply_error(kvps_server *s, zmq_msg_t *id, const kvps__hdr *req, kvps_result rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvps__reply_errorv(s, id, req, rc, fmt, ap);
    va_end(ap);
}

/* Replies [id][hdr] with status OK and no payload; id is copied, not consumed. */
static void kvps__reply_ack(kvps_server *s, zmq_msg_t *id, const kvps__hdr *req) {
    kvps__hdr h = kvps__reply_hdr(req, KVPS_OK);
    h.nkeys = 0;
    zmq_msg_t f[2];
    kvps__reply_start(f, id, 0, &h);
    kvps__server_send(s, f, 2);
}

/* An ALLREDUCE's answer: [id][hdr][f64 x]; id is copied. */
static void kvps__reply_scalar(kvps_server *s, zmq_msg_t *id, const kvps__hdr *req, double x) {
    kvps__hdr h = kvps__reply_hdr(req, KVPS_OK);
    h.nkeys = 0;
    zmq_msg_t f[3];
    kvps__reply_start(f, id, 0, &h);
    if (kvps__msg_from_buf(&f[2], &x, sizeof x) != 0) {
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        kvps__reply_error(s, id, req, KVPS_ERR_NOMEM, "allreduce: no memory for the answer");
        return;
    }
    kvps__server_send(s, f, 3);
}

// >>keys
/* The key store: open addressing from key to index, values in reference-counted buffers (a
   pull reply may still be sending one), creation, and roll-back of a rejected request's keys. */
static float *kvps__dscratch(kvps_server *s, uint64_t len) {
    if (s->dscratch_len < len) {
        free(s->dscratch);
        s->dscratch = (float *)kvps__alloc_floats(len);
        s->dscratch_len = s->dscratch ? (size_t)len : 0;
    }
    return s->dscratch;
}

static uint32_t kvps__find(const kvps_server *s, uint64_t key) {
    uint64_t mask = s->nslots - 1, i = kvps__mix64(key) & mask;
    for (;;) {
        uint32_t v = s->slots[i];
        if (v == 0) return UINT32_MAX;
        if (s->keys[v - 1]->key == key) return v - 1;
        i = (i + 1) & mask;
    }
}

static int kvps__table_grow(kvps_server *s) {
    uint64_t ns = s->nslots ? s->nslots * 2 : 1024;
    uint32_t *slots = (uint32_t *)calloc(ns, sizeof *slots);
    if (!slots) return -1;
    for (uint32_t k = 0; k < s->nkeys; k++) {
        uint64_t i = kvps__mix64(s->keys[k]->key) & (ns - 1);
        while (slots[i]) i = (i + 1) & (ns - 1);
        slots[i] = k + 1;
    }
    free(s->slots);
    s->slots = slots;
    s->nslots = ns;
    return 0;
}

static kvps__vbuf *kvps__vbuf_new(uint64_t len) {
    if (len > (SIZE_MAX - 128) / sizeof(float)) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(kvps__vbuf) + (size_t)len * sizeof(float)) != 0) return NULL;
    ((kvps__vbuf *)p)->refs = 1;
    return (kvps__vbuf *)p;
}

static void kvps__vbuf_unref(kvps__vbuf *b) {
    if (b && __atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) free(b);
}

static void kvps__vbuf_release(void *data, void *hint) {
    (void)data;
    kvps__vbuf_unref((kvps__vbuf *)hint);
}

static int kvps__vbuf_busy(kvps__vbuf *b) { return __atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) > 1; }

/* Before an update writes the value: if a pull reply still references it, move the value to a
   buffer nobody is sending (the idle spare, or a new one). Returns -1 when out of memory. */
static int kvps__value_writable(kvps__key *k) {
    if (!kvps__vbuf_busy(k->cur)) return 0;
    kvps__vbuf *nb = k->spare && !kvps__vbuf_busy(k->spare) ? k->spare : kvps__vbuf_new(k->len);
    if (!nb) return -1;
    if (nb != k->spare) kvps__vbuf_unref(k->spare); /* busy spare: its last frame frees it */
    memcpy(nb->data, k->cur->data, (size_t)k->len * sizeof(float));
    k->spare = k->cur;
    k->cur = nb;
    k->value = nb->data;
    return 0;
}

static void kvps__key_free(kvps__key *k, int m) {
    if (!k) return;
    if (k->qhead)
        for (int r = 0; r < m; r++)
            while (k->qhead[r]) { kvps__pend *p = k->qhead[r]; k->qhead[r] = p->next; free(p); }
    while (k->waiters) {
        kvps__parked *p = k->waiters;
        k->waiters = p->next;
        zmq_msg_close(&p->id);
        free(p->idx);
        free(p);
    }
    kvps__vbuf_unref(k->cur);
    kvps__vbuf_unref(k->spare);
    for (uint32_t i = 0; i < k->ndef; i++) kvps__defer_close(&k->def[i]);
    free(k->def);
    free(k->qhead); free(k->qtail); free(k->recv); free(k->accum); free(k->state); free(k->tl);
    free(k->ctag); free(k->dtag); free(k);
}

/* Creates a key; returns its index or UINT32_MAX when out of memory. */
static uint32_t kvps__key_create(kvps_server *s, uint64_t key, uint64_t len) {
    if ((uint64_t)(s->nkeys + 1) * 2 > s->nslots && kvps__table_grow(s) != 0) return UINT32_MAX;
    if (s->nkeys == s->cap_keys) {
        uint32_t nc = s->cap_keys ? s->cap_keys * 2 : 256;
        kvps__key **nk = (kvps__key **)realloc(s->keys, nc * sizeof *nk);
        if (!nk) return UINT32_MAX;
        s->keys = nk;
        s->cap_keys = nc;
    }
    kvps__key *k = (kvps__key *)calloc(1, sizeof *k);
    if (!k) return UINT32_MAX;
    k->key = key;
    k->len = len;
    k->cur = kvps__vbuf_new(len);
    k->recv = (uint64_t *)calloc((size_t)s->m, sizeof *k->recv);
    if (!k->cur || !k->recv) { kvps__key_free(k, s->m); return UINT32_MAX; }
    k->value = k->cur->data;
    if (s->desc.init_fn) s->desc.init_fn(s->desc.init_user, key, k->value, (size_t)len);
    else memset(k->value, 0, (size_t)len * sizeof(float));
    uint64_t i = kvps__mix64(key) & (s->nslots - 1);
    while (s->slots[i]) i = (i + 1) & (s->nslots - 1);
    s->slots[i] = s->nkeys + 1;
    s->keys[s->nkeys] = k;
    KVPS__STAT_ADD(s, keys, 1);
    KVPS__STAT_ADD(s, value_bytes, len * sizeof(float));
    return s->nkeys++;
}

/* Forgets the keys from index n on (just created by a request that then failed). */
static void kvps__keys_truncate(kvps_server *s, uint32_t n) {
    while (s->nkeys > n) {
        kvps__key *k = s->keys[--s->nkeys];
        KVPS__STAT_ADD(s, keys, (uint64_t)-1);
        KVPS__STAT_ADD(s, value_bytes, (uint64_t)0 - k->len * sizeof(float));
        kvps__key_free(k, s->m);
    }
    memset(s->slots, 0, s->nslots * sizeof *s->slots);
    for (uint32_t k = 0; k < s->nkeys; k++) {
        uint64_t i = kvps__mix64(s->keys[k]->key) & (s->nslots - 1);
        while (s->slots[i]) i = (i + 1) & (s->nslots - 1);
        s->slots[i] = k + 1;
    }
}

// >>consistency
/* Applying pushes: a contribution decoded and combined, the rule applied to a round, BSP / SSP /
   adaptive rounds in rank order, parked pulls answered when their round is there, barriers, and
   async pushes deferred and applied together. */
/* The codec for id: built-in, or one from desc.codecs; NULL when unknown. */
static const kvps_codec *kvps__server_codec(const kvps_server *s, int id, kvps_codec *tmp) {
    if (kvps__codec_info(id)) { *tmp = kvps_codec_get((kvps_codec_id)id); return tmp; }
    for (int i = 0; i < s->desc.num_codecs; i++)
        if (s->desc.codecs[i].id == id) return &s->desc.codecs[i];
    return NULL;
}

/* A contribution: dense floats, or a validated codec blob. */
typedef struct kvps__contrib {
    const float *g;
    const kvps_codec *codec;
    const void *blob;
    size_t bytes;
} kvps__contrib;

/* dst = contribution (acc 0), or dst combined with it (acc 1): added, or element-wise max /
   min for those rules (NaN wins); a top-k blob adds sparsely. */
static void kvps__contrib_into(kvps_server *s, const kvps__key *k, const kvps__contrib *c, float *dst, int acc) {
    size_t len = (size_t)k->len;
    int mm = acc && (k->opt.rule == KVPS_RULE_MAX || k->opt.rule == KVPS_RULE_MIN);
    const float *g = c->g;
    if (!g && mm) { /* decode first, then take the max / min */
        float *d = kvps__dscratch(s, len);
        if (!d) return;
        kvps_codec_decode(c->codec, c->blob, c->bytes, d, len, 0);
        g = d;
    }
    if (mm) {
        int mx = k->opt.rule == KVPS_RULE_MAX;
        for (size_t i = 0; i < len; i++)
            if (g[i] != g[i] || (mx ? g[i] > dst[i] : g[i] < dst[i])) dst[i] = g[i];
    } else if (g) {
        if (acc) kvps__add(dst, g, len);
        else memcpy(dst, g, len * sizeof(float));
    } else {
        kvps_codec_decode(c->codec, c->blob, c->bytes, dst, len, acc);
    }
}

/* The rule in force for a key's own rule r (DEFAULT: the server's), and a key's whole optim. */
static kvps_rule kvps__rule_in_force(const kvps_server *s, kvps_rule r) {
    return r != KVPS_RULE_DEFAULT ? r : s->default_opt.rule;
}
static const kvps_optim *kvps__optim_in_force(const kvps_server *s, const kvps__key *k) {
    return k->opt.rule != KVPS_RULE_DEFAULT ? &k->opt : &s->default_opt;
}
/* A table row's state floats: per value, then the scalars. */
static uint32_t kvps__table_sdim(kvps_rule r, uint32_t dim) {
    return (uint32_t)kvps__rules[r].state * dim + kvps__rules[r].scalars;
}
/* The state floats per value of a rule in force (a user rule's n_state; 0 for one the server
   does not have, which CONFIG and restores refuse before a key can hold it). */
static uint32_t kvps__rule_nstate(const kvps_server *s, kvps_rule r) {
    if (!kvps__rule_is_user((uint32_t)r)) return kvps__rules[r].state;
    int i = (int)r - KVPS_RULE_USER;
    return i < s->nurules ? (uint32_t)s->urules[i].n_state : 0;
}
/* "rule 'adamw'" or "user rule 2 ('ema')", for messages. */
static const char *kvps__rule_text(const kvps_server *s, uint32_t r, char *buf, size_t n) {
    int i = (int)r - KVPS_RULE_USER;
    if (r < KVPS_RULE_COUNT) snprintf(buf, n, "rule '%s'", kvps__rules[r].name);
    else if (kvps__rule_is_user(r) && i < s->nurules && s->urules[i].name) snprintf(buf, n, "user rule %d ('%s')", i, s->urules[i].name);
    else if (kvps__rule_is_user(r)) snprintf(buf, n, "user rule %d", i);
    else snprintf(buf, n, "rule %u", (unsigned)r);
    return buf;
}

static int kvps__apply_rule(const kvps_server *s, kvps__key *k, const kvps_optim *o, const float *sum, int count) {
    size_t n = (size_t)k->len;
    uint32_t nstate = kvps__rule_nstate(s, o->rule);
    if (nstate && !k->state) {
        k->state = (float *)calloc(n * (size_t)nstate, sizeof(float));
        if (!k->state) return -1;
        k->b1t = k->b2t = 1.0f;
    }
    k->step++;
    if (kvps__rule_is_user((uint32_t)o->rule)) {
        const kvps_user_rule *u = &s->urules[o->rule - KVPS_RULE_USER];
        float *st[KVPS_MAX_RULE_STATE];
        for (uint32_t j = 0; j < nstate; j++) st[j] = k->state + j * n;
        kvps_rule_args a = {k->key, k->value, sum, count, st, n, k->step, o, u->user};
        u->fn(&a);
        return 0;
    }
    kvps__rule_math(o, k->value, sum, (float)count, k->state, k->state ? k->state + n : NULL, &k->b1t, &k->b2t, k->step, n);
    return 0;
}

static void kvps__adapt(kvps_server *s);

static int kvps__apply(kvps_server *s, kvps__key *k, const float *sum, int count) {
    if (kvps__value_writable(k) != 0) return -1;
    if (k->opt.rule == KVPS_RULE_DEFAULT && s->update_fn) {
        kvps_update_args a = {k->key, k->value, sum, (size_t)k->len, count, k->round, s->desc.update_user};
        s->update_fn(&a);
    } else if (kvps__apply_rule(s, k, kvps__optim_in_force(s, k), sum, count) != 0) {
        return -1;
    }
    k->round++;
    if (k->round > s->max_round) s->max_round = k->round;
    KVPS__STAT_ADD(s, rounds, 1);
    if (s->tl) kvps__tl_round(s, k, count);
    if (s->desc.consistency == KVPS_ADAPTIVE && ++s->win_rounds >= 16) kvps__adapt(s);
    return 0;
}

static void kvps__try_pull(kvps_server *s, kvps__parked *p);

static void kvps__wake(kvps_server *s, kvps__key *k) {
    kvps__parked *w = k->waiters;
    k->waiters = NULL;
    while (w) {
        kvps__parked *next = w->next;
        kvps__try_pull(s, w); /* replies, or parks again on the key it still needs */
        w = next;
    }
}

/* BSP: add rank r's contribution to the round in rank order, buffering out-of-turn ones.
   Contribution c of a rank belongs to round c (one push per key per round). */
static int kvps__bsp_advance(kvps_server *s, kvps__key *k);
static int kvps__bsp_push(kvps_server *s, kvps__key *k, int r, const kvps__contrib *g) {
    size_t bytes = (size_t)k->len * sizeof(float);
    if (!k->accum && !(k->accum = (float *)kvps__alloc_floats(k->len))) return -1;
    uint32_t tag = s->cur_preq; /* REPLICAS: which request the round's sum will hold */
    if (tag && !k->ctag && !(k->ctag = (uint32_t *)calloc((size_t)s->m, sizeof *k->ctag))) return -1;
    uint64_t c = k->recv[r]++;
    if (s->tl) kvps__tl_arrive(s, k, c);
    if ((uint32_t)r == k->summed && c == k->round) {
        if (tag) s->preq[tag - 1].left++;
        kvps__contrib_into(s, k, g, k->accum, k->nin != 0);
        if (k->ctag) k->ctag[r] = tag;
        k->summed++;
        k->nin++;
    } else {
        if (!k->qhead) {
            k->qhead = (kvps__pend **)calloc((size_t)s->m, sizeof *k->qhead);
            k->qtail = (kvps__pend **)calloc((size_t)s->m, sizeof *k->qtail);
            if (!k->qhead || !k->qtail) return -1;
        }
        kvps__pend *p = (kvps__pend *)malloc(sizeof *p + bytes);
        if (!p) return -1;
        p->next = NULL;
        p->tag = tag;
        if (tag) s->preq[tag - 1].left++;
        kvps__contrib_into(s, k, g, p->data, 0);
        if (k->qtail[r]) k->qtail[r]->next = p; else k->qhead[r] = p;
        k->qtail[r] = p;
    }
    return kvps__bsp_advance(s, k);
}

/* Whether rank r has no contribution in k's round being summed: it left (elastic), or it joined
   (kvps_worker_join) and pushed nothing for this round before it did. */
static int kvps__skipped(const kvps_server *s, const kvps__key *k, uint32_t r) {
    return s->out[r] == KVPS__OUT_LEFT || (s->out[r] == KVPS__OUT_JOINED && k->recv[r] <= k->round);
}

/* Sums buffered contributions whose turn has come, skipping ranks that left (elastic) or joined,
   and applies each round that completes; 1 if one did, -1 when out of memory. */
static int kvps__bsp_advance(kvps_server *s, kvps__key *k) {
    int advanced = 0;
    for (;;) {
        while (k->summed < (uint32_t)s->m && kvps__skipped(s, k, k->summed)) k->summed++;
        if (k->summed == (uint32_t)s->m) {
            if (k->nin == 0) break; /* everyone left: no round */
            if (kvps__apply(s, k, k->accum, (int)k->nin) != 0) return -1;
            kvps__repl_round(s, k, (int)k->nin); /* down the chain */
            k->summed = 0;
            k->nin = 0;
            advanced = 1;
            continue;
        }
        uint32_t nr = k->summed;
        kvps__pend *p = k->qhead ? k->qhead[nr] : NULL;
        if (!p) break;
        k->qhead[nr] = p->next;
        if (!p->next) k->qtail[nr] = NULL;
        kvps__contrib c2 = {p->data, NULL, NULL, 0};
        kvps__contrib_into(s, k, &c2, k->accum, k->nin != 0);
        if (k->ctag) k->ctag[nr] = p->tag;
        free(p);
        k->summed++;
        k->nin++;
    }
    return advanced;
}

/* Round a pull from rank r must wait for. */
static uint64_t kvps__needed_round(const kvps_server *s, const kvps__key *k, uint32_t r) {
    switch (s->desc.consistency) {
    case KVPS_BSP: return k->recv[r];
    case KVPS_ASYNC: return 0;
    default: return k->recv[r] > (uint64_t)s->cur_k ? k->recv[r] - (uint64_t)s->cur_k : 0;
    }
}

/* ADAPTIVE: one more step of staleness when more than 10% of the window's pulls stalled, one
   less when none did; parked pulls are looked at again under the new bound. */
static void kvps__adapt(kvps_server *s) {
    int old = s->cur_k, k = old;
    if (s->win_pulls && s->win_stalls * 10 > s->win_pulls && k < s->desc.staleness) k++;
    else if (s->win_stalls == 0 && k > s->desc.staleness_min) k--;
    s->win_rounds = s->win_pulls = s->win_stalls = 0;
    if (k == old) return;
    s->cur_k = k;
    __atomic_store_n(&s->stats.staleness, (uint64_t)k, __ATOMIC_RELAXED);
    KVPS__STAT_ADD(s, switches, 1);
    kvps__log(KVPS_LOG_INFO, "server %d: staleness %d -> %d", s->desc.rank, old, k);
    if (s->desc.on_switch) s->desc.on_switch(s->desc.switch_user, old, k);
    if (k > old)
        for (uint32_t i = 0; i < s->nkeys; i++)
            if (s->keys[i]->waiters) kvps__wake(s, s->keys[i]);
}

static void kvps__parked_free(kvps__parked *p) {
    zmq_msg_close(&p->id);
    free(p->idx);
    free(p);
}

/* The first key of a pull that has not reached the round the puller needs, or NULL. */
static kvps__key *kvps__pull_blocker(const kvps_server *s, const kvps__hdr *hdr, const uint32_t *idx) {
    for (uint32_t i = 0; i < hdr->nkeys; i++) {
        kvps__key *k = s->keys[idx[i]];
        if (k->round < kvps__needed_round(s, k, hdr->rank)) return k;
    }
    return NULL;
}

/* Answers a pull whose keys are all ready; id (the routing id) is moved into the reply. */
static void kvps__pull_reply(kvps_server *s, zmq_msg_t *id, const kvps__hdr *hdr, const uint32_t *idx) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < hdr->nkeys; i++) total += s->keys[idx[i]]->len;
    kvps__hdr h = kvps__reply_hdr(hdr, KVPS_OK);
    zmq_msg_t f[3];
    kvps__reply_start(f, id, 1, &h);
    if (hdr->flags & KVPS__FLAG_CODED_REPLY) { /* per key [u32 bytes][blob] */
        kvps_codec tmp;
        const kvps_codec *cd = kvps__server_codec(s, (int)hdr->aux, &tmp);
        size_t cap = 0, used = 0;
        for (uint32_t i = 0; i < hdr->nkeys; i++) cap += 4 + kvps_codec_max_bytes(cd, (size_t)s->keys[idx[i]]->len);
        unsigned char *buf = (unsigned char *)malloc(cap ? cap : 1);
        kvps_result er = buf ? KVPS_OK : KVPS_ERR_NOMEM;
        for (uint32_t i = 0; i < hdr->nkeys && er == KVPS_OK; i++) {
            kvps__key *k = s->keys[idx[i]];
            size_t nb = 0;
            er = kvps_codec_encode(cd, k->value, (size_t)k->len, NULL, buf + used + 4, cap - used - 4, &nb);
            kvps__put32(buf + used, (uint32_t)nb);
            used += 4 + nb;
        }
        if (er != KVPS_OK || kvps__msg_from_buf(&f[2], buf, used) != 0) {
            free(buf);
            zmq_msg_close(&f[1]);
            kvps__reply_error(s, &f[0], hdr, er != KVPS_OK ? er : KVPS_ERR_NOMEM, "encoding a pull reply");
            zmq_msg_close(&f[0]);
            return;
        }
        free(buf);
        KVPS__STAT_ADD(s, pulls, hdr->nkeys);
        kvps__server_send(s, f, 3);
        return;
    }
    if (hdr->nkeys == 1 && total * sizeof(float) >= KVPS__ZC_REPLY_MIN) {
        /* one large value: send the stored buffer itself; an update meanwhile copies on write */
        kvps__key *k = s->keys[idx[0]];
        __atomic_add_fetch(&k->cur->refs, 1, __ATOMIC_ACQ_REL);
        if (zmq_msg_init_data(&f[2], k->value, (size_t)total * sizeof(float), kvps__vbuf_release, k->cur) == 0) {
            KVPS__STAT_ADD(s, pulls, 1);
            kvps__server_send(s, f, 3);
            return;
        }
        kvps__vbuf_unref(k->cur);
    }
    if (zmq_msg_init_size(&f[2], (size_t)total * sizeof(float)) != 0) {
        zmq_msg_close(&f[1]);
        kvps__reply_error(s, &f[0], hdr, KVPS_ERR_NOMEM, "no memory for a %llu-float reply",
                          (unsigned long long)total);
        zmq_msg_close(&f[0]);
        return;
    }
    char *dst = (char *)zmq_msg_data(&f[2]);
    for (uint32_t i = 0; i < hdr->nkeys; i++) {
        kvps__key *k = s->keys[idx[i]];
        memcpy(dst, k->value, (size_t)k->len * sizeof(float));
        dst += k->len * sizeof(float);
    }
    KVPS__STAT_ADD(s, pulls, hdr->nkeys);
    kvps__server_send(s, f, 3);
}

static const char *kvps__key_text(const kvps_server *s, uint64_t key, char *buf, size_t n);

/* A worker that has finished (and not left: elastic) whose push round `round` of k (k NULL:
   barrier generation `round`) still needs; -1 when none. */
static int kvps__needs_finished(const kvps_server *s, const kvps__key *k, uint64_t round) {
    if (!s->ndone) return -1;
    for (int r = 0; r < s->m; r++)
        if (s->done[r] && !s->out[r] && (k ? k->recv[r] <= round : s->barrier_gen[r] <= round)) return r;
    return -1;
}

/* The first worker declared lost (for the refusals that name it); -1 when none. */
static int kvps__first_lost(const kvps_server *s) {
    for (int r = 0; r < s->m; r++)
        if (s->lost[r]) return r;
    return -1;
}

/* Replies to a parked pull if every key is ready, else parks it on the first key that is not. */
static kvps__key *kvps__read_blocker(const kvps_server *s, const kvps__parked *p);
static void kvps__try_pull(kvps_server *s, kvps__parked *p) {
    kvps__key *k = p->after ? kvps__read_blocker(s, p) : kvps__pull_blocker(s, &p->hdr, p->idx);
    if (k && s->nlost) { /* the round it waits for needs a worker that is gone */
        kvps__reply_error(s, &p->id, &p->hdr, KVPS_ERR_PEER_LOST, "a worker is lost (worker %d: no connection for %d ms): round %llu of key %llu "
                          "cannot complete", kvps__first_lost(s), s->desc.peer_timeout_ms, (unsigned long long)k->round + 1, (unsigned long long)k->key);
        kvps__parked_free(p);
        return;
    }
    int fin = k ? kvps__needs_finished(s, k, k->round) : -1;
    if (fin >= 0) { /* ... or one that said it has finished */
        char what[300];
        kvps__reply_error(s, &p->id, &p->hdr, KVPS_ERR_PEER_LOST, "worker %d has finished (kvps_worker_finish or destroy), "
                          "but round %llu of %s needs its push", fin, (unsigned long long)k->round + 1,
                          kvps__key_text(s, k->key, what, sizeof what));
        kvps__parked_free(p);
        return;
    }
    if (k) {
        if (!p->stalled) { p->stalled = 1; s->win_stalls++; KVPS__STAT_ADD(s, stalls, 1); }
        p->next = k->waiters;
        k->waiters = p;
        return;
    }
    if (p->after) KVPS__STAT_ADD(s, reads, 1);
    kvps__pull_reply(s, &p->id, &p->hdr, p->idx);
    kvps__parked_free(p);
}

static void kvps__barrier_check(kvps_server *s, uint64_t gen);
/* A barrier (or an ALLREDUCE: x, sop) of worker h->rank enters its next generation. */
static void kvps__barrier(kvps_server *s, zmq_msg_t *id, const kvps__hdr *h, double x, uint32_t sop) {
    if (s->nlost) {
        kvps__reply_error(s, id, h, KVPS_ERR_PEER_LOST, "a worker is lost (worker %d): the barrier cannot complete",
                          kvps__first_lost(s));
        return;
    }
    int fin = kvps__needs_finished(s, NULL, s->barrier_gen[h->rank]);
    if (fin >= 0) {
        kvps__reply_error(s, id, h, KVPS_ERR_PEER_LOST, "worker %d has finished: barrier %llu cannot complete", fin,
                          (unsigned long long)s->barrier_gen[h->rank] + 1);
        return;
    }
    kvps__parked *p = (kvps__parked *)calloc(1, sizeof *p);
    if (!p) { kvps__reply_error(s, id, h, KVPS_ERR_NOMEM, "no memory for a barrier"); return; }
    zmq_msg_init(&p->id);
    zmq_msg_copy(&p->id, id);
    p->hdr = *h;
    p->hdr.aux = (uint32_t)s->barrier_gen[h->rank]++;
    p->val = x;
    p->sop = sop;
    p->since = kvps__now_ms();
    p->next = s->barrier_waiters;
    s->barrier_waiters = p;
    kvps__barrier_check(s, p->hdr.aux);
}

/* The ALLREDUCE result of barrier generation gen, its entries taken in rank order (the same bits
   whatever order they came in): 0, or -1 with why when its entries do not agree on the call. */
static int kvps__scalar_result(const kvps_server *s, uint64_t gen, double *out, char *why, size_t n) {
    const kvps__parked *first = NULL;
    int count = 0;
    double acc = 0;
    for (int r = 0; r < s->m; r++)
        for (const kvps__parked *p = s->barrier_waiters; p; p = p->next) {
            if (p->hdr.aux != gen || p->hdr.rank != (uint32_t)r) continue;
            if (!first) first = p;
            if (p->hdr.op != first->hdr.op || p->sop != first->sop) {
                int a = first->hdr.op == KVPS__OP_ALLREDUCE, b = p->hdr.op == KVPS__OP_ALLREDUCE;
                snprintf(why, n, "barrier %llu: worker %u called %s %s, worker %u %s %s", (unsigned long long)gen + 1,
                         first->hdr.rank, a ? "allreduce_scalar" : "barrier", a ? kvps_scalar_op_name((kvps_scalar_op)first->sop) : "",
                         p->hdr.rank, b ? "allreduce_scalar" : "barrier", b ? kvps_scalar_op_name((kvps_scalar_op)p->sop) : "");
                return -1;
            }
            double v = p->val;
            acc = count == 0 ? v : p->sop == KVPS_SCALAR_MIN ? (v < acc || v != v ? v : acc)
                                 : p->sop == KVPS_SCALAR_MAX ? (v > acc || v != v ? v : acc) : acc + v;
            count++;
        }
    *out = first && first->sop == KVPS_SCALAR_MEAN ? acc / count : acc;
    return 0;
}

/* Releases barrier generation gen once every rank still in has entered it; an ALLREDUCE's
   entries are answered with their result (over the workers in: MEAN divides by their number). */
static void kvps__barrier_check(kvps_server *s, uint64_t gen) {
    for (int r = 0; r < s->m; r++)
        if (!s->out[r] && s->barrier_gen[r] <= gen) return;
    double x = 0;
    char why[200];
    int bad = kvps__scalar_result(s, gen, &x, why, sizeof why);
    kvps__parked **pp = &s->barrier_waiters;
    while (*pp) {
        kvps__parked *w = *pp;
        if (w->hdr.aux != gen) { pp = &w->next; continue; }
        *pp = w->next;
        if (bad) {
            kvps__reply_error(s, &w->id, &w->hdr, KVPS_ERR_MISMATCH, "%s", why);
        } else if (w->hdr.op == KVPS__OP_ALLREDUCE) {
            s->ar_last[w->hdr.rank] = x;
            kvps__reply_scalar(s, &w->id, &w->hdr, x);
        } else {
            kvps__hdr rh = kvps__reply_hdr(&w->hdr, KVPS_OK);
            zmq_msg_t f[2];
            kvps__reply_start(f, &w->id, 1, &rh);
            kvps__server_send(s, f, 2);
        }
        kvps__parked_free(w);
    }
}

static int kvps__in_barrier(const kvps_server *s, uint32_t rank) {
    for (const kvps__parked *p = s->barrier_waiters; p; p = p->next)
        if (p->hdr.rank == rank) return 1;
    return 0;
}

/* An async, uncoded push of one key of at least KVPS__DEFER_MIN_LEN floats whose rule is a
   per-element formula (not Adam, whose bias correction is per call, nor an update_fn): those are
   deferred, so that pushes already queued for the key are applied together. */
static int kvps__deferrable(const kvps_server *s, const kvps__hdr *h, const uint32_t *idx, int coded) {
    if (h->op != KVPS__OP_PUSH || h->nkeys != 1 || coded || s->desc.consistency != KVPS_ASYNC || idx[0] == UINT32_MAX)
        return 0;
    const kvps__key *k = s->keys[idx[0]];
    if (k->opt.rule == KVPS_RULE_DEFAULT && s->update_fn) return 0;
    return k->len >= KVPS__DEFER_MIN_LEN && kvps__rule_row_of(kvps__rule_in_force(s, k->opt.rule))->deferrable;
}

/* Applies a key's deferred pushes in arrival order, in one pass over the value, chunk by chunk:
   each element goes through the same float operations in the same order as one push at a time,
   so the bits are the same; then answers them. */
static void kvps__flush(kvps_server *s, kvps__key *k) {
    uint32_t n = k->ndef;
    if (!n) return;
    k->ndef = 0;
    const kvps_optim *o = kvps__optim_in_force(s, k);
    int nstate = kvps__rule_row_of(o->rule)->state, ok = kvps__value_writable(k) == 0; /* (built-in: deferrable) */
    if (ok && nstate && !k->state) {
        k->state = (float *)calloc((size_t)k->len * (size_t)nstate, sizeof(float));
        ok = k->state != NULL;
    }
    size_t len = (size_t)k->len;
    for (size_t off = 0; ok && off < len; off += KVPS__CHUNK) {
        size_t c = len - off < (size_t)KVPS__CHUNK ? len - off : (size_t)KVPS__CHUNK;
        for (uint32_t j = 0; j < n; j++)
            kvps__rule_math(o, k->value + off, (const float *)zmq_msg_data(&k->def[j].data) + off, 1.0f,
                            k->state ? k->state + off : NULL, NULL, &k->b1t, &k->b2t, 0, c);
    }
    if (ok) {
        if (n > 1) KVPS__STAT_ADD(s, fused, n);
        k->step += n;
        k->round += n;
        if (k->round > s->max_round) s->max_round = k->round;
        KVPS__STAT_ADD(s, rounds, n);
        if (s->tl) kvps__tl_async(s, k, n);
    }
    for (uint32_t j = 0; j < n; j++) {
        zmq_msg_close(&k->def[j].data);
        zmq_msg_init(&k->def[j].data);
        if (ok) kvps__reply_ack(s, &k->def[j].id, &k->def[j].hdr);
        else kvps__reply_error(s, &k->def[j].id, &k->def[j].hdr, KVPS_ERR_NOMEM, "update");
        kvps__defer_close(&k->def[j]);
    }
    if (k->waiters) kvps__wake(s, k);
}

static void kvps__flush_all(kvps_server *s) {
    for (uint32_t i = 0; i < s->ndirty; i++) kvps__flush(s, s->dirty[i]);
    s->ndirty = 0;
}

/* Holds a push back (its message moves here); a full queue is applied at once. */
static void kvps__defer_push(kvps_server *s, kvps__key *k, zmq_msg_t *id, const kvps__hdr *h, zmq_msg_t *data) {
    if (!k->def && !(k->def = (kvps__defer *)malloc(KVPS__DEFER_MAX * sizeof *k->def))) {
        kvps__reply_error(s, id, h, KVPS_ERR_NOMEM, "update");
        return;
    }
    if (k->ndef == 0) {
        if (s->ndirty == s->cap_dirty) {
            uint32_t nc = s->cap_dirty ? 2 * s->cap_dirty : 16;
            kvps__key **nd = (kvps__key **)realloc(s->dirty, nc * sizeof *nd);
            if (!nd) { kvps__reply_error(s, id, h, KVPS_ERR_NOMEM, "update"); return; }
            s->dirty = nd;
            s->cap_dirty = nc;
        }
        s->dirty[s->ndirty++] = k;
    }
    kvps__defer *d = &k->def[k->ndef++];
    zmq_msg_init(&d->data);
    zmq_msg_move(&d->data, data);
    zmq_msg_init(&d->id);
    zmq_msg_copy(&d->id, id);
    d->hdr = *h;
    if (k->ndef == KVPS__DEFER_MAX) kvps__flush(s, k); /* stays on the dirty list: flushing twice is harmless */
}

// >>liveness
/* Answers every waiting pull and barrier with KVPS_ERR_PEER_LOST (worker `rank` is lost). */
/* Rank r leaves the aggregation: lost under .elastic (how KVPS__OUT_LEFT: its buffered pushes
   go), or joined (KVPS__OUT_JOINED, kvps_worker_join: what it pushed before counts); rounds and
   barriers that only waited for it complete (means over the contributions they have). */
static void kvps__leave(kvps_server *s, int r, int how) {
    s->out[r] = (uint8_t)how;
    for (uint32_t i = 0; i < s->nkeys; i++) {
        kvps__key *k = s->keys[i];
        while (how == KVPS__OUT_LEFT && k->qhead && k->qhead[r]) { kvps__pend *p = k->qhead[r]; k->qhead[r] = p->next; free(p); }
        if (k->qtail && how == KVPS__OUT_LEFT) k->qtail[r] = NULL;
        if (s->desc.consistency != KVPS_ASYNC && kvps__bsp_advance(s, k) > 0 && k->waiters) kvps__wake(s, k);
    }
    uint64_t lo = UINT64_MAX;
    for (const kvps__parked *p = s->barrier_waiters; p; p = p->next)
        if (p->hdr.aux < lo) lo = p->hdr.aux;
    if (lo != UINT64_MAX) kvps__barrier_check(s, lo);
}

/* Elastic: rank r is back (or replaced): it joins from the next round it has not missed. */
static void kvps__rejoin(kvps_server *s, int r) {
    s->out[r] = 0;
    for (uint32_t i = 0; i < s->nkeys; i++) {
        kvps__key *k = s->keys[i];
        k->recv[r] = k->round + (k->summed > (uint32_t)r ? 1 : 0);
    }
    uint64_t g = UINT64_MAX;
    for (int q = 0; q < s->m; q++)
        if (!s->out[q] && q != r && s->barrier_gen[q] < g) g = s->barrier_gen[q];
    s->barrier_gen[r] = g == UINT64_MAX ? 0 : g;
    kvps__log(KVPS_LOG_WARN, "server %d: worker %d joins again", s->desc.rank, r);
}

static void kvps__fail_waiters(kvps_server *s, int rank) {
    char text[160];
    snprintf(text, sizeof text, "worker %d lost (no connection for %d ms): the round cannot complete", rank,
             s->desc.peer_timeout_ms);
    kvps__repl_fail(s, NULL, text); /* REPLICAS under BSP: pushes waiting for their rounds */
    kvps__parked *all = s->barrier_waiters;
    s->barrier_waiters = NULL;
    for (uint32_t i = 0; i < s->nkeys; i++) {
        kvps__parked *w = s->keys[i]->waiters;
        s->keys[i]->waiters = NULL;
        while (w) { kvps__parked *n = w->next; w->next = all; all = w; w = n; }
    }
    while (all) {
        kvps__parked *n = all->next;
        /* a barrier's entry is taken back (and reply_error takes it out of the re-send window),
           so that the worker's re-send, or its next barrier, enters this same generation */
        if (all->hdr.op == KVPS__OP_BARRIER || all->hdr.op == KVPS__OP_ALLREDUCE) s->barrier_gen[all->hdr.rank]--;
        kvps__reply_error(s, &all->id, &all->hdr, KVPS_ERR_PEER_LOST, "%s", text);
        kvps__parked_free(all);
        all = n;
    }
}

/* Connection drops (from the monitor) start a worker's clock. */
static void kvps__liveness_events(kvps_server *s) {
    uint16_t ev = 0;
    int32_t fd = -1;
    while (s->mon && kvps__monitor_event(s->mon, &ev, &fd)) {
        if (ev != ZMQ_EVENT_DISCONNECTED) continue;
        kvps__repl_disconnected(s, fd);
        for (int r = 0; r < s->m; r++) {
            if (s->rank_fd[r] != fd) continue;
            s->rank_fd[r] = -1;
            if (s->done[r] || s->gone_since[r] || s->lost[r]) continue; /* a finished worker's drop is no loss */
            s->gone_since[r] = kvps__now_ms();
            kvps__log(KVPS_LOG_INFO, "server %d: worker %d disconnected", s->desc.rank, r);
        }
    }
}

/* A worker gone for peer_timeout_ms is lost. */
static void kvps__liveness(kvps_server *s) {
    kvps__liveness_events(s);
    int64_t now = kvps__now_ms();
    for (int r = 0; r < s->m; r++)
        if (s->gone_since[r] && !s->lost[r] && now - s->gone_since[r] >= s->desc.peer_timeout_ms) {
            kvps__repl_worker_lost(s, r); /* the backups do the same */
            kvps__worker_lost(s, r);
        }
}

/* Worker r is lost: what that changes (a backup does it when its primary says so). */
static void kvps__worker_lost(kvps_server *s, int r) {
    s->lost[r] = 1;
    int joined = s->out[r] == KVPS__OUT_JOINED; /* (out of the aggregation already: its loss stops nothing) */
    if (!s->desc.elastic && !joined) s->nlost++; /* elastic: not an error, the job goes on without it */
    KVPS__STAT_ADD(s, peers_lost, 1);
    kvps__log(s->replaying ? KVPS_LOG_INFO : KVPS_LOG_WARN, "server %d: worker %d lost: no connection for %d ms%s%s",
              s->desc.rank, r, s->desc.peer_timeout_ms, s->desc.elastic ? "; it leaves the aggregation" : "",
              s->replaying ? " (as the primary says)" : "");
    if (joined) return;
    if (s->desc.elastic) kvps__leave(s, r, KVPS__OUT_LEFT);
    else kvps__fail_waiters(s, r);
}

static int kvps__liveness_pending(const kvps_server *s) {
    for (int r = 0; r < s->m; r++)
        if (s->gone_since[r] && !s->lost[r]) return 1;
    return 0;
}

/* The job has ended with workers lost (FAULTS): every worker has finished or is lost, and one
   is lost (all finished is CLEAN FINISH's). Until then a lost worker may come back and nothing
   changes. */
static int kvps__job_lost(const kvps_server *s) {
    int lost = 0;
    for (int r = 0; r < s->m; r++) {
        if (!s->done[r] && !s->lost[r]) return 0;
        lost |= s->lost[r];
    }
    return lost;
}

/* Serving loop: ends it (finish 2) once the job has ended with workers lost; under .elastic,
   where a lost worker may join again, peer_timeout_ms after that, unless one has come back by
   then. A backup does the same from what its primary sends (goodbyes, LOST). */
static void kvps__job_end(kvps_server *s) {
    if (s->desc.keep_serving || s->finish) return;
    if (!kvps__job_lost(s)) { s->end_at = 0; return; } /* (a lost worker came back: the wait starts again) */
    int64_t now = kvps__now_ms();
    if (!s->end_at) {
        s->end_at = now + (s->desc.elastic ? s->desc.peer_timeout_ms : 0);
        if (s->desc.elastic)
            kvps__log(KVPS_LOG_INFO, "server %d: every worker has finished or is lost; stopping in %d ms unless a lost one "
                      "comes back", s->desc.rank, s->desc.peer_timeout_ms);
    }
    if (now >= s->end_at) s->finish = 2;
}

/* The workers r with flag[r] set, as "1, 3-5, 9" ("..." at the end when the rest does not fit);
   "none" when there are none. */
static const char *kvps__ranks_text(const kvps_server *s, const uint8_t *flag, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int r = 0; r < s->m; r++) {
        if (!flag[r]) continue;
        int e = r;
        while (e + 1 < s->m && flag[e + 1]) e++;
        int w = e > r ? snprintf(buf + used, n - used, "%s%d-%d", used ? ", " : "", r, e)
                      : snprintf(buf + used, n - used, "%s%d", used ? ", " : "", r);
        if (w < 0 || (size_t)w >= n - used) {
            if (n > 4) snprintf(buf + (used + 4 < n ? used : n - 4), 4, "...");
            return buf;
        }
        used += (size_t)w;
        r = e;
    }
    if (!used) snprintf(buf, n, "none");
    return buf;
}

// >>tables
/* Sparse tables: rows under any id, created on first touch, updated row by row. */
enum { KVPS__SLAB = 1 << 16 }; /* rows per slab */
typedef struct kvps__table {
    uint64_t id;
    uint32_t dim, sdim;  /* sdim: state floats per row */
    kvps_optim opt;
    float init_scale;
    uint64_t seed;
    uint64_t *hk;        /* open addressing: id -> row + 1, load <= 0.7 */
    uint32_t *hv;
    uint64_t hcap, nrows;
    float **slab, **sslab;
    uint32_t nslab;
    struct kvps__table *next;
} kvps__table;

static void kvps__table_free(kvps__table *t) {
    for (uint32_t i = 0; i < t->nslab; i++) { free(t->slab[i]); if (t->sslab) free(t->sslab[i]); }
    free(t->slab); free(t->sslab); free(t->hk); free(t->hv); free(t);
}

static kvps__table *kvps__table_find(kvps__table *list, uint64_t id) {
    for (; list; list = list->next)
        if (list->id == id) return list;
    return NULL;
}

/* The virtual shard of a table's row (RESHARD): the worker sends the row to that shard's server,
   a reshard moves it with its shard. */
static uint32_t kvps__row_vshard(uint64_t table, uint64_t id, uint32_t V) {
    return (uint32_t)(kvps__mix64(id ^ kvps__mix64(table)) % V);
}

/* The row index of id, or UINT64_MAX when the table has no such row. */
static uint64_t kvps__table_lookup(const kvps__table *t, uint64_t id) {
    if (!t->hcap) return UINT64_MAX;
    for (uint64_t j = kvps__mix64(id) & (t->hcap - 1); t->hv[j]; j = (j + 1) & (t->hcap - 1))
        if (t->hk[j] == id) return t->hv[j] - 1;
    return UINT64_MAX;
}

static float *kvps__row(const kvps__table *t, uint64_t r) { return t->slab[r >> 16] + (size_t)(r & 0xffff) * t->dim; }
static float *kvps__row_state(const kvps__table *t, uint64_t r) {
    return t->sslab ? t->sslab[r >> 16] + (size_t)(r & 0xffff) * t->sdim : NULL;
}

/* The initial value of a row: a function of (seed, id, j) only, so it is the same on any server. */
static void kvps__row_init(const kvps__table *t, uint64_t id, float *v) {
    for (uint32_t j = 0; j < t->dim; j++) {
        if (t->init_scale == 0.0f) { v[j] = 0.0f; continue; }
        uint64_t h = kvps__mix64(t->seed ^ kvps__mix64(id ^ ((uint64_t)j << 48)));
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        v[j] = t->init_scale * (2.0f * u - 1.0f);
    }
}

static int kvps__tbl_grow(kvps_server *s, kvps__table *t) {
    uint64_t nc = t->hcap ? t->hcap * 2 : 1024;
    uint64_t *hk = (uint64_t *)malloc(nc * sizeof *hk);
    uint32_t *hv = (uint32_t *)calloc(nc, sizeof *hv);
    if (!hk || !hv) { free(hk); free(hv); return -1; }
    for (uint64_t i = 0; i < t->hcap; i++) {
        if (!t->hv[i]) continue;
        uint64_t j = kvps__mix64(t->hk[i]) & (nc - 1);
        while (hv[j]) j = (j + 1) & (nc - 1);
        hk[j] = t->hk[i];
        hv[j] = t->hv[i];
    }
    KVPS__STAT_ADD(s, table_bytes, (nc - t->hcap) * (sizeof *hk + sizeof *hv));
    free(t->hk);
    free(t->hv);
    t->hk = hk;
    t->hv = hv;
    t->hcap = nc;
    return 0;
}

/* The row index of id, created (initialised) when absent; UINT64_MAX when out of memory. */
static uint64_t kvps__table_row(kvps_server *s, kvps__table *t, uint64_t id) {
    if (t->hcap) {
        uint64_t j = kvps__mix64(id) & (t->hcap - 1);
        for (; t->hv[j]; j = (j + 1) & (t->hcap - 1))
            if (t->hk[j] == id) return t->hv[j] - 1;
    }
    if (t->nrows >= UINT32_MAX - 1) return UINT64_MAX;
    if ((t->nrows + 1) * 10 > t->hcap * 7 && kvps__tbl_grow(s, t) != 0) return UINT64_MAX;
    uint64_t r = t->nrows;
    if ((r >> 16) >= t->nslab) { /* a new slab: calloc'd, so untouched rows cost no memory */
        float **ns = (float **)realloc(t->slab, (t->nslab + 1) * sizeof *ns);
        if (!ns) return UINT64_MAX;
        t->slab = ns;
        if (!(ns[t->nslab] = (float *)calloc((size_t)KVPS__SLAB * t->dim, sizeof(float)))) return UINT64_MAX;
        if (t->sdim) {
            float **nss = (float **)realloc(t->sslab, (t->nslab + 1) * sizeof *nss);
            if (!nss) { free(ns[t->nslab]); return UINT64_MAX; }
            t->sslab = nss;
            if (!(nss[t->nslab] = (float *)calloc((size_t)KVPS__SLAB * t->sdim, sizeof(float)))) { free(ns[t->nslab]); return UINT64_MAX; }
        }
        t->nslab++;
    }
    kvps__row_init(t, id, kvps__row(t, r));
    float *st = kvps__row_state(t, r);
    for (uint32_t j = t->sdim - kvps__rules[t->opt.rule].scalars; st && j < t->sdim; j++) st[j] = 1.0f;
    uint64_t j = kvps__mix64(id) & (t->hcap - 1);
    while (t->hv[j]) j = (j + 1) & (t->hcap - 1);
    t->hk[j] = id;
    t->hv[j] = (uint32_t)(r + 1);
    t->nrows++;
    KVPS__STAT_ADD(s, table_rows, 1);
    KVPS__STAT_ADD(s, table_bytes, t->dim * sizeof(float));
    KVPS__STAT_ADD(s, table_state_bytes, t->sdim * sizeof(float));
    return r;
}

// >>dispatch
/* The request path: kvps__handle parses a request (changing nothing), notes that its worker is
   alive, drops a re-send of something already applied, and hands it to its op's handler. The
   table of ops says what each op allows; each check refuses through kvps__refuse, which
   answers the error and leaves no state changed. */
typedef struct kvps__rq { /* one request being served */
    zmq_msg_t *id, *fr;       /* routing id (fr[0]); frames: [id][meta][values?] */
    int nfr;
    kvps__hdr h;
    int has_hdr;              /* h was read */
    const struct kvps__op_spec *op;
    const unsigned char *ents; /* meta after the header: nkeys x kvps__kent */
    size_t msz;               /* meta frame bytes */
    uint32_t *idx;            /* keyed ops: key indices (UINT32_MAX: new) */
    uint32_t nnew;
    uint64_t total;           /* floats of all keys */
    int coded, defer;
} kvps__rq;

/* What an op is (a row of KVPS__OPS in >>wire; 0 is the default of every field). */
typedef enum kvps__chain { /* what the primary of a chain of replicas does with the request */
    KVPS__CHAIN_FWD = 0,   /* sends it down the chain first: the backups serve it in the same order */
    KVPS__CHAIN_LOCAL,     /* serves it alone (it reads, or is not a request) */
    KVPS__CHAIN_ROUNDS     /* as FWD, but where BSP rounds replicate (s->rmode) their sums go instead */
} kvps__chain;
typedef enum kvps__dup { /* what a re-send of a request applied before gets (kvps__fresh) */
    KVPS__DUP_ACK = 0,          /* an ack */
    KVPS__DUP_UNLESS_PENDING,   /* an ack, unless its answer waits for its rounds to replicate */
    KVPS__DUP_AS_PULL,          /* served as its pull (the push is ignored) */
    KVPS__DUP_UNLESS_OPEN       /* an ack, unless its barrier is still open (answered when it completes) */
} kvps__dup;
typedef struct kvps__op_spec {
    const char *name;
    void (*serve)(kvps_server *s, kvps__rq *q); /* the handler (the row's 4th column) */
    uint8_t values;    /* a values frame follows the meta frame */
    uint8_t coded;     /* the values may be codec blobs (KVPS__FLAG_CODED) */
    uint8_t pulls;     /* answered with the keys' values, which may be coded (KVPS__FLAG_CODED_REPLY) */
    uint8_t mutates;   /* changes state: the exactly-once window sees it */
    uint8_t kept;      /* the worker keeps it, answered, until the server's next checkpoint (a restore
                          sends it again) */
    uint8_t chain;     /* kvps__chain */
    uint8_t backup;    /* a backup replica serves it as it is (not taking over) */
    uint8_t hello;     /* opens a session: always looked at, served before the worker counts as alive */
    uint8_t placed;    /* keyed: refused until the worker took this server's placement */
    uint8_t unordered; /* may overtake what a restored server waits for behind a worker's hello */
    uint8_t dup;       /* kvps__dup */
} kvps__op_spec;

/* The handlers, declared from the table (a handler of several ops is declared once for each). */
#define KVPS__OP_SERVE_DECL(op, num, name, serve, ...) static void serve(kvps_server *s, kvps__rq *q);
KVPS__OPS(KVPS__OP_SERVE_DECL)
#undef KVPS__OP_SERVE_DECL

/* The ops by number (KVPS__OPS); row 0 is no op, every field 0. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers" /* (C++: a row names only its own fields) */
#endif
static const kvps__op_spec kvps__ops[] = {
    {"none", NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
#define KVPS__OP_ROW(op, num, name_, serve_, ...) {.name = name_, .serve = serve_, __VA_ARGS__},
    KVPS__OPS(KVPS__OP_ROW)
#undef KVPS__OP_ROW
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
typedef char kvps__ops_check[sizeof kvps__ops / sizeof kvps__ops[0] == KVPS__OP_COUNT ? 1 : -1]; /* a row per op */
/* The row of op, any number (out of range: row 0, which is nothing). */
static const kvps__op_spec *kvps__op(unsigned op) { return &kvps__ops[op < KVPS__OP_COUNT ? op : 0]; }
static int kvps__op_has_values(int op) { return kvps__op((unsigned)op)->values; }
static int kvps__op_pulls(int op) { return kvps__op((unsigned)op)->pulls; }

/* Answers the request with an error (see kvps__reply_error); returns 0, so a check can end with
   `return kvps__refuse(...)`. */
static int kvps__refuse(kvps_server *s, const kvps__rq *q, kvps_result rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kvps__reply_errorv(s, q->id, q->has_hdr ? &q->h : NULL, rc, fmt, ap);
    va_end(ap);
    return 0;
}

/* REPL's "handler": never called (kvps__parse refuses the op first), as no worker may send it. */
static void kvps__serve_not_request(kvps_server *s, kvps__rq *q) {
    kvps__refuse(s, q, KVPS_ERR_OP, "op %u (%s) is not a request", q->h.op, q->op->name);
}

/* The header and what the op allows, read from the message alone; 0 when refused. */
static int kvps__parse(kvps_server *s, kvps__rq *q) {
    size_t msz = q->msz = zmq_msg_size(&q->fr[1]);
    if (msz < KVPS__HDR) return kvps__refuse(s, q, KVPS_ERR_TRUNCATED, "meta frame of %zu bytes, header needs %d", msz, KVPS__HDR);
    memcpy(&q->h, zmq_msg_data(&q->fr[1]), sizeof q->h);
    q->ents = (const unsigned char *)zmq_msg_data(&q->fr[1]) + KVPS__HDR;
    const kvps__hdr *h = &q->h;
    if (h->magic != KVPS__MAGIC) return kvps__refuse(s, q, KVPS_ERR_MAGIC, "magic 0x%08x", h->magic);
    q->has_hdr = 1;
    if (h->version != KVPS__VERSION)
        return kvps__refuse(s, q, KVPS_ERR_VERSION, "version %u, this server speaks %d", h->version, KVPS__VERSION);
    if (h->op < KVPS__OP_PUSH || h->op >= KVPS__OP_COUNT) return kvps__refuse(s, q, KVPS_ERR_OP, "op %u", h->op);
    q->op = &kvps__ops[h->op];
    if (q->op->serve == kvps__serve_not_request) /* (REPL: only between replicas, never inside a request; a backup replaying saw one) */
        return kvps__refuse(s, q, KVPS_ERR_OP, "op %u (%s) is not a request", h->op, q->op->name);
    if ((h->flags & ~(KVPS__FLAG_CODED | KVPS__FLAG_CODED_REPLY)) || ((h->flags & KVPS__FLAG_CODED) && !q->op->coded) ||
        ((h->flags & KVPS__FLAG_CODED_REPLY) && !q->op->pulls))
        return kvps__refuse(s, q, KVPS_ERR_MALFORMED, "flags 0x%x not valid for op %u", h->flags, h->op);
    kvps_codec tmp;
    if ((h->flags & KVPS__FLAG_CODED_REPLY) &&
        (!kvps__server_codec(s, (int)h->aux, &tmp) || (kvps__codec_info((int)h->aux) && !kvps__codec_info((int)h->aux)->dense)))
        return kvps__refuse(s, q, KVPS_ERR_CODEC, "pull codec %u is unknown or not a dense codec", h->aux);
    if (h->rank >= (uint32_t)s->m)
        return kvps__refuse(s, q, KVPS_ERR_RANK, "worker rank %u, but server %d (%s) was told num_workers = %d", h->rank,
                            s->desc.rank, s->endpoint, s->m);
    q->coded = (h->flags & KVPS__FLAG_CODED) != 0;
    return 1;
}

/* Liveness: the worker spoke, from this connection. */
static void kvps__heard_from(kvps_server *s, kvps__rq *q) {
    uint32_t r = q->h.rank;
    s->heard[r] = 1;
    if (s->done[r] && q->h.op != KVPS__OP_BYE) { /* it speaks again (or its restart does): not finished */
        s->done[r] = 0;
        s->ndone--;
    }
    int fd = s->replaying ? -1 : zmq_msg_get(&q->fr[1], ZMQ_SRCFD); /* -1 on inproc (and for the primary's copies) */
    if (fd >= 0 && s->rank_fd[r] != fd) {
        /* a new connection: first take in the drops already reported, one of which may be of an
           earlier connection that had this same fd number */
        kvps__liveness_events(s);
        s->rank_fd[r] = fd;
    }
    if (s->gone_since[r] || s->lost[r] || s->out[r]) {
        if (s->out[r] == KVPS__OUT_LEFT) kvps__rejoin(s, (int)r); /* (a joined worker stays out) */
        else if (s->lost[r]) {
            s->nlost--;
            kvps__log(KVPS_LOG_WARN, "server %d: worker %u is back", s->desc.rank, r);
        }
        s->gone_since[r] = 0;
        s->lost[r] = 0;
    }
}

/* Exactly-once: 0 when the request was applied before (answered here, or when the barrier it
   re-sends completes) or is too old to tell; a re-sent pushpull goes on as its pull. */
static int kvps__fresh(kvps_server *s, kvps__rq *q) {
    kvps__hdr *h = &q->h;
    if (h->status == 0 || !q->op->mutates) return 1; /* untracked (a raw client), or changes nothing */
    int fresh = kvps__seen_check(&s->seen[h->rank], (uint32_t)h->status, h->req_id >> 24);
    if (fresh < 0)
        return kvps__refuse(s, q, KVPS_ERR_REPLAY, "request %llu of rank %u re-sent after %llu newer ones",
                            (unsigned long long)(h->req_id >> 24), h->rank, (unsigned long long)KVPS__SEEN_WIN);
    if (fresh) return 1;
    KVPS__STAT_ADD(s, duplicates, 1);
    switch ((kvps__dup)q->op->dup) {
    case KVPS__DUP_UNLESS_PENDING:
        if (kvps__repl_resent(s, h, q->id)) return 0; /* answered when its rounds are replicated */
        kvps__reply_ack(s, q->id, h);
        return 0;
    case KVPS__DUP_UNLESS_OPEN: /* (a barrier still open answers the same routing id when it completes) */
        if (kvps__in_barrier(s, h->rank)) return 0;
        if (h->op == KVPS__OP_ALLREDUCE) kvps__reply_scalar(s, q->id, h, s->ar_last[h->rank]);
        else kvps__reply_ack(s, q->id, h);
        return 0;
    case KVPS__DUP_ACK:
        kvps__reply_ack(s, q->id, h);
        return 0;
    case KVPS__DUP_AS_PULL:
        break;
    }
    h->op = KVPS__OP_PULL; /* still owed its pull: serve that, ignore the values */
    h->flags &= (uint16_t)~KVPS__FLAG_CODED;
    q->op = &kvps__ops[KVPS__OP_PULL];
    q->coded = 0;
    q->nfr = 2;
    return 1;
}

/* ONLY THE JOB TALKS TO THE JOB (SECURITY). A message from a connection (tcp://, ipc://; inproc://
   is this process) is served only when it comes from a worker whose hello this server accepted
   and speaks for that worker, or, for REPL, from the connection a replica of this shard's chain
   proved itself on (its REPL hello). A worker's routing id names it ("kvps" or, from its read-
   replica socket, "kvpr"; u32 incarnation, u32 rank, u32 server: kvps__worker_dealer): its rank
   must be the header's (and its incarnation the header's, where the header carries one), and
   that incarnation the one whose hello was accepted
   here (or, on a server restored from a checkpoint, the one its re-send window records). A
   hello is always looked at (kvps__hello_ok checks the job token). Refusals are answered
   (KVPS_ERR_AUTH), counted (stats.strangers) and logged once per connection, with its address. */
static void kvps__stranger(kvps_server *s, zmq_msg_t *fr, const kvps__hdr *h0, int fd, const char *why) {
    KVPS__STAT_ADD(s, strangers, 1);
    uint64_t key = kvps__fnv(kvps__fnv(KVPS__FNV_BASIS, &fd, sizeof fd), zmq_msg_data(&fr[0]), zmq_msg_size(&fr[0]));
    unsigned i, n = s->nstranger_logged < 16 ? s->nstranger_logged : 16;
    for (i = 0; i < n && s->stranger_logged[i] != key; i++) {}
    const char *addr = zmq_msg_gets(&fr[1], "Peer-Address");
    char text[512];
    snprintf(text, sizeof text, "server %d (%s) refuses %s (op %u, worker %u) from %s: %s", s->desc.rank, s->endpoint,
             h0->op && h0->op < KVPS__OP_COUNT ? kvps__op(h0->op)->name : "an op", h0->op, h0->rank,
             addr && *addr ? addr : "a local connection", why);
    if (i == n) {
        s->stranger_logged[s->nstranger_logged++ % 16] = key;
        kvps__log(KVPS_LOG_WARN, "%s (logged once for this connection)", text);
    }
    KVPS__STAT_ADD(s, errors, 1);
    if (h0->op == KVPS__OP_REPL) {
        kvps__repl_answer(s, &fr[0], h0->req_id, KVPS_ERR_AUTH, text);
        return;
    }
    /* answered here, not by kvps__reply_error: nothing of the worker it names (its re-send
       window) is touched, and a backup answers too */
    kvps__hdr rh = kvps__reply_hdr(h0, KVPS_ERR_AUTH);
    zmq_msg_t f[3];
    kvps__reply_start(f, &fr[0], 0, &rh);
    kvps__msg_from_buf(&f[2], text, strlen(text));
    if (kvps__send_frames(s->router, f, 3) != 0) KVPS__STAT_ADD(s, replies_dropped, 1); /* (its queue is full) */
}

/* 1: the message may be served (see above); 0: it was refused, or it was a REPL hello. */
static int kvps__admit(kvps_server *s, zmq_msg_t *fr, int nfr, const kvps__hdr *h0) {
    int fd = zmq_msg_get(&fr[1], ZMQ_SRCFD);
    int gate = __atomic_load_n(&s->gate, __ATOMIC_RELAXED); /* (a test's thread may set it) */
    if (gate < 0 || (fd < 0 && gate == 0)) return 1;
    /* CURVE: the key the connection proved (kvps__zap_serve's User-Id; "" when it has none); NULL
       without CURVE */
    const char *uid = s->zap && fd >= 0 ? zmq_msg_gets(&fr[1], "User-Id") : NULL;
    if (s->zap && fd >= 0 && !uid) uid = "";
    int repl = kvps__repl_admit(s, fr, nfr, fd, h0, uid);
    if (repl >= 0) return repl;
    if (kvps__op(h0->op)->hello) return 1;
    uint32_t r = h0->rank, inc = 0, rid = UINT32_MAX;
    if (r < (uint32_t)s->m && h0->status && s->bad_inc[r] == (uint32_t)h0->status) return 1; /* refused in its hello's words */
    const unsigned char *id = (const unsigned char *)zmq_msg_data(&fr[0]);
    if (zmq_msg_size(&fr[0]) == 16 && id[0] == 'k' && id[1] == 'v' && id[2] == 'p' && (id[3] == 's' || id[3] == 'r')) {
        memcpy(&inc, id + 4, 4);
        memcpy(&rid, id + 8, 4);
    }
    int named = r < (uint32_t)s->m && rid == r && inc && (!h0->status || inc == (uint32_t)h0->status); /* (status 0: untracked) */
    if (named && s->rejoin[r] && !kvps__op(h0->op)->unordered) {
        /* restored: what worker r sends before its hello on its new connection is dropped, unanswered. It
           was sent before the worker saw the connection come back (queued while the server was down, or
           in the moment before) and the worker sends it again behind that hello, in order with what it
           sends again from before the restore: so the restored shard takes every worker's requests in the
           order they were made (a push that overtook an older one would be summed into the wrong round) */
        if (s->rejoin[r] == 1)
            kvps__log(KVPS_LOG_INFO, "server %d: restored: worker %u's requests wait for its hello (it sends them again)",
                      s->desc.rank, r);
        s->rejoin[r] = 2;
        return 0;
    }
    if (named && (s->live_inc[r] == inc || (!s->live_inc[r] && s->seen[r].inc == inc))) return 1;
    if (named && kvps__repl_declines(s)) return 1; /* a backup that serves nothing: kvps__repl_inbound answers NOT_PRIMARY */
    kvps__stranger(s, fr, h0, fd, named
                                      ? "that worker has not said hello to this server (a process of another job, or "
                                        "this server restarted without its checkpoint)"
                                      : "the connection is not one of a worker that said hello here, or speaks for "
                                        "another worker");
    return 0;
}

/* One request, whole: [id][meta][values?]. */
static void kvps__handle_one(kvps_server *s, zmq_msg_t *fr, int nfr) {
    kvps__rq q;
    memset(&q, 0, sizeof q);
    q.id = &fr[0];
    q.fr = fr;
    q.nfr = nfr;
    if (nfr < 2) {
        KVPS__STAT_ADD(s, errors, 1);
        kvps__log(KVPS_LOG_WARN, "server %d: dropped a message with no meta frame", s->desc.rank);
        return;
    }
    if (zmq_msg_size(&fr[1]) >= KVPS__HDR && !s->replaying) {
        kvps__hdr h0;
        memcpy(&h0, zmq_msg_data(&fr[1]), sizeof h0);
        if (h0.magic == KVPS__MAGIC && h0.version == KVPS__VERSION && !kvps__admit(s, fr, nfr, &h0)) return;
        if (kvps__repl_inbound(s, fr, nfr, &h0)) return;
    }
    if (!kvps__parse(s, &q)) return;
    if (nfr > 3) { kvps__refuse(s, &q, KVPS_ERR_MALFORMED, "%d frames: no request has more than 2", nfr - 1); return; }
    kvps__repl_forward(s, &q, fr, nfr); /* down the chain first: the backups serve it in this same order */
    if (q.h.status && s->bad_inc[q.h.rank] == (uint32_t)q.h.status) { /* its hello was refused */
        kvps__refuse(s, &q, KVPS_ERR_CONFIG, "%s", s->bad_text[q.h.rank]);
        return;
    }
    if (q.op->hello) { /* checked before it counts as the rank's live connection */
        q.op->serve(s, &q);
        return;
    }
    if (!q.op->backup || s->role != KVPS__ROLE_BACKUP) /* (a READ at a backup: the primary keeps the liveness) */
        kvps__heard_from(s, &q);
    if (s->place_wait[q.h.rank] && q.op->placed) {
        char pt[200];
        kvps__refuse(s, &q, KVPS_ERR_MISMATCH, "worker %u sent %s before it took this server's placement (%s; its keys "
                     "were placed by reshards): a worker waits for its first hello's answer before its first keyed "
                     "request, up to its timeout_ms; was a server slower than that to start?", q.h.rank, q.op->name,
                     kvps__place_text(&s->place, pt, sizeof pt));
        return;
    }
    if (!kvps__fresh(s, &q)) return;
    q.op->serve(s, &q);
}
static void kvps__handle(kvps_server *s, zmq_msg_t *fr, int nfr) {
    kvps__handle_one(s, fr, nfr);
    kvps__repl_after(s); /* the rounds it completed, down the chain */
}

/* Keyed ops and the barrier: the frame count and a meta frame of nkeys entries. */
static int kvps__check_frames(kvps_server *s, const kvps__rq *q) {
    int want = q->op->values ? 3 : 2;
    if (q->nfr != want)
        return kvps__refuse(s, q, q->nfr < want ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, "%d frames, op %u takes %d",
                            q->nfr - 1, q->h.op, want - 1);
    uint64_t need = (uint64_t)q->h.nkeys * KVPS__KENT;
    if ((uint64_t)(q->msz - KVPS__HDR) != need)
        return kvps__refuse(s, q, q->msz - KVPS__HDR < need ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED,
                            "meta frame of %zu bytes for %u keys", q->msz, q->h.nkeys);
    return 1;
}

static void kvps__refuse_joined(kvps_server *s, const kvps__rq *q);
/* BARRIER, and ALLREDUCE (a barrier that carries a value: f64 x, u32 kvps_scalar_op, u32 0). */
static void kvps__serve_barrier(kvps_server *s, kvps__rq *q) {
    if (!kvps__check_frames(s, q)) return;
    if (q->h.nkeys != 0) { kvps__refuse(s, q, KVPS_ERR_MALFORMED, "%s with keys", q->op->name); return; }
    if (s->desc.rank != 0) { kvps__refuse(s, q, KVPS_ERR_NOT_BARRIER, "server %d", s->desc.rank); return; }
    if (s->out[q->h.rank] == KVPS__OUT_JOINED) { kvps__refuse_joined(s, q); return; }
    double x = 0;
    uint32_t sop = 0;
    if (q->h.op == KVPS__OP_ALLREDUCE) {
        const unsigned char *v = (const unsigned char *)zmq_msg_data(&q->fr[2]);
        size_t n = zmq_msg_size(&q->fr[2]);
        if (n != 16) { kvps__refuse(s, q, n < 16 ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, "allreduce: a values frame of %zu bytes, want 16", n); return; }
        uint32_t pad;
        memcpy(&x, v, 8);
        memcpy(&sop, v + 8, 4);
        memcpy(&pad, v + 12, 4);
        if (sop >= KVPS_SCALAR_OP_COUNT || pad != 0) {
            kvps__refuse(s, q, KVPS_ERR_MALFORMED, "allreduce: op %u is not a kvps_scalar_op", sop);
            return;
        }
    }
    kvps__barrier(s, q->id, &q->h, x, sop);
}

/* A worker that has joined pushes and enters barriers no more. */
static void kvps__refuse_joined(kvps_server *s, const kvps__rq *q) {
    kvps__refuse(s, q, KVPS_ERR_STATE, "worker %u has joined (kvps_worker_join): it may pull and finish, not %s",
                 q->h.rank, q->op->name);
}

/* JOIN: worker r's data has ended. It leaves the aggregation for good, as a lost worker does under
   .elastic (kvps__leave), but what it pushed before counts: rounds and barriers complete over the
   workers in (MEAN and SGD divide by the contributions a round has); it may still pull, and
   finishes as any worker does (the job ends when every worker has: CLEAN FINISH). */
static void kvps__serve_join(kvps_server *s, kvps__rq *q) {
    if (!kvps__check_frames(s, q)) return;
    if (q->h.nkeys != 0) { kvps__refuse(s, q, KVPS_ERR_MALFORMED, "join with keys"); return; }
    uint32_t r = q->h.rank;
    if (s->out[r] != KVPS__OUT_JOINED) {
        kvps__log(KVPS_LOG_INFO, "server %d: worker %u joined (its data has ended): rounds go on without it", s->desc.rank, r);
        kvps__leave(s, (int)r, KVPS__OUT_JOINED);
    }
    kvps__reply_ack(s, q->id, &q->h);
}

static kvps__kent kvps__ent(const kvps__rq *q, uint32_t i) {
    kvps__kent e;
    memcpy(&e, q->ents + (size_t)i * KVPS__KENT, sizeof e);
    return e;
}

/* Each key's length, the total, which keys exist, and no key twice among those that do. */
static int kvps__check_keys(kvps_server *s, kvps__rq *q) {
    uint32_t n = q->h.nkeys;
    if (n == 0) return kvps__refuse(s, q, KVPS_ERR_MALFORMED, "request with no keys");
    if (s->scratch_cap < n) {
        uint32_t *ni = (uint32_t *)realloc(s->scratch_idx, (size_t)n * sizeof *ni);
        if (!ni) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "%u keys", n);
        s->scratch_idx = ni;
        s->scratch_cap = n;
    }
    q->idx = s->scratch_idx;
    uint64_t stamp = ++s->stamp;
    for (uint32_t i = 0; i < n; i++) {
        kvps__kent e = kvps__ent(q, i);
        if (e.len == 0 || e.len > s->desc.max_value_len)
            return kvps__refuse(s, q, e.len ? KVPS_ERR_TOO_LARGE : KVPS_ERR_MALFORMED, "key %llu: length %llu (limit %llu)",
                                (unsigned long long)e.key, (unsigned long long)e.len, (unsigned long long)s->desc.max_value_len);
        if (q->total > UINT64_MAX / sizeof(float) - e.len) /* max_value_len caps e.len; nkeys can still add up */
            return kvps__refuse(s, q, KVPS_ERR_TOO_LARGE, "lengths add up past 2^62 floats");
        q->total += e.len;
        q->idx[i] = kvps__find(s, e.key);
        if (q->idx[i] == UINT32_MAX) { q->nnew++; continue; }
        kvps__key *k = s->keys[q->idx[i]];
        if (k->len != e.len)
            return kvps__refuse(s, q, KVPS_ERR_LEN_MISMATCH, "key %llu: length %llu, registered %llu", (unsigned long long)e.key,
                                (unsigned long long)e.len, (unsigned long long)k->len);
        if (k->stamp == stamp) return kvps__refuse(s, q, KVPS_ERR_DUP_KEY, "key %llu", (unsigned long long)e.key);
        k->stamp = stamp;
    }
    return 1;
}

/* Coded values: every blob framed, of a known codec, and valid, before anything changes. */
static int kvps__check_blobs(kvps_server *s, kvps__rq *q) {
    kvps__blobs it = kvps__blobs_of(&q->fr[2]);
    for (uint32_t i = 0; i < q->h.nkeys; i++) {
        kvps__kent e = kvps__ent(q, i);
        const unsigned char *blob;
        uint32_t nb;
        int fit = kvps__blob_next(&it, &blob, &nb);
        if (fit < 0) return kvps__refuse(s, q, KVPS_ERR_TRUNCATED, "key %u: no blob length", i);
        if (fit == 0 || nb == 0)
            return kvps__refuse(s, q, nb ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, "key %u: blob of %u bytes", i, nb);
        kvps_codec tmp;
        const kvps_codec *cd = kvps__server_codec(s, blob[0], &tmp);
        if (!cd) return kvps__refuse(s, q, KVPS_ERR_CODEC, "key %u: codec id %u", i, blob[0]);
        kvps_result vr;
        if (cd == &tmp) {
            vr = kvps__codec_decode_builtin(cd, blob, nb, NULL, (size_t)e.len, KVPS__DEC_CHECK);
        } else { /* a user codec: decode for real to check it */
            float *d = kvps__dscratch(s, e.len);
            vr = d ? kvps_codec_decode(cd, blob, nb, d, (size_t)e.len, 0) : KVPS_ERR_NOMEM;
        }
        if (vr != KVPS_OK)
            return kvps__refuse(s, q, vr, "key %llu: bad %s blob", (unsigned long long)e.key, cd->name ? cd->name : "codec");
    }
    if (it.off != it.size) return kvps__refuse(s, q, KVPS_ERR_MALFORMED, "%zu bytes after the last blob", it.size - it.off);
    return 1;
}

/* The values frame: blobs, CONFIG records (checked whole here), or floats for every key. */
static int kvps__check_values(kvps_server *s, kvps__rq *q) {
    if (q->coded) return kvps__check_blobs(s, q);
    if (!q->op->values) return 1;
    size_t got = zmq_msg_size(&q->fr[2]);
    if (q->h.op == KVPS__OP_CONFIG) {
        size_t want = (size_t)q->h.nkeys * KVPS__OPTREC;
        if (got != want)
            return kvps__refuse(s, q, got < want ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, "config frame of %zu bytes for %u keys",
                                got, q->h.nkeys);
        const unsigned char *rec = (const unsigned char *)zmq_msg_data(&q->fr[2]);
        for (uint32_t i = 0; i < q->h.nkeys; i++) {
            kvps_optim o;
            kvps_result vr = kvps__optim_read(rec + (size_t)i * KVPS__OPTREC, &o);
            char kt[160], rt[64];
            uint32_t raw;
            memcpy(&raw, rec + (size_t)i * KVPS__OPTREC, 4);
            if (vr != KVPS_OK) {
                const char *bad = vr == KVPS_ERR_HYPERPARAM ? kvps__optim_bad_field(&o) : "rule (not a kvps_rule)";
                return kvps__refuse(s, q, vr, "%s: %s out of range: rule %u lr %g momentum %g beta1 %g beta2 %g eps %g weight_decay %g",
                                    kvps__key_text(s, kvps__ent(q, i).key, kt, sizeof kt), bad, (unsigned)raw,
                                    (double)o.lr, (double)o.momentum, (double)o.beta1, (double)o.beta2, (double)o.eps, (double)o.weight_decay);
            }
            if (kvps__rule_is_user(o.rule) && (int)o.rule - KVPS_RULE_USER >= s->nurules)
                return kvps__refuse(s, q, KVPS_ERR_INVALID_ARG, "%s names %s (rule id %u), which server %d does not have (it has %d user rules)",
                                    kvps__key_text(s, kvps__ent(q, i).key, kt, sizeof kt), kvps__rule_text(s, o.rule, rt, sizeof rt),
                                    (unsigned)o.rule, s->desc.rank, s->nurules);
        }
        return 1;
    }
    if ((uint64_t)got != q->total * sizeof(float))
        return kvps__refuse(s, q, (uint64_t)got < q->total * sizeof(float) ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED,
                            "values frame of %zu bytes, keys need %llu", got, (unsigned long long)(q->total * sizeof(float)));
    return 1;
}

/* No key twice among the keys the server has not seen yet. */
static int kvps__check_new_keys(kvps_server *s, kvps__rq *q) {
    if (q->nnew < 2) return 1;
    uint64_t *nk = (uint64_t *)malloc(q->nnew * sizeof *nk);
    if (!nk) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "%u new keys", q->nnew);
    uint32_t j = 0;
    for (uint32_t i = 0; i < q->h.nkeys; i++)
        if (q->idx[i] == UINT32_MAX) nk[j++] = kvps__ent(q, i).key;
    qsort(nk, q->nnew, sizeof *nk, kvps__cmp_u64);
    int dup = 0;
    for (uint32_t i = 1; i < q->nnew; i++) dup |= nk[i] == nk[i - 1];
    free(nk);
    return dup ? kvps__refuse(s, q, KVPS_ERR_DUP_KEY, "among new keys") : 1;
}

/* Creates the new keys; out of memory forgets them again (a rejected request leaves nothing). */
static int kvps__create_keys(kvps_server *s, kvps__rq *q) {
    uint32_t created = 0;
    for (uint32_t i = 0; i < q->h.nkeys && q->nnew; i++) {
        if (q->idx[i] != UINT32_MAX) continue;
        kvps__kent e = kvps__ent(q, i);
        q->idx[i] = kvps__key_create(s, e.key, e.len);
        if (q->idx[i] == UINT32_MAX) {
            kvps__keys_truncate(s, s->nkeys - created);
            return kvps__refuse(s, q, KVPS_ERR_NOMEM, "cannot create key %llu of %llu floats", (unsigned long long)e.key,
                                (unsigned long long)e.len);
        }
        created++;
    }
    return 1;
}

/* Key i's contribution: its blob (it walks the checked blobs in key order) or its floats. */
static int kvps__contrib_of(kvps_server *s, kvps__rq *q, kvps__blobs *it, const char **src, const kvps__key *k,
                            kvps__contrib *g, kvps_codec *tmp) {
    memset(g, 0, sizeof *g);
    if (q->coded) { /* checked whole by kvps__check_blobs */
        const unsigned char *blob = NULL;
        uint32_t nb = 0;
        kvps__blob_next(it, &blob, &nb);
        g->codec = kvps__server_codec(s, blob[0], tmp);
        g->blob = blob;
        g->bytes = nb;
        return 1;
    }
    size_t bytes = (size_t)k->len * sizeof(float);
    g->g = (const float *)(const void *)*src;
    if (!kvps__aligned(*src)) {
        if (s->scratch_len < k->len) {
            free(s->scratch);
            s->scratch = (float *)kvps__alloc_floats(k->len);
            s->scratch_len = s->scratch ? (size_t)k->len : 0;
            if (!s->scratch) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "scratch");
        }
        memcpy(s->scratch, *src, bytes);
        g->g = s->scratch;
    }
    *src += bytes;
    return 1;
}

/* A push of one key under the server's consistency: 1 applied or buffered, 2 deferred (answered
   when applied), 0 refused. */
static int kvps__push_key(kvps_server *s, kvps__rq *q, kvps__key *k, const kvps__contrib *g) {
    KVPS__STAT_ADD(s, pushes, 1);
    int advanced;
    uint32_t r = q->h.rank;
    if (k->dtag && q->h.status && k->dtag[2 * r] == (uint32_t)q->h.status && k->dtag[2 * r + 1] >= q->h.req_id >> 24)
        return 1; /* REPLICAS: a re-send whose push of this key a round replicated from the old primary holds */
    if (s->desc.consistency != KVPS_ASYNC) { /* BSP, SSP, adaptive: rank-ordered rounds */
        advanced = kvps__bsp_push(s, k, (int)q->h.rank, g);
        if (advanced < 0) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "buffering a push");
    } else {
        const float *dense = g->g;
        if (!dense) {
            float *d = kvps__dscratch(s, k->len);
            if (!d) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "decoding");
            kvps__contrib_into(s, k, g, d, 0);
            dense = d;
        }
        k->recv[q->h.rank]++;
        if (g->g && q->defer && kvps__aligned(zmq_msg_data(&q->fr[2]))) {
            kvps__defer_push(s, k, q->id, &q->h, &q->fr[2]);
            return 2;
        }
        if (kvps__apply(s, k, dense, 1) != 0) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "update");
        advanced = 1;
    }
    if (advanced && k->waiters) kvps__wake(s, k);
    return 1;
}

/* CONFIG sets each key's rule (fresh state); INIT writes values; a push is applied. 1 done, 2
   deferred, 0 refused. */
static int kvps__apply_values(kvps_server *s, kvps__rq *q) {
    if (q->h.op == KVPS__OP_CONFIG) {
        const unsigned char *rec = (const unsigned char *)zmq_msg_data(&q->fr[2]);
        for (uint32_t i = 0; i < q->h.nkeys; i++) {
            kvps__key *k = s->keys[q->idx[i]];
            kvps__optim_read(rec + (size_t)i * KVPS__OPTREC, &k->opt);
            free(k->state); /* a new rule starts from fresh state */
            k->state = NULL;
            k->step = 0;
        }
        return 1;
    }
    if (!q->op->values) return 1;
    kvps__blobs it = kvps__blobs_of(&q->fr[2]);
    const char *src = (const char *)zmq_msg_data(&q->fr[2]);
    for (uint32_t i = 0; i < q->h.nkeys; i++) {
        kvps__key *k = s->keys[q->idx[i]];
        kvps__contrib g;
        kvps_codec tmp;
        if (!kvps__contrib_of(s, q, &it, &src, k, &g, &tmp)) return 0;
        if (q->h.op == KVPS__OP_INIT) {
            if (kvps__value_writable(k) != 0) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "init");
            kvps__contrib_into(s, k, &g, k->value, 0);
            continue;
        }
        int r = kvps__push_key(s, q, k, &g);
        if (r != 1) return r;
    }
    return 1;
}

/* A pull (or a pushpull's pull): answered now when its keys are ready, else parked. */
/* Pull (or READ after request `after`) q, kept as a parked pull and answered when its keys are
   ready (kvps__try_pull: now, or when a round wakes it). */
static void kvps__park_pull(kvps_server *s, kvps__rq *q, uint64_t after) {
    kvps__parked *p = (kvps__parked *)calloc(1, sizeof *p);
    uint32_t *pidx = (uint32_t *)malloc((size_t)q->h.nkeys * sizeof *pidx);
    if (!p || !pidx) {
        free(p); free(pidx);
        kvps__refuse(s, q, KVPS_ERR_NOMEM, "%s of %u keys", q->op->name, q->h.nkeys);
        return;
    }
    memcpy(pidx, q->idx, (size_t)q->h.nkeys * sizeof *pidx);
    zmq_msg_init(&p->id);
    zmq_msg_copy(&p->id, q->id);
    p->hdr = q->h;
    p->idx = pidx;
    p->after = after;
    p->since = kvps__now_ms();
    kvps__try_pull(s, p);
}
static void kvps__answer_pull(kvps_server *s, kvps__rq *q) {
    /* A pushpull's push is applied now: an error its pull gets later (a lost worker, no memory
       for the reply) must leave it in the re-send window, or the worker's re-send would apply
       the push again. reply_error leaves the window alone for status 0 (the request header's
       status is the worker's incarnation; 0 means untracked). */
    q->h.status = 0;
    s->win_pulls++;
    if (!kvps__pull_blocker(s, &q->h, q->idx)) { /* the usual case: answer now, nothing to keep */
        zmq_msg_t rid;
        zmq_msg_init(&rid);
        zmq_msg_copy(&rid, q->id);
        kvps__pull_reply(s, &rid, &q->h, q->idx);
        zmq_msg_close(&rid);
        return;
    }
    kvps__park_pull(s, q, 0);
}

/* PUSH, PULL, PUSHPULL, INIT, CONFIG: checked whole, then applied, then answered. */
static void kvps__serve_keys(kvps_server *s, kvps__rq *q) {
    if (!kvps__check_frames(s, q) || !kvps__check_keys(s, q) || !kvps__check_values(s, q) || !kvps__check_new_keys(s, q))
        return;
    if (s->out[q->h.rank] == KVPS__OUT_JOINED && (q->h.op == KVPS__OP_PUSH || q->h.op == KVPS__OP_PUSHPULL)) {
        kvps__refuse_joined(s, q);
        return;
    }
    /* Deferred pushes of these keys are applied first: everything after sees them. */
    q->defer = kvps__deferrable(s, &q->h, q->idx, q->coded); /* (a key created by this push: not deferred) */
    if (!q->defer)
        for (uint32_t i = 0; i < q->h.nkeys; i++)
            if (q->idx[i] != UINT32_MAX && s->keys[q->idx[i]]->ndef) kvps__flush(s, s->keys[q->idx[i]]);
    if (!kvps__create_keys(s, q)) return;
    /* REPLICAS under BSP: a push is answered once every round it is in has been applied and sent
       down the chain */
    int track = kvps__repl_track(s, q); /* (a tracked push is answered when its rounds are down the chain) */
    if (track < 0) { kvps__refuse(s, q, KVPS_ERR_NOMEM, "push of %u keys", q->h.nkeys); return; }
    int applied = kvps__apply_values(s, q);
    kvps__repl_untrack(s, applied);
    if (applied != 1) return; /* refused, or deferred: answered when applied */
    /* Release the pushed bytes (a zero-copy inproc sender waits for this) before replying. */
    if (q->nfr == 3) { zmq_msg_close(&q->fr[2]); zmq_msg_init(&q->fr[2]); }
    if (q->op->pulls) kvps__answer_pull(s, q);
    else if (!track) kvps__reply_ack(s, q->id, &q->h);
}

/* ---- table ops: TABLE (configure), PUSH_ROWS, PULL_ROWS ----
   The meta frame: the header, u64 table id, u32 dim, u32 pad, then a u64 id per row. */
typedef struct kvps__tq {
    uint64_t tid, nrows;
    uint32_t dim;
    const unsigned char *ids;
    kvps__table *t;
} kvps__tq;

static int kvps__check_table_req(kvps_server *s, kvps__rq *q, kvps__tq *tq) {
    int want = q->op->values ? 3 : 2;
    uint64_t nrows = q->h.op == KVPS__OP_TABLE ? 0 : q->h.nkeys;
    size_t msz = q->msz;
    if (q->nfr != want || msz < KVPS__HDR + 16 || (msz - KVPS__HDR - 16) != nrows * 8)
        return kvps__refuse(s, q, q->nfr < want || msz < KVPS__HDR + 16 + nrows * 8 ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED,
                            "table request: %d frames, meta of %zu bytes for %llu rows", q->nfr - 1, msz, (unsigned long long)nrows);
    memcpy(&tq->tid, q->ents, 8);
    memcpy(&tq->dim, q->ents + 8, 4);
    tq->ids = q->ents + 16;
    tq->nrows = nrows;
    tq->t = kvps__table_find(s->tables, tq->tid);
    return 1;
}

/* TABLE: the record checked, and the table created, or found configured the same. */
static int kvps__table_config(kvps_server *s, kvps__rq *q, kvps__tq *tq) {
    size_t rsz = zmq_msg_size(&q->fr[2]);
    const unsigned char *rec = (const unsigned char *)zmq_msg_data(&q->fr[2]);
    if (rsz != KVPS__TREC) /* nothing is read from a record of another size */
        return kvps__refuse(s, q, KVPS_ERR_MALFORMED, "table %llu: record of %zu bytes, want %d", (unsigned long long)tq->tid,
                            rsz, KVPS__TREC);
    kvps_optim o;
    kvps_result vr = kvps__optim_read(rec, &o);
    float scale;
    uint64_t seed;
    memcpy(&scale, rec + KVPS__OPTREC, 4);
    memcpy(&seed, rec + KVPS__OPTREC + 4, 8);
    if (o.rule == KVPS_RULE_DEFAULT) o.rule = KVPS_RULE_SGD;
    uint32_t dim = tq->dim;
    kvps__table *t = tq->t;
    if (vr == KVPS_OK && kvps__rule_row_of(o.rule)->steps) {
        char rt[64];
        return kvps__refuse(s, q, KVPS_ERR_INVALID_ARG, "table %llu: %s counts a key's steps, which sparse rows do not keep",
                            (unsigned long long)tq->tid, kvps__rule_text(s, o.rule, rt, sizeof rt));
    }
    if (vr == KVPS_OK && (dim == 0 || dim > (1u << 20) || !kvps__finite(scale) || scale < 0)) vr = KVPS_ERR_INVALID_ARG;
    if (vr == KVPS_OK && t && (t->dim != dim || memcmp(&t->opt, &o, sizeof o) != 0 || t->init_scale != scale || t->seed != seed))
        vr = KVPS_ERR_TABLE;
    if (vr != KVPS_OK) return kvps__refuse(s, q, vr, "table %llu: dim %u", (unsigned long long)tq->tid, dim);
    if (t) return 1;
    if (!(t = (kvps__table *)calloc(1, sizeof *t))) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "table");
    t->id = tq->tid;
    t->dim = dim;
    t->opt = o;
    t->init_scale = scale;
    t->seed = seed;
    t->sdim = kvps__table_sdim(o.rule, dim);
    t->next = s->tables;
    s->tables = t;
    return 1;
}

/* PUSH_ROWS, PULL_ROWS: a table configured here, rows of its dim, no row id twice. */
static int kvps__check_rows(kvps_server *s, kvps__rq *q, const kvps__tq *tq) {
    const kvps__table *t = tq->t;
    uint64_t nrows = tq->nrows;
    if (!t) return kvps__refuse(s, q, KVPS_ERR_TABLE, "table %llu is not configured here", (unsigned long long)tq->tid);
    if (tq->dim != t->dim)
        return kvps__refuse(s, q, KVPS_ERR_LEN_MISMATCH, "table %llu: rows of %u, the table has %u", (unsigned long long)tq->tid,
                            tq->dim, t->dim);
    if (q->h.op == KVPS__OP_PUSH_ROWS && zmq_msg_size(&q->fr[2]) != nrows * tq->dim * sizeof(float))
        return kvps__refuse(s, q, zmq_msg_size(&q->fr[2]) < nrows * tq->dim * sizeof(float) ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED,
                            "%zu bytes of rows for %llu x %u", zmq_msg_size(&q->fr[2]), (unsigned long long)nrows, tq->dim);
    if (nrows < 2) return 1;
    /* duplicate ids: the worker merges them; a raw client is told */
    uint64_t *sorted = (uint64_t *)malloc(nrows * sizeof *sorted);
    if (!sorted) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "rows");
    memcpy(sorted, tq->ids, nrows * 8);
    qsort(sorted, nrows, sizeof *sorted, kvps__cmp_u64);
    int dup = 0;
    for (uint64_t i = 1; i < nrows; i++) dup |= sorted[i] == sorted[i - 1];
    free(sorted);
    return dup ? kvps__refuse(s, q, KVPS_ERR_DUP_KEY, "a row id twice in one request") : 1;
}

/* Row i's index in the table, created on first touch; UINT64_MAX when out of memory. */
static uint64_t kvps__row_of(kvps_server *s, const kvps__tq *tq, uint64_t i) {
    uint64_t rid;
    memcpy(&rid, tq->ids + i * 8, 8);
    return kvps__table_row(s, tq->t, rid);
}

/* PULL_ROWS: the rows' values into *values. */
static int kvps__pull_rows(kvps_server *s, kvps__rq *q, const kvps__tq *tq, zmq_msg_t *values) {
    const kvps__table *t = tq->t;
    if (zmq_msg_init_size(values, tq->nrows * t->dim * sizeof(float)) != 0) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "reply");
    float *dst = (float *)zmq_msg_data(values);
    for (uint64_t i = 0; i < tq->nrows; i++) {
        uint64_t r = kvps__row_of(s, tq, i);
        if (r == UINT64_MAX) { zmq_msg_close(values); return kvps__refuse(s, q, KVPS_ERR_NOMEM, "row"); }
        memcpy(dst + i * t->dim, kvps__row(t, r), t->dim * sizeof(float));
    }
    KVPS__STAT_ADD(s, pulls, tq->nrows);
    return 1;
}

/* PUSH_ROWS: each row's gradient applied with the table's rule. */
static int kvps__push_rows(kvps_server *s, kvps__rq *q, const kvps__tq *tq) {
    const kvps__table *t = tq->t;
    const unsigned char *gv = (const unsigned char *)zmq_msg_data(&q->fr[2]);
    float *g = kvps__dscratch(s, t->dim);
    if (!g) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "scratch");
    uint32_t nsc = kvps__rules[t->opt.rule].scalars;
    for (uint64_t i = 0; i < tq->nrows; i++) {
        uint64_t r = kvps__row_of(s, tq, i);
        if (r == UINT64_MAX) return kvps__refuse(s, q, KVPS_ERR_NOMEM, "row");
        memcpy(g, gv + i * t->dim * sizeof(float), t->dim * sizeof(float)); /* any alignment */
        float *st = kvps__row_state(t, r), *sc = nsc ? st + t->sdim - nsc : NULL;
        kvps__rule_math(&t->opt, kvps__row(t, r), g, 1.0f, st, st ? st + t->dim : NULL, sc, sc ? sc + 1 : NULL, 0, t->dim);
    }
    KVPS__STAT_ADD(s, pushes, tq->nrows);
    return 1;
}

/* Table ops: checked whole, then applied, then answered with the request's header. */
static void kvps__serve_table(kvps_server *s, kvps__rq *q) {
    kvps__tq tq;
    memset(&tq, 0, sizeof tq);
    if (!kvps__check_table_req(s, q, &tq)) return;
    if (!(q->h.op == KVPS__OP_TABLE ? kvps__table_config(s, q, &tq) : kvps__check_rows(s, q, &tq))) return;
    zmq_msg_t f[3];
    int nf = q->h.op == KVPS__OP_PULL_ROWS ? 3 : 2;
    if (q->h.op == KVPS__OP_PULL_ROWS && !kvps__pull_rows(s, q, &tq, &f[2])) return;
    if (q->h.op == KVPS__OP_PUSH_ROWS && !kvps__push_rows(s, q, &tq)) return;
    kvps__hdr rh = kvps__reply_hdr(&q->h, KVPS_OK);
    kvps__reply_start(f, q->id, 0, &rh);
    kvps__server_send(s, f, nf);
}


// >>session
/* Sessions: a worker's HELLO (what must agree, checked at first contact), its BYE (finished:
   a server whose workers have all finished stops by itself), tensor names (NAME, so that
   messages say 'tensor' rather than a slice key), STATUS (what a request waits for) and the
   stall inspector, which names the workers a waiting pull or barrier needs. */
typedef struct kvps__tname {
    uint64_t base;  /* the tensor's slice keys without the slice index; 0: empty slot */
    uint64_t len;
    uint32_t nslices;
    int rank;       /* the worker that named it first */
    char *name;
} kvps__tname;

static uint32_t kvps__get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t kvps__get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static kvps__tname *kvps__tname_find(const kvps_server *s, uint64_t base) {
    if (!s->cap_tnames) return NULL;
    for (uint32_t i = (uint32_t)kvps__mix64(base) & (s->cap_tnames - 1);; i = (i + 1) & (s->cap_tnames - 1)) {
        if (s->tnames[i].base == base) return &s->tnames[i];
        if (!s->tnames[i].base) return NULL;
    }
}

/* A free slot for base (not there yet), growing the table first; NULL when out of memory. */
static kvps__tname *kvps__tname_slot(kvps_server *s, uint64_t base) {
    if (2 * (s->ntnames + 1) > s->cap_tnames) {
        uint32_t nc = s->cap_tnames ? 2 * s->cap_tnames : 64;
        kvps__tname *nt = (kvps__tname *)calloc(nc, sizeof *nt), *old = s->tnames;
        if (!nt) return NULL;
        uint32_t oc = s->cap_tnames;
        s->tnames = nt;
        s->cap_tnames = nc;
        for (uint32_t i = 0; i < oc; i++)
            if (old[i].base) {
                uint32_t j = (uint32_t)kvps__mix64(old[i].base) & (nc - 1);
                while (nt[j].base) j = (j + 1) & (nc - 1);
                nt[j] = old[i];
            }
        free(old);
    }
    uint32_t j = (uint32_t)kvps__mix64(base) & (s->cap_tnames - 1);
    while (s->tnames[j].base) j = (j + 1) & (s->cap_tnames - 1);
    return &s->tnames[j];
}

/* A key in words: "tensor 'w' slice 1 of 2" once a worker has named it, else "key N". */
static const char *kvps__key_text(const kvps_server *s, uint64_t key, char *buf, size_t n) {
    const kvps__tname *t = (key >> 63) ? kvps__tname_find(s, key & ~(uint64_t)0xffff) : NULL;
    if (t && t->nslices > 1)
        snprintf(buf, n, "tensor '%s' slice %u of %u", t->name, (unsigned)(key & 0xffff), t->nslices);
    else if (t) snprintf(buf, n, "tensor '%s'", t->name);
    else snprintf(buf, n, "key %llu", (unsigned long long)key);
    return buf;
}

/* Why worker r is not doing its part, in a few words. */
static const char *kvps__rank_state(const kvps_server *s, int r, int64_t now, char *buf, size_t n) {
    if (s->done[r]) snprintf(buf, n, "finished");
    else if (s->bad_inc[r] && !s->live_inc[r]) snprintf(buf, n, "refused: %s", s->bad_text[r]);
    else if (s->lost[r]) snprintf(buf, n, "lost %lld s ago", (long long)(now - s->gone_since[r]) / 1000);
    else if (!s->heard[r]) snprintf(buf, n, "never connected");
    else if (s->gone_since[r]) snprintf(buf, n, "disconnected %lld s ago", (long long)(now - s->gone_since[r]) / 1000);
    else snprintf(buf, n, "connected");
    return buf;
}

/* "workers 2 (never connected), 3 (lost 12 s ago)": the ranks with miss(r) set, eight at most. */
static void kvps__missing_text(const kvps_server *s, const kvps__key *k, uint64_t gen, char *buf, size_t n) {
    int64_t now = kvps__now_ms();
    size_t used = 0;
    int listed = 0, more = 0;
    buf[0] = 0;
    for (int r = 0; r < s->m; r++) {
        int miss = k ? (!s->out[r] && k->recv[r] <= k->round) : (!s->out[r] && s->barrier_gen[r] <= gen);
        if (!miss) continue;
        if (listed == 8) { more++; continue; }
        char st[240];
        kvps__rank_state(s, r, now, st, sizeof st);
        int w = snprintf(buf + used, n - used, "%s%d (%s)", listed ? ", " : "", r, st);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
        listed++;
    }
    if (more && used < n) snprintf(buf + used, n - used, " and %d more", more);
}

/* What parked request p waits for. */
static void kvps__stall_text(const kvps_server *s, const kvps__parked *p, char *buf, size_t n) {
    char who[600], what[300];
    if (p->hdr.op == KVPS__OP_BARRIER || p->hdr.op == KVPS__OP_ALLREDUCE) {
        kvps__missing_text(s, NULL, p->hdr.aux, who, sizeof who);
        snprintf(buf, n, "barrier %llu waits for workers %s", (unsigned long long)p->hdr.aux + 1, who);
        return;
    }
    const kvps__key *k = kvps__pull_blocker(s, &p->hdr, p->idx);
    if (!k) { snprintf(buf, n, "the pull is ready"); return; }
    kvps__missing_text(s, k, 0, who, sizeof who);
    snprintf(buf, n, "pull of %s waits for round %llu, which workers %s have not pushed",
             kvps__key_text(s, k->key, what, sizeof what), (unsigned long long)k->round + 1, who);
}

/* Refuses the hello of worker q->h.rank: remembered, so that the rest of what that process
   sends is refused with the same words. */
static int kvps__hello_refuse(kvps_server *s, kvps__rq *q, kvps_result rc, const char *fmt, ...) {
    uint32_t r = q->h.rank;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->bad_text[r], sizeof s->bad_text[r], fmt, ap);
    va_end(ap);
    s->bad_inc[r] = (uint32_t)q->h.status;
    kvps__log(KVPS_LOG_ERROR, "server %d: refused worker %u: %s", s->desc.rank, r, s->bad_text[r]);
    return kvps__refuse(s, q, rc, "%s", s->bad_text[r]);
}

/* HELLO: values = u32 protocol, u32 num_workers (0: unchecked), u32 servers in the worker's
   list, u32 this server's place in it, u64 the list's hash, u64 min_slice, u64 max_slice, u64
   the worker's placement hash (0: it has not resharded nor heard of a reshard), u64 the job
   token's digest (0: none), which must be this server's, u32 again (1: sent after a reconnect
   to a server that had accepted this worker's hello), u32 the last checkpoint stamp the worker
   heard from this server (kvps__stamp; 0: none). The first hello accepted sets what later ones
   must match; 0 when refused. A server that records a placement (RESHARD) refuses a worker with
   another one, and one restored from a checkpoint written before any reshard refuses a worker
   that has resharded. A hello sent again is refused when the server holds less than the worker
   was told of (restored from an older checkpoint, or restarted without one): what it applied
   since is lost, and BSP rounds would not align. */
static int kvps__hello_ok(kvps_server *s, kvps__rq *q) {
    uint32_t r = q->h.rank;
    if (q->nfr != 3 || zmq_msg_size(&q->fr[2]) != KVPS__HELLO_BYTES)
        return kvps__refuse(s, q, KVPS_ERR_MALFORMED, "hello of %zu bytes, expected %d",
                            q->nfr == 3 ? zmq_msg_size(&q->fr[2]) : (size_t)0, KVPS__HELLO_BYTES);
    const unsigned char *v = (const unsigned char *)zmq_msg_data(&q->fr[2]);
    uint32_t proto = kvps__get32(v), nw = kvps__get32(v + 4), ns = kvps__get32(v + 8), at = kvps__get32(v + 12);
    uint64_t hash = kvps__get64(v + 16), mins = kvps__get64(v + 24), maxs = kvps__get64(v + 32);
    const unsigned char *f = s->ref;
    int fr = s->ref_rank;
    if (proto != KVPS__PROTO)
        return kvps__hello_refuse(s, q, KVPS_ERR_VERSION, "worker %u speaks kvps protocol %u, server %d (%s) speaks %d", r, proto,
                                  s->desc.rank, s->endpoint, KVPS__PROTO);
    if (kvps__get64(v + 48) != s->token) { /* a stranger: not remembered by incarnation as other refusals are
                                              (it could name a worker's), nor in that worker's re-send window */
        char why[300];
        snprintf(why, sizeof why, "its hello %s, server %d %s: a process of another job, or one its launcher did not "
                 "give the job's token (KVPS_JOB_TOKEN; kvps-run sets it)",
                 kvps__get64(v + 48) ? "carries another job token" : "carries no job token", s->desc.rank,
                 s->token ? "has another" : "has none");
        kvps__stranger(s, q->fr, &q->h, zmq_msg_get(&q->fr[1], ZMQ_SRCFD), why);
        return 0;
    }
    if (nw && nw != (uint32_t)s->m)
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker %u was told num_workers = %u, server %d (%s) was told %d", r, nw,
                                  s->desc.rank, s->endpoint, s->m);
    if (at != (uint32_t)s->desc.rank)
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker %u lists this server (%s) as server %u of %u, but it was started "
                                  "as server %d: the server list must be in rank order", r, s->endpoint, at, ns, s->desc.rank);
    if (fr >= 0 && (ns != kvps__get32(f + 8) || hash != kvps__get64(f + 16)))
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker %u lists %u servers (list hash %016llx), worker %d listed %u "
                                  "(hash %016llx): every worker needs the same server list, in the same order", r, ns,
                                  (unsigned long long)hash, fr, kvps__get32(f + 8), (unsigned long long)kvps__get64(f + 16));
    if (fr >= 0 && (mins != kvps__get64(f + 24) || maxs != kvps__get64(f + 32)))
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker %u cuts tensors with min_slice %llu, max_slice %llu; worker %d "
                                  "with %llu, %llu", r, (unsigned long long)mins, (unsigned long long)maxs, fr,
                                  (unsigned long long)kvps__get64(f + 24), (unsigned long long)kvps__get64(f + 32));
    uint64_t hw = kvps__get64(v + 40), hs = kvps__place_hash(&s->place);
    char pt[200];
    if (hs && hw && hw != hs)
        return kvps__hello_refuse(s, q, KVPS_ERR_MISMATCH, "worker %u places keys by other reshards than this server (%s), "
                                  "whose keys were placed by %s (its checkpoint or the last reshard): every worker and "
                                  "server must have seen the same reshards", r, s->endpoint,
                                  kvps__place_text(&s->place, pt, sizeof pt));
    if (hs && ns != s->place.n[s->place.count - 1])
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker %u lists %u servers, but this server's (%s) keys were "
                                  "placed by %s (its checkpoint or the last reshard): give the workers the list of %u",
                                  r, ns, s->endpoint, kvps__place_text(&s->place, pt, sizeof pt),
                                  s->place.n[s->place.count - 1]);
    if (!hs && hw && s->restored)
        return kvps__hello_refuse(s, q, KVPS_ERR_MISMATCH, "worker %u has resharded, but this server (%s) was restored "
                                  "from a checkpoint written before any reshard: its keys are placed as the first list "
                                  "placed them", r, s->endpoint);
    /* (a backup serving its primary's copy: the primary decided, by its own stamps) */
    uint32_t again = s->replaying ? 0 : kvps__get32(v + 56), heard = kvps__get32(v + 60), have = kvps__stamp(s);
    uint32_t inc = (uint32_t)q->h.status;
    if (again && heard && (!have || (int32_t)(heard - have) > 0)) {
        char now[64];
        if (have) snprintf(now, sizeof now, "its checkpoint %u", have - 1);
        else snprintf(now, sizeof now, "no checkpoint");
        return kvps__hello_refuse(s, q, KVPS_ERR_CHECKPOINT, "worker %u was answered by this server (%s) after its checkpoint "
                                  "%u, but the server now holds %s: it was restored from an older checkpoint (or started "
                                  "without one), so what it applied after that is lost and the workers' rounds would not "
                                  "align: restore it from its newest checkpoint", r, s->endpoint, heard - 1, now);
    }
    if (again && inc && !s->restored && s->live_inc[r] != inc && s->seen[r].inc != inc)
        return kvps__hello_refuse(s, q, KVPS_ERR_AUTH, "worker %u was served by this server (%s) before, but the server "
                                  "does not know it: it restarted without its checkpoint (kvps_server_restore), and what "
                                  "it applied is lost", r, s->endpoint);
    kvps__liveness_events(s); /* a predecessor's drop may be waiting to be read */
    if (q->h.status && s->live_inc[r] && s->live_inc[r] != (uint32_t)q->h.status && !s->done[r] && !s->lost[r] &&
        !s->gone_since[r] && !s->replaying) /* (a backup: its primary, which sees the connections, decided) */
        return kvps__hello_refuse(s, q, KVPS_ERR_CONFIG, "worker rank %u is taken by a live worker (another process or "
                                  "object, still connected): two workers were given rank %u", r, r);
    if (fr < 0) {
        memcpy(s->ref, v, KVPS__HELLO_BYTES);
        s->ref_rank = (int)r;
    }
    return 1;
}
/* Answers q with this server's placement (a hello's, PLACE_GET's). */
static void kvps__reply_place(kvps_server *s, kvps__rq *q) {
    kvps__hdr h = kvps__reply_hdr(&q->h, KVPS_OK);
    h.nkeys = 0;
    zmq_msg_t f[3];
    if (zmq_msg_init_size(&f[2], kvps__place_size(&s->place)) != 0) {
        kvps__refuse(s, q, KVPS_ERR_NOMEM, "%s: the placement", q->op->name);
        return;
    }
    kvps__place_enc(&s->place, (unsigned char *)zmq_msg_data(&f[2]));
    kvps__reply_start(f, q->id, 0, &h);
    kvps__server_send(s, f, 3);
}

/* An accepted hello is answered with this server's placement when the worker does not know it
   yet; until a hello that names it, that worker's keyed requests are refused (a request sent
   before the worker heard would have placed its keys the old way). */
static void kvps__serve_hello(kvps_server *s, kvps__rq *q) {
    if (!kvps__hello_ok(s, q)) return;
    if (q->h.status) s->live_inc[q->h.rank] = (uint32_t)q->h.status;
    s->rejoin[q->h.rank] = 0; /* restored: it is served again, from here on in order (kvps__admit) */
    kvps__heard_from(s, q);
    int tell = kvps__place_hash(&s->place) && !kvps__get64((const unsigned char *)zmq_msg_data(&q->fr[2]) + 40);
    s->place_wait[q->h.rank] = (uint8_t)tell;
    if (!tell) {
        kvps__reply_ack(s, q->id, &q->h);
        return;
    }
    kvps__reply_place(s, q);
}

static void kvps__fail_finished(kvps_server *s);

/* BYE: worker r has finished. Under .elastic it leaves the aggregation, like a lost worker. */
static void kvps__serve_bye(kvps_server *s, kvps__rq *q) {
    uint32_t r = q->h.rank;
    if (!s->done[r]) {
        s->done[r] = 1;
        s->ndone++;
        kvps__log(KVPS_LOG_INFO, "server %d: worker %u finished (%d of %d)", s->desc.rank, r, s->ndone, s->m);
        if (s->desc.elastic && !s->out[r]) kvps__leave(s, (int)r, KVPS__OUT_LEFT);
        else kvps__fail_finished(s);
        int live = 0; /* every worker that said hello has finished: the next ones may set another layout */
        for (int i = 0; i < s->m && !live; i++) live = s->live_inc[i] && !s->done[i];
        if (!live) s->ref_rank = -1;
    }
    kvps__reply_ack(s, q->id, &q->h);
    if (s->ndone == s->m && !s->desc.keep_serving) s->finish = 1;
}

/* A worker has finished: pulls and barriers waiting for a round it will not push are told. */
static void kvps__fail_finished(kvps_server *s) {
    for (uint32_t i = 0; s->npreq && i < s->nkeys; i++) { /* REPLICAS under BSP: pushes waiting for their rounds */
        kvps__key *k = s->keys[i];
        int fin = k->ctag ? kvps__needs_finished(s, k, k->round) : -1;
        char text[300], what[200];
        if (fin < 0) continue;
        snprintf(text, sizeof text, "worker %d has finished (kvps_worker_finish or destroy), but round %llu of %s needs its "
                 "push", fin, (unsigned long long)k->round + 1, kvps__key_text(s, k->key, what, sizeof what));
        kvps__repl_fail(s, k, text);
    }
    for (uint32_t i = 0; i < s->nkeys; i++)
        if (s->keys[i]->waiters) kvps__wake(s, s->keys[i]); /* (kvps__try_pull answers those) */
    kvps__parked **pp = &s->barrier_waiters;
    while (*pp) {
        kvps__parked *w = *pp;
        int fin = kvps__needs_finished(s, NULL, w->hdr.aux);
        if (fin < 0) { pp = &w->next; continue; }
        *pp = w->next;
        s->barrier_gen[w->hdr.rank]--; /* taken back, as for a lost worker (kvps__fail_waiters) */
        kvps__reply_error(s, &w->id, &w->hdr, KVPS_ERR_PEER_LOST, "worker %d has finished: barrier %llu cannot complete", fin,
                          (unsigned long long)w->hdr.aux + 1);
        kvps__parked_free(w);
    }
}

/* STATUS: what the request with this req_id, from this rank, waits for here. */
static void kvps__serve_status(kvps_server *s, kvps__rq *q) {
    char text[1000] = "";
    const kvps__parked *hit = NULL;
    for (const kvps__parked *p = s->barrier_waiters; p && !hit; p = p->next)
        if (p->hdr.rank == q->h.rank && p->hdr.req_id == q->h.req_id) hit = p;
    for (uint32_t i = 0; i < s->nkeys && !hit; i++)
        for (const kvps__parked *p = s->keys[i]->waiters; p && !hit; p = p->next)
            if (p->hdr.rank == q->h.rank && p->hdr.req_id == q->h.req_id) hit = p;
    if (hit) kvps__stall_text(s, hit, text, sizeof text);
    else snprintf(text, sizeof text, "nothing of that request waits here (not received yet, or answered)");
    kvps__hdr h = kvps__reply_hdr(&q->h, KVPS_OK);
    h.nkeys = 0;
    zmq_msg_t f[3];
    kvps__reply_start(f, q->id, 0, &h);
    kvps__msg_from_buf(&f[2], text, strlen(text));
    kvps__server_send(s, f, 3);
}

/* NAME: values = kvps__name_rec { u64 base; u64 len; u32 slices; u32 name bytes } + the name.
   Two workers that disagree about a tensor are told so by its name. */
static void kvps__serve_name(kvps_server *s, kvps__rq *q) {
    size_t sz = q->nfr == 3 ? zmq_msg_size(&q->fr[2]) : 0;
    const unsigned char *v = (const unsigned char *)(q->nfr == 3 ? zmq_msg_data(&q->fr[2]) : NULL);
    if (sz < KVPS__NAME_REC || sz != KVPS__NAME_REC + (size_t)kvps__get32(v + 20)) {
        kvps__refuse(s, q, KVPS_ERR_MALFORMED, "tensor name record of %zu bytes", sz);
        return;
    }
    uint64_t base = kvps__get64(v), len = kvps__get64(v + 8);
    uint32_t ns = kvps__get32(v + 16), nb = kvps__get32(v + 20);
    char name[KVPS__NAME_MAX + 1];
    if (!(base >> 63) || (base & 0xffff) || !ns || ns > 65536 || len < ns || !nb || nb > KVPS__NAME_MAX ||
        memchr(v + KVPS__NAME_REC, 0, nb)) {
        kvps__refuse(s, q, KVPS_ERR_MALFORMED, "tensor name record: base key, length, slices or name out of range");
        return;
    }
    memcpy(name, v + KVPS__NAME_REC, nb);
    name[nb] = 0;
    kvps__tname *t = kvps__tname_find(s, base);
    if (t && strcmp(t->name, name) != 0) {
        kvps__refuse(s, q, KVPS_ERR_TENSOR, "tensor '%s' of worker %u and tensor '%s' of worker %d have the same slice keys "
                     "(their names' hashes collide): rename one", name, q->h.rank, t->name, t->rank);
        return;
    }
    if (t && t->len != len) {
        kvps__refuse(s, q, KVPS_ERR_LEN_MISMATCH, "tensor '%s': worker %u registered it with %llu floats, worker %d with %llu",
                     name, q->h.rank, (unsigned long long)len, t->rank, (unsigned long long)t->len);
        return;
    }
    if (t && t->nslices != ns) {
        kvps__refuse(s, q, KVPS_ERR_CONFIG, "tensor '%s': worker %u cuts it into %u slices, worker %d into %u (their server "
                     "lists or min_slice / max_slice differ)", name, q->h.rank, ns, t->rank, t->nslices);
        return;
    }
    if (!t) {
        char *copy = (char *)malloc(nb + 1);
        kvps__tname *slot = copy ? kvps__tname_slot(s, base) : NULL;
        if (!slot) {
            free(copy);
            kvps__refuse(s, q, KVPS_ERR_NOMEM, "tensor '%s': no memory for its name", name);
            return;
        }
        memcpy(copy, name, nb + 1);
        slot->base = base;
        slot->len = len;
        slot->nslices = ns;
        slot->rank = (int)q->h.rank;
        slot->name = copy;
        s->ntnames++;
    }
    kvps__reply_ack(s, q->id, &q->h);
}

/* The stall inspector: every pull or barrier parked for stall_ms is named, with the workers it
   waits for, and again every stall_ms while it waits. One line per key (however many pulls
   wait on it) and per barrier generation. */
static void kvps__stall_check(kvps_server *s, int64_t now) {
    int64_t lim = s->desc.stall_ms;
    char text[1200];
    for (uint32_t i = 0; i < s->nkeys; i++) {
        int n = 0;
        kvps__parked *first = NULL;
        for (kvps__parked *p = s->keys[i]->waiters; p; p = p->next)
            if (now - p->since >= lim && now - p->warned >= lim) {
                if (!first || p->since < first->since) first = p;
                p->warned = now;
                n++;
            }
        if (!first) continue;
        kvps__stall_text(s, first, text, sizeof text);
        kvps__log(KVPS_LOG_WARN, "server %d: stalled for %lld s: %s (%d pull%s waiting)", s->desc.rank,
                  (long long)(now - first->since) / 1000, text, n, n == 1 ? "" : "s");
    }
    uint64_t said = UINT64_MAX;
    for (kvps__parked *p = s->barrier_waiters; p; p = p->next)
        if (now - p->since >= lim && now - p->warned >= lim) {
            p->warned = now;
            if (p->hdr.aux == said) continue;
            said = p->hdr.aux;
            kvps__stall_text(s, p, text, sizeof text);
            kvps__log(KVPS_LOG_WARN, "server %d: stalled for %lld s: %s", s->desc.rank, (long long)(now - p->since) / 1000, text);
        }
}

// >>checkpoint
/* CRC-32 (IEEE 802.3, zlib's crc32), bytewise from a table. */
static uint32_t kvps__crc32(uint32_t crc, const void *data, size_t n) {
    static uint32_t table[256];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int j = 0; j < 8; j++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    const unsigned char *p = (const unsigned char *)data;
    crc = ~crc;
    while (n--) crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* File layout, little-endian: "KVPSCKPT", u32 version, rank, workers, consistency, nkeys,
   ntables; (version 3) u32 placement bytes (0: never resharded), then the placement
   (kvps__place_enc: RESHARD, how the keys were placed); (version 4) u32 generation: this file is
   the server's generation-th checkpoint, counted on across restores (a replica's snapshot: the
   checkpoints written before it), so that replies' stamps (kvps__stamp) go on rising; per
   table: u64 id, u32 dim, state floats per row, rule, f32 lr momentum beta1 beta2 eps
   init_scale, u64 seed, rows, then per row u64 row id, f32 value[dim], f32 state[that];
   per key: u64 key, len, round, u32 rule (KVPS_RULE_USER + i: user rule i), f32 lr momentum
   beta1 beta2 eps, (version 5) f32 weight_decay, u32 state floats per value, f32 b1t b2t,
   (version 5) u64 step, u64 recv[workers], f32 value[len], f32 state[len x that];
   per worker: u64 barriers entered, u8 left (elastic), u32 incarnation, u64 hi, u64 window[1024];
   then u32 CRC-32
   of everything before it and "KEND". Version 4 (no weight_decay: 0, no step: 0; it had no
   AdamW nor user rules), version 3 (no generation: 0), version 2 (its placement:
   u32 count, 0 or u32 V and u32 server counts, changes by counts) and version 1 (no placement)
   are still read. */
enum { KVPS__CKPT_VERSION = 5 };
typedef struct kvps__cw { FILE *f; uint32_t crc; int err; } kvps__cw;
static void kvps__cw_put(kvps__cw *w, const void *p, size_t n) {
    if (!w->err && n && fwrite(p, 1, n, w->f) != n) w->err = 1;
    w->crc = kvps__crc32(w->crc, p, n);
}
#define KVPS__CW(w, v) kvps__cw_put((w), &(v), sizeof(v))

/* True when nothing is half done: no round partly summed, no push buffered, no barrier open. */
/* A key's round is partly summed, or a push for it is buffered. */
static int kvps__key_half_done(const kvps_server *s, const kvps__key *k) {
    if (k->nin) return 1;
    for (int r = 0; k->qhead && r < s->m; r++)
        if (k->qhead[r]) return 1;
    return 0;
}

/* No round half summed and nothing dirty; for a checkpoint also no barrier open (a snapshot
   may be taken while one is: barrier waits are not in snapshots, REPLICAS' limits, and a backup
   of the first chain waiting for its snapshot holds replies a barrier may wait for). */
static int kvps__quiescent(const kvps_server *s, int barriers_too) {
    if ((barriers_too && s->barrier_waiters) || s->ndirty) return 0;
    for (uint32_t i = 0; i < s->nkeys; i++)
        if (kvps__key_half_done(s, s->keys[i])) return 0;
    return 1;
}

/* One key's record (the checkpoint's, and a key moved to another server): u64 key, len, round,
   u32 rule, f32 lr momentum beta1 beta2 eps weight_decay, u32 state floats per value, f32 b1t
   b2t, u64 step, u64 recv[workers], f32 value[len], f32 state[len x that] (version 5; before:
   no weight_decay, no step). */
static void kvps__key_put(const kvps_server *s, kvps__cw *w, const kvps__key *k) {
    uint32_t rule = (uint32_t)k->opt.rule, nstate = k->state ? kvps__rule_nstate(s, kvps__rule_in_force(s, k->opt.rule)) : 0;
    float f[8] = {k->opt.lr, k->opt.momentum, k->opt.beta1, k->opt.beta2, k->opt.eps, k->opt.weight_decay, k->b1t, k->b2t};
    KVPS__CW(w, k->key);
    KVPS__CW(w, k->len);
    KVPS__CW(w, k->round);
    KVPS__CW(w, rule);
    kvps__cw_put(w, f, 6 * sizeof(float));
    KVPS__CW(w, nstate);
    kvps__cw_put(w, f + 6, 2 * sizeof(float));
    KVPS__CW(w, k->step);
    kvps__cw_put(w, k->recv, (size_t)s->m * sizeof *k->recv);
    kvps__cw_put(w, k->value, (size_t)k->len * sizeof(float));
    if (nstate) kvps__cw_put(w, k->state, (size_t)k->len * nstate * sizeof(float));
}

/* Which rows a reshard moves: those of the virtual shards in shard[] (sorted), V in all. */
typedef struct kvps__rowsel { uint32_t V, n; const uint32_t *shard; } kvps__rowsel;
static int kvps__u32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}
static int kvps__rowsel_has(const kvps__rowsel *sel, uint64_t table, uint64_t id) {
    if (!sel) return 1;
    uint32_t v = kvps__row_vshard(table, id, sel->V);
    return bsearch(&v, sel->shard, sel->n, sizeof v, kvps__u32_cmp) != NULL;
}

/* One table's record (the checkpoint's, and rows moved to another server): u64 id, u32 dim,
   state floats per row, rule, f32 lr momentum beta1 beta2 eps init_scale, u64 seed, rows, then
   per row u64 row id, f32 value[dim], f32 state[that]. Only the rows sel has (all: NULL). */
static void kvps__table_put(kvps__cw *w, const kvps__table *t, const kvps__rowsel *sel) {
    uint32_t u[3] = {t->dim, t->sdim, (uint32_t)t->opt.rule};
    float f[6] = {t->opt.lr, t->opt.momentum, t->opt.beta1, t->opt.beta2, t->opt.eps, t->init_scale};
    uint64_t nrows = 0;
    for (uint64_t j = 0; j < t->hcap; j++) nrows += t->hv[j] && kvps__rowsel_has(sel, t->id, t->hk[j]);
    KVPS__CW(w, t->id);
    kvps__cw_put(w, u, sizeof u);
    kvps__cw_put(w, f, sizeof f);
    KVPS__CW(w, t->seed);
    KVPS__CW(w, nrows);
    for (uint64_t j = 0; j < t->hcap; j++) {
        if (!t->hv[j] || !kvps__rowsel_has(sel, t->id, t->hk[j])) continue;
        uint64_t r = t->hv[j] - 1;
        KVPS__CW(w, t->hk[j]);
        kvps__cw_put(w, kvps__row(t, r), (size_t)t->dim * sizeof(float));
        if (t->sdim) kvps__cw_put(w, kvps__row_state(t, r), (size_t)t->sdim * sizeof(float));
    }
}

/* The shard, whole, in the checkpoint layout above (a file, or a replica's snapshot). */
static void kvps__ckpt_put(kvps_server *s, kvps__cw *wp) {
    kvps__cw w = *wp;
    uint32_t ntables = 0;
    for (const kvps__table *t = s->tables; t; t = t->next) ntables++;
    uint32_t hdr[6] = {KVPS__CKPT_VERSION, (uint32_t)s->desc.rank, (uint32_t)s->m, (uint32_t)s->desc.consistency,
                       s->nkeys, ntables};
    kvps__cw_put(&w, "KVPSCKPT", 8);
    kvps__cw_put(&w, hdr, sizeof hdr);
    uint32_t pbytes = s->place.count ? (uint32_t)kvps__place_size(&s->place) : 0;
    KVPS__CW(&w, pbytes);
    if (pbytes) {
        unsigned char *pb = (unsigned char *)malloc(pbytes);
        if (pb) kvps__place_enc(&s->place, pb), kvps__cw_put(&w, pb, pbytes);
        else w.err = 1;
        free(pb);
    }
    KVPS__CW(&w, s->ckpt_gen);
    for (const kvps__table *t = s->tables; t; t = t->next) kvps__table_put(&w, t, NULL);
    for (uint32_t i = 0; i < s->nkeys; i++) kvps__key_put(s, &w, s->keys[i]);
    for (int r = 0; r < s->m; r++) {
        KVPS__CW(&w, s->barrier_gen[r]);
        KVPS__CW(&w, s->out[r]);
        KVPS__CW(&w, s->seen[r].inc);
        KVPS__CW(&w, s->seen[r].hi);
        kvps__cw_put(&w, s->seen[r].bits, sizeof s->seen[r].bits);
    }
    uint32_t crc = w.crc;
    kvps__cw_put(&w, &crc, 4);
    kvps__cw_put(&w, "KEND", 4);
    *wp = w;
}

/* Removes the temporary files that writers of checkpoint `path` left when they died mid-write:
   PATH.tmp.PID (what kvps__checkpoint_write names them), PID a number and no process with that
   pid on this machine (kill(PID, 0) says ESRCH). Never another path's files, this process's, or
   one of a live process (it may be writing it; a pid reused since keeps its file until it ends). */
static void kvps__ckpt_sweep(int rank, const char *path) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    size_t dlen = slash ? (size_t)(slash - path) : 0, blen = strlen(base);
    char *dir = (char *)malloc(dlen + 2);
    if (!dir || !*base) { free(dir); return; }
    if (!slash) memcpy(dir, ".", 2);
    else if (!dlen) memcpy(dir, "/", 2);
    else { memcpy(dir, path, dlen); dir[dlen] = 0; }
    DIR *d = opendir(dir);
    unsigned n = 0;
    unsigned long long bytes = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        const char *nm = e->d_name, *q = nm + blen + 5;
        if (strncmp(nm, base, blen) != 0 || strncmp(nm + blen, ".tmp.", 5) != 0) continue;
        long pid = 0;
        while (*q >= '0' && *q <= '9' && pid < 100000000L) pid = pid * 10 + (*q++ - '0');
        if (*q || q == nm + blen + 5 || pid <= 0 || pid >= 100000000L || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive (or not ours to tell) */
        size_t flen = strlen(dir) + 1 + strlen(nm) + 1;
        char *full = (char *)malloc(flen);
        if (!full) break;
        snprintf(full, flen, "%s/%s", dir, nm);
        struct stat st;
        if (lstat(full, &st) == 0 && S_ISREG(st.st_mode) && unlink(full) == 0) {
            n++;
            bytes += (unsigned long long)st.st_size;
        }
        free(full);
    }
    if (d) closedir(d);
    free(dir);
    if (n)
        kvps__log(KVPS_LOG_INFO, "server %d: removed %u temporary checkpoint file%s of %s (%llu bytes) left by writers that "
                  "died mid-write", rank, n, n == 1 ? "" : "s", path, bytes);
}

static kvps_result kvps__checkpoint_write(kvps_server *s) {
    const char *path = s->desc.checkpoint_path;
    if (!path || !*path) return KVPS_ERR_CONFIG;
    size_t plen = strlen(path);
    char *tmp = (char *)malloc(plen + 32);
    if (!tmp) return KVPS_ERR_NOMEM;
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    kvps__cw w = {fopen(tmp, "wb"), 0, 0};
    if (!w.f) {
        kvps__log(KVPS_LOG_ERROR, "server %d: checkpoint: cannot create %s: %s", s->desc.rank, tmp, strerror(errno));
        free(tmp);
        return KVPS_ERR_CHECKPOINT;
    }
    s->ckpt_gen++; /* this file's generation (replies stamped with it + 1 only once it is in place) */
    kvps__ckpt_put(s, &w);
    int bad = w.err || fflush(w.f) != 0 || fsync(fileno(w.f)) != 0;
    bad |= fclose(w.f) != 0;
    if (!bad && rename(tmp, path) != 0) bad = 1;
    if (bad) {
        s->ckpt_gen--;
        kvps__log(KVPS_LOG_ERROR, "server %d: checkpoint: writing %s failed: %s", s->desc.rank, path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return KVPS_ERR_CHECKPOINT;
    }
    free(tmp);
    /* make the rename itself durable */
    size_t dlen = strlen(path);
    char *dir = (char *)malloc(dlen + 1); /* (not strdup: C99 has none) */
    if (dir) {
        memcpy(dir, path, dlen + 1);
        char *slash = strrchr(dir, '/');
        if (slash) *(slash == dir ? slash + 1 : slash) = 0;
        int fd = open(slash ? dir : ".", O_RDONLY);
        if (fd >= 0) { fsync(fd); close(fd); }
        free(dir);
    }
    kvps__ckpt_sweep(s->desc.rank, path); /* what writers killed mid-write left */
    s->ckpt_round = s->max_round;
    KVPS__STAT_ADD(s, checkpoints, 1);
    kvps__log(KVPS_LOG_INFO, "server %d: checkpoint of %u keys at round %llu in %s", s->desc.rank, s->nkeys,
              (unsigned long long)s->max_round, path);
    return KVPS_OK;
}

/* Serving thread: writes a checkpoint that is due (asked for, or every N rounds) once the
   shard is quiescent, and tells whoever asked. */
static void kvps__checkpoint_maybe(kvps_server *s) {
    if (!s->desc.checkpoint_path) return; /* (kvps_server_checkpoint refuses without a path) */
    uint64_t asked = __atomic_load_n(&s->ckpt_req, __ATOMIC_ACQUIRE); /* no lock on every batch */
    int every = s->desc.checkpoint_every > 0 &&
                s->max_round >= s->ckpt_round + (uint64_t)s->desc.checkpoint_every;
    if ((asked == s->ckpt_done && !every) || !kvps__quiescent(s, 1)) return;
    kvps_result r = kvps__checkpoint_write(s);
    if (r != KVPS_OK) s->ckpt_round = s->max_round; /* (a full disk, say): tried again at the next checkpoint, not every round */
    pthread_mutex_lock(&s->ckpt_mu);
    if (asked != s->ckpt_done) {
        s->ckpt_result = r;
        s->ckpt_done = asked;
        pthread_cond_broadcast(&s->ckpt_cv);
    }
    pthread_mutex_unlock(&s->ckpt_mu);
}

KVPS_API kvps_result kvps_server_checkpoint(kvps_server *s, int timeout_ms) {
    if (!s) return KVPS_ERR_INVALID_ARG;
    if (!s->desc.checkpoint_path || !*s->desc.checkpoint_path) return KVPS_ERR_CONFIG;
    if (!s->started) return kvps__quiescent(s, 1) ? kvps__checkpoint_write(s) : KVPS_ERR_STATE;
    struct timespec until = kvps__deadline_ts(timeout_ms < 0 ? 10000 : timeout_ms);
    pthread_mutex_lock(&s->ckpt_mu);
    uint64_t ticket = __atomic_add_fetch(&s->ckpt_req, 1, __ATOMIC_ACQ_REL);
    char c = 'c';
    ssize_t wr = write(s->stop_pipe[1], &c, 1);
    (void)wr;
    int rc = 0;
    while (s->ckpt_done < ticket && rc == 0) rc = pthread_cond_timedwait(&s->ckpt_cv, &s->ckpt_mu, &until);
    kvps_result r = s->ckpt_done >= ticket ? s->ckpt_result : KVPS_ERR_TIMEOUT;
    pthread_mutex_unlock(&s->ckpt_mu);
    return r;
}

typedef struct kvps__cr { const unsigned char *p; size_t left; } kvps__cr;

/* A restored rule and its hyper-parameters (lr, momentum, beta1, beta2, eps, weight_decay) are
   what CONFIG would have stored: valid and already resolved, a user rule one this server has;
   nstate (unless 0: not allocated yet) matches the rule in force (the server's default for a
   key without a rule of its own). */
static int kvps__ckpt_optim_ok(const kvps_server *s, uint32_t rule, const float *f6, kvps_rule dflt, uint32_t nstate) {
    if (kvps__rule_is_user(rule) && (int)rule - KVPS_RULE_USER >= s->nurules) return 0;
    if (nstate && nstate != kvps__rule_nstate(s, rule != KVPS_RULE_DEFAULT ? (kvps_rule)rule : dflt)) return 0;
    if (rule == KVPS_RULE_DEFAULT) return 1; /* the fields are not used */
    kvps_optim o = {KVPS_RULE_DEFAULT, f6[0], f6[1], f6[2], f6[3], f6[4], f6[5]};
    unsigned char rec[KVPS__OPTREC];
    kvps__optim_rec(&o, rec);
    memcpy(rec, &rule, 4); /* (the rule as stored, whatever it is) */
    if (kvps__optim_read(rec, &o) != KVPS_OK) return 0;
    float back[6] = {o.lr, o.momentum, o.beta1, o.beta2, o.eps, o.weight_decay};
    return memcmp(back, f6, sizeof back) == 0;
}
static int kvps__cr_get(kvps__cr *r, void *out, size_t n) {
    if (r->left < n) return -1;
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

/* The table counters back to 0 (atomic stores: stats are read by other threads). */
static void kvps__stats_tables_zero(kvps_server *s) {
    __atomic_store_n(&s->stats.table_rows, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stats.table_bytes, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stats.table_state_bytes, 0, __ATOMIC_RELAXED);
}

/* Reads one table record (kvps__table_put's) into a new table, *out (not in s's list; set
   whenever it was made, also when the record is then refused); NULL, or why not. */
static const char *kvps__table_get(kvps_server *s, kvps__cr *rd, kvps__table **out) {
    uint64_t tid, seed, nrows;
    uint32_t u[3];
    float fl[6];
    *out = NULL;
    if (kvps__cr_get(rd, &tid, 8) || kvps__cr_get(rd, u, sizeof u) || kvps__cr_get(rd, fl, sizeof fl) ||
        kvps__cr_get(rd, &seed, 8) || kvps__cr_get(rd, &nrows, 8))
        return "truncated table record";
    float f6[6] = {fl[0], fl[1], fl[2], fl[3], fl[4], 0.0f}; /* (a table has no weight decay) */
    if (u[0] == 0 || u[0] > (1u << 20) || u[2] >= KVPS_RULE_COUNT || u[2] == KVPS_RULE_DEFAULT || kvps__rules[u[2]].steps ||
        !kvps__ckpt_optim_ok(s, u[2], f6, KVPS_RULE_SGD, 0) || u[1] != kvps__table_sdim((kvps_rule)u[2], u[0]) ||
        !kvps__finite(fl[5]) || fl[5] < 0 || nrows > rd->left / (8 + ((uint64_t)u[0] + u[1]) * sizeof(float)))
        return "invalid table record";
    kvps__table *t = (kvps__table *)calloc(1, sizeof *t);
    if (!t) return "out of memory";
    *out = t;
    t->id = tid;
    t->dim = u[0];
    t->sdim = u[1];
    t->opt.rule = (kvps_rule)u[2];
    t->opt.lr = fl[0]; t->opt.momentum = fl[1]; t->opt.beta1 = fl[2]; t->opt.beta2 = fl[3]; t->opt.eps = fl[4];
    t->init_scale = fl[5];
    t->seed = seed;
    for (uint64_t j = 0; j < nrows; j++) {
        uint64_t rid = 0;
        kvps__cr_get(rd, &rid, 8);
        uint64_t nbefore = t->nrows, r = kvps__table_row(s, t, rid);
        if (r == UINT64_MAX) return "out of memory";
        if (t->nrows == nbefore) return "a row id twice";
        kvps__cr_get(rd, kvps__row(t, r), (size_t)t->dim * sizeof(float));
        if (t->sdim) kvps__cr_get(rd, kvps__row_state(t, r), (size_t)t->sdim * sizeof(float));
    }
    return NULL;
}

/* Reads one key record (kvps__key_put's, of checkpoint version ver) into a new key; NULL, or
   why not (a user rule this server lacks, or with another state count, is named). */
static const char *kvps__key_get(kvps_server *s, kvps__cr *rd, uint32_t ver) {
    uint64_t key, len, round, step = 0;
    uint32_t rule, nstate;
    float f6[6] = {0}, bt[2];
    if (kvps__cr_get(rd, &key, 8) || kvps__cr_get(rd, &len, 8) || kvps__cr_get(rd, &round, 8) ||
        kvps__cr_get(rd, &rule, 4) || kvps__cr_get(rd, f6, (ver >= 5 ? 6 : 5) * sizeof(float)) || kvps__cr_get(rd, &nstate, 4) ||
        kvps__cr_get(rd, bt, sizeof bt) || (ver >= 5 && kvps__cr_get(rd, &step, 8))) return "truncated key record";
    if (kvps__rule_is_user(rule) && ((int)rule - KVPS_RULE_USER >= s->nurules ||
                                     (nstate && nstate != kvps__rule_nstate(s, (kvps_rule)rule)))) {
        char kt[160];
        snprintf(s->why, sizeof s->why, "%s has user rule %d with %u state floats per value; this server %s",
                 kvps__key_text(s, key, kt, sizeof kt), (int)rule - KVPS_RULE_USER, (unsigned)nstate,
                 (int)rule - KVPS_RULE_USER >= s->nurules ? "does not have that rule" : "declares another n_state for it");
        return s->why;
    }
    if (len == 0 || len > s->desc.max_value_len || (rule >= KVPS_RULE_COUNT && !kvps__rule_is_user(rule)) ||
        kvps__find(s, key) != UINT32_MAX || !kvps__ckpt_optim_ok(s, rule, f6, s->default_opt.rule, nstate) ||
        (nstate && kvps__rule_row_of(kvps__rule_in_force(s, (kvps_rule)rule))->scalars &&
         !(bt[0] > 0.0f && bt[0] <= 1.0f && bt[1] > 0.0f && bt[1] <= 1.0f)))
        return "invalid key record"; /* (scalar state: Adam's bias-correction powers in (0, 1]) */
    /* the bytes must hold what the record announces before anything is allocated for it */
    if ((rd->left - (size_t)s->m * 8) / sizeof(float) / (1 + nstate) < len || rd->left < (size_t)s->m * 8)
        return "truncated values";
    uint32_t ki = kvps__key_create(s, key, len);
    if (ki == UINT32_MAX) return "out of memory";
    kvps__key *k = s->keys[ki];
    k->round = round;
    if (round > s->max_round) s->max_round = round;
    k->opt.rule = (kvps_rule)rule;
    k->opt.lr = f6[0]; k->opt.momentum = f6[1]; k->opt.beta1 = f6[2]; k->opt.beta2 = f6[3]; k->opt.eps = f6[4];
    k->opt.weight_decay = f6[5];
    k->b1t = bt[0];
    k->b2t = bt[1];
    k->step = step;
    if (kvps__cr_get(rd, k->recv, (size_t)s->m * sizeof *k->recv) ||
        kvps__cr_get(rd, k->value, (size_t)len * sizeof(float))) return "truncated values";
    if (nstate) {
        if (len > SIZE_MAX / (nstate * sizeof(float)) || rd->left < (size_t)len * nstate * sizeof(float) ||
            !(k->state = (float *)malloc((size_t)len * nstate * sizeof(float)))) return "truncated optimizer state";
        kvps__cr_get(rd, k->state, (size_t)len * nstate * sizeof(float));
    }
    return NULL;
}

/* Loads a checkpoint's bytes (a file's, or a replica's snapshot) into s, which holds no keys
   or tables; NULL, or why it was refused (and s is left empty). */
static const char *kvps__ckpt_load(kvps_server *s, const unsigned char *buf, size_t size) {
    const char *why = NULL;
    if (size < 8 + 24 + 8 || memcmp(buf, "KVPSCKPT", 8) != 0) why = "not a kvps checkpoint";
    else if (memcmp(buf + size - 4, "KEND", 4) != 0) why = "torn: the end marker is missing";
    uint32_t crc = 0, hdr[6] = {0};
    if (!why) {
        memcpy(&crc, buf + size - 8, 4);
        memcpy(hdr, buf + 8, sizeof hdr);
        if (kvps__crc32(0, buf, size - 8) != crc) why = "checksum mismatch: the file is corrupt";
        else if (hdr[0] < 1 || hdr[0] > KVPS__CKPT_VERSION) why = "another checkpoint version";
        else if (hdr[1] != (uint32_t)s->desc.rank || hdr[2] != (uint32_t)s->m) why = "written by another server (rank or number of workers differ)";
    }
    /* parse everything into fresh keys; only a whole, consistent file is kept */
    kvps__cr rd = {buf ? buf + 8 + sizeof hdr : NULL, why ? 0 : size - 8 - sizeof hdr - 8};
    kvps__place pl;
    memset(&pl, 0, sizeof pl);
    if (!why && hdr[0] == 2) { /* u32 count, then u32 V and n[count]: changes by counts (m = 0) */
        unsigned char pb[8 + 8 * KVPS__PLACE_MAX];
        memset(pb, 0, sizeof pb);
        if (kvps__cr_get(&rd, &pl.count, 4)) why = "truncated placement";
        else if (pl.count == 1 || pl.count > KVPS__PLACE_MAX) why = "invalid placement";
        else if (pl.count) {
            kvps__put32(pb + 4, pl.count);
            if (kvps__cr_get(&rd, pb, 4) || kvps__cr_get(&rd, pb + 8, 4 * (size_t)pl.count)) why = "truncated placement";
            else if (kvps__place_dec(&pl, pb, 8 + 8 * (size_t)pl.count)) why = "invalid placement";
        }
    } else if (!why && hdr[0] >= 3) {
        uint32_t pbytes = 0;
        if (kvps__cr_get(&rd, &pbytes, 4) || pbytes > rd.left) why = "truncated placement";
        else if (pbytes && (kvps__place_dec(&pl, rd.p, pbytes) || pl.count < 2)) why = "invalid placement";
        else { rd.p += pbytes; rd.left -= pbytes; }
    }
    uint32_t gen = 0;
    if (!why && hdr[0] >= 4 && kvps__cr_get(&rd, &gen, 4)) why = "truncated generation";
    if (!why && pl.count) { /* a placement whose changes do not make a map is none */
        const char *bad = NULL;
        uint32_t *vm = kvps__vmap_of(&pl, &bad);
        if (!vm) why = bad && strcmp(bad, "out of memory") == 0 ? "out of memory" : "invalid placement";
        free(vm);
    }
    for (uint32_t i = 0; !why && i < hdr[5]; i++) {
        kvps__table *t = NULL;
        why = kvps__table_get(s, &rd, &t);
        if (t && !why && kvps__table_find(s->tables, t->id)) why = "invalid table record";
        if (t) { t->next = s->tables; s->tables = t; }
    }
    for (uint32_t i = 0; !why && i < hdr[4]; i++) why = kvps__key_get(s, &rd, hdr[0]);
    for (int r = 0; !why && r < s->m; r++)
        if (kvps__cr_get(&rd, &s->barrier_gen[r], 8) || kvps__cr_get(&rd, &s->out[r], 1) ||
            kvps__cr_get(&rd, &s->seen[r].inc, 4) ||
            kvps__cr_get(&rd, &s->seen[r].hi, 8) || kvps__cr_get(&rd, s->seen[r].bits, sizeof s->seen[r].bits))
            why = "truncated worker records";
    if (!why && rd.left != 0) why = "trailing bytes";
    if (!why) {
        kvps__place_free(&s->place);
        s->place = pl;
        s->ckpt_gen = gen;
    } else {
        kvps__place_free(&pl);
        kvps__keys_truncate(s, 0);
        while (s->tables) { kvps__table *t = s->tables; s->tables = t->next; kvps__table_free(t); }
        kvps__stats_tables_zero(s); /* (other threads read stats) */
        s->max_round = 0;
        memset(s->barrier_gen, 0, (size_t)s->m * sizeof *s->barrier_gen);
        memset(s->seen, 0, (size_t)s->m * sizeof *s->seen);
        memset(s->out, 0, (size_t)s->m);
    }
    return why;
}

KVPS_API kvps_result kvps_server_restore(kvps_server *s, const char *path) {
    if (!s || !path) return KVPS_ERR_INVALID_ARG;
    if (s->started || s->nkeys || s->tables) return KVPS_ERR_STATE;
    kvps__ckpt_sweep(s->desc.rank, path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvps__log(KVPS_LOG_ERROR, "server %d: restore: cannot open %s: %s", s->desc.rank, path, strerror(errno));
        return KVPS_ERR_CHECKPOINT;
    }
    unsigned char *buf = NULL;
    size_t size = 0;
    long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (end >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = (unsigned char *)malloc((size_t)end + 1)) != NULL)
        size = fread(buf, 1, (size_t)end, f);
    fclose(f);
    const char *why = !buf || end < 0 || size != (size_t)end ? "cannot read the file" : kvps__ckpt_load(s, buf, size);
    free(buf);
    if (why) {
        kvps__log(KVPS_LOG_ERROR, "server %d: restore from %s refused: %s", s->desc.rank, path, why);
        return KVPS_ERR_CHECKPOINT;
    }
    s->ckpt_round = s->max_round;
    s->restored = 1;
    memset(s->rejoin, 1, (size_t)s->m); /* each worker is served again once it has said hello again (SECURITY) */
    kvps__log(KVPS_LOG_INFO, "server %d: restored %u keys at round %llu from %s (its checkpoint %u)", s->desc.rank, s->nkeys,
              (unsigned long long)s->max_round, path, s->ckpt_gen);
    return KVPS_OK;
}

/* ---- RESHARD: keys moving between servers (KEYS, EXPORT, IMPORT, DROP) ----
   A worker that reshards (kvps_worker_reshard) asks each server which keys it holds, takes the
   records of those whose virtual shard moves (EXPORT), gives them to their new server (IMPORT)
   and then has the old one forget them (DROP). It does so at a barrier, with nothing in flight:
   a key with a round half summed, a parked pull or a held-back push is refused (KVPS_ERR_STATE). */
static int kvps__key_quiet(const kvps_server *s, const kvps__key *k) {
    return !k->waiters && !k->ndef && !kvps__key_half_done(s, k);
}

/* Forgets the keys whose indices are marked in drop[] (nkeys entries). */
static void kvps__keys_forget(kvps_server *s, const uint8_t *drop) {
    uint32_t j = 0, n = s->nkeys;
    for (uint32_t i = 0; i < n; i++) {
        kvps__key *k = s->keys[i];
        if (!drop[i]) { s->keys[j++] = k; continue; }
        KVPS__STAT_ADD(s, keys, (uint64_t)-1);
        KVPS__STAT_ADD(s, value_bytes, (uint64_t)0 - k->len * sizeof(float));
        kvps__key_free(k, s->m);
    }
    s->nkeys = j;
    kvps__keys_truncate(s, j); /* (rebuilds the index) */
}

/* Closes the memory stream f (open_memstream's *buf and *size are final then) and answers q
   with its bytes, or refuses q (KVPS_ERR_NOMEM) when f could not be made or written (err). */
static void kvps__reply_stream(kvps_server *s, kvps__rq *q, FILE *f, int err, char **buf, size_t *size) {
    if (!f || fclose(f) != 0 || err) {
        free(*buf);
        kvps__refuse(s, q, KVPS_ERR_NOMEM, "%s", q->op->name);
        return;
    }
    kvps__hdr h = kvps__reply_hdr(&q->h, KVPS_OK);
    h.nkeys = 0;
    zmq_msg_t fr[3];
    kvps__reply_start(fr, q->id, 0, &h);
    kvps__msg_from_buf(&fr[2], *buf, *size);
    free(*buf);
    kvps__server_send(s, fr, 3);
}

/* ---- sparse tables' rows in a reshard: EXPORT_ROWS, IMPORT_ROWS, DROP_ROWS ----
   Rows live in virtual shards (kvps__row_vshard) like keys; a reshard moves a shard's rows of
   every table. The tables a server changes are rebuilt apart and swapped in only when all are
   built, so a refusal (or no memory) leaves every table as it was. */
static void kvps__stats_tables_recount(kvps_server *s) {
    uint64_t rows = 0, bytes = 0, sbytes = 0;
    for (const kvps__table *t = s->tables; t; t = t->next) {
        rows += t->nrows;
        bytes += t->hcap * (sizeof *t->hk + sizeof *t->hv) + t->nrows * t->dim * sizeof(float);
        sbytes += t->nrows * t->sdim * sizeof(float);
    }
    __atomic_store_n(&s->stats.table_rows, rows, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stats.table_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&s->stats.table_state_bytes, sbytes, __ATOMIC_RELAXED);
}

/* Copies row r of t into a new row id of n; 0, or -1 out of memory. */
static int kvps__row_copy(kvps_server *s, kvps__table *n, const kvps__table *t, uint64_t id, uint64_t r) {
    uint64_t r2 = kvps__table_row(s, n, id);
    if (r2 == UINT64_MAX) return -1;
    memcpy(kvps__row(n, r2), kvps__row(t, r), (size_t)t->dim * sizeof(float));
    if (t->sdim) memcpy(kvps__row_state(n, r2), kvps__row_state(t, r), (size_t)t->sdim * sizeof(float));
    return 0;
}

/* A new table configured as t with t's rows but those drop has, plus every row of more (NULL:
   none); NULL out of memory. */
static kvps__table *kvps__table_rebuilt(kvps_server *s, const kvps__table *t, const kvps__rowsel *drop, const kvps__table *more) {
    kvps__table *n = (kvps__table *)calloc(1, sizeof *n);
    if (!n) return NULL;
    n->id = t->id; n->dim = t->dim; n->sdim = t->sdim; n->opt = t->opt; n->init_scale = t->init_scale; n->seed = t->seed;
    for (int pass = 0; pass < 2; pass++) {
        const kvps__table *src = pass ? more : t;
        for (uint64_t j = 0; src && j < src->hcap; j++) {
            if (!src->hv[j] || (!pass && drop && kvps__rowsel_has(drop, t->id, src->hk[j]))) continue;
            if (kvps__row_copy(s, n, src, src->hk[j], src->hv[j] - 1) != 0) { kvps__table_free(n); return NULL; }
        }
    }
    return n;
}

/* t takes n's rows (n is freed, with t's old ones). */
static void kvps__table_swap(kvps__table *t, kvps__table *n) {
    kvps__table old = *t;
    *t = *n;
    t->next = old.next;
    old.next = NULL;
    *n = old;
    kvps__table_free(n);
}

static int kvps__table_same(const kvps__table *a, const kvps__table *b) {
    return a->dim == b->dim && a->sdim == b->sdim && memcmp(&a->opt, &b->opt, sizeof a->opt) == 0 &&
           a->init_scale == b->init_scale && a->seed == b->seed;
}

/* Table id taken out of list (NULL: not there). */
static kvps__table *kvps__table_take(kvps__table **list, uint64_t id) {
    for (kvps__table **pp = list; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            kvps__table *t = *pp;
            *pp = t->next;
            t->next = NULL;
            return t;
        }
    return NULL;
}

static void kvps__tables_free(kvps__table *list) {
    while (list) { kvps__table *t = list; list = t->next; kvps__table_free(t); }
}

/* EXPORT_ROWS and DROP_ROWS: u32 V, then the virtual shards (sorted here), each < V. */
static const char *kvps__rowsel_read(kvps__rowsel *sel, const unsigned char *v, size_t vb, uint32_t **own) {
    *own = NULL;
    if (vb < 4 || vb % 4) return "not a u32 V and u32 shards";
    memcpy(&sel->V, v, 4);
    sel->n = (uint32_t)(vb / 4 - 1);
    if (sel->V == 0 || sel->V > 256u * KVPS__PLACE_SERVERS_MAX) return "V out of range";
    uint32_t *sh = (uint32_t *)malloc((size_t)sel->n * 4 + 4);
    if (!sh) return "out of memory";
    if (sel->n) memcpy(sh, v + 4, (size_t)sel->n * 4);
    qsort(sh, sel->n, 4, kvps__u32_cmp);
    for (uint32_t i = 0; i < sel->n; i++)
        if (sh[i] >= sel->V || (i && sh[i] == sh[i - 1])) { free(sh); return "a shard out of range, or named twice"; }
    sel->shard = *own = sh;
    return NULL;
}

static void kvps__serve_rows(kvps_server *s, kvps__rq *q, const unsigned char *v, size_t vb) {
    int op = q->h.op;
    const char *why = NULL;
    kvps_result rc = KVPS_ERR_MALFORMED;
    if (op == KVPS__OP_IMPORT_ROWS) {
        kvps__table *in = NULL, *built = NULL; /* the records; the tables here rebuilt with them */
        kvps__cr rd = {v, vb};
        while (!why && rd.left) {
            kvps__table *t = NULL;
            why = kvps__table_get(s, &rd, &t);
            if (!t) break;
            if (!why && kvps__table_find(in, t->id)) why = "a table twice";
            t->next = in;
            in = t;
            const kvps__table *here = why ? NULL : kvps__table_find(s->tables, t->id);
            if (here && !kvps__table_same(here, t)) { why = "a table configured otherwise here"; rc = KVPS_ERR_TABLE; }
            for (uint64_t j = 0; here && !why && j < t->hcap; j++)
                if (t->hv[j] && kvps__table_lookup(here, t->hk[j]) != UINT64_MAX) { why = "a row this server holds already"; rc = KVPS_ERR_STATE; }
        }
        for (kvps__table *t = in; t && !why; t = t->next) {
            const kvps__table *here = kvps__table_find(s->tables, t->id);
            kvps__table *n = here ? kvps__table_rebuilt(s, here, NULL, t) : NULL;
            if (here && !n) { why = "out of memory"; rc = KVPS_ERR_NOMEM; }
            if (n) { n->next = built; built = n; }
        }
        if (why) {
            kvps__tables_free(in);
            kvps__tables_free(built);
            kvps__stats_tables_recount(s);
            kvps__refuse(s, q, rc, "import_rows: %s", why);
            return;
        }
        uint64_t nrows = 0;
        while (in) {
            kvps__table *t = in;
            in = t->next;
            nrows += t->nrows;
            kvps__table *here = kvps__table_find(s->tables, t->id);
            if (!here) { t->next = s->tables; s->tables = t; continue; }
            kvps__table_swap(here, kvps__table_take(&built, t->id));
            kvps__table_free(t);
        }
        kvps__stats_tables_recount(s);
        kvps__log(KVPS_LOG_INFO, "server %d: %llu table rows moved in", s->desc.rank, (unsigned long long)nrows);
        kvps__reply_ack(s, q->id, &q->h);
        return;
    }
    kvps__rowsel sel;
    uint32_t *own = NULL;
    why = kvps__rowsel_read(&sel, v, vb, &own);
    if (why) {
        kvps__refuse(s, q, strcmp(why, "out of memory") ? KVPS_ERR_MALFORMED : KVPS_ERR_NOMEM, "%s: %s", q->op->name, why);
        return;
    }
    if (op == KVPS__OP_DROP_ROWS) {
        kvps__table *built = NULL;
        for (const kvps__table *t = s->tables; t; t = t->next) {
            kvps__table *n = kvps__table_rebuilt(s, t, &sel, NULL);
            if (!n) { why = "out of memory"; break; }
            n->next = built;
            built = n;
        }
        free(own);
        if (why) {
            kvps__tables_free(built);
            kvps__stats_tables_recount(s);
            kvps__refuse(s, q, KVPS_ERR_NOMEM, "drop_rows: %s", why);
            return;
        }
        uint64_t before = 0, after = 0;
        for (kvps__table *t = s->tables; t; t = t->next) {
            kvps__table *n = kvps__table_take(&built, t->id);
            before += t->nrows;
            after += n->nrows;
            kvps__table_swap(t, n);
        }
        kvps__stats_tables_recount(s);
        kvps__log(KVPS_LOG_INFO, "server %d: %llu table rows moved out", s->desc.rank, (unsigned long long)(before - after));
        kvps__reply_ack(s, q->id, &q->h);
        return;
    }
    /* EXPORT_ROWS */
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    kvps__cw w = {f, 0, 0};
    for (const kvps__table *t = s->tables; f && t; t = t->next) kvps__table_put(&w, t, &sel);
    free(own);
    kvps__reply_stream(s, q, f, w.err, &buf, &size);
}

/* PLACE: the placement a reshard has made, for checkpoints and hellos. */
static void kvps__move_place(kvps_server *s, kvps__rq *q, const unsigned char *v, size_t vb) {
    kvps__place p;
    const char *why = kvps__place_dec(&p, v, vb);
    if (!why && p.count < 2) why = "a placement that never changed";
    uint32_t *vm = why ? NULL : kvps__vmap_of(&p, &why); /* (its changes make a map) */
    free(vm);
    if (why) {
        kvps__place_free(&p);
        kvps__refuse(s, q, strcmp(why, "out of memory") ? KVPS_ERR_MALFORMED : KVPS_ERR_NOMEM, "place: %s", why);
        return;
    }
    char text[200];
    kvps__place_free(&s->place);
    s->place = p;
    kvps__log(KVPS_LOG_INFO, "server %d: keys now placed by %s", s->desc.rank, kvps__place_text(&p, text, sizeof text));
    kvps__reply_ack(s, q->id, &q->h);
}

/* IMPORT: key records taken in, new keys only; all or none. */
static void kvps__move_import(kvps_server *s, kvps__rq *q, const unsigned char *v, size_t vb) {
    uint32_t n0 = s->nkeys;
    kvps__cr rd = {v, vb};
    const char *why = NULL;
    while (!why && rd.left) {
        uint64_t key;
        if (rd.left >= 8) memcpy(&key, rd.p, 8);
        if (rd.left >= 8 && kvps__find(s, key) != UINT32_MAX) why = "a key this server holds already";
        else why = kvps__key_get(s, &rd, KVPS__CKPT_VERSION);
    }
    if (why) {
        kvps__keys_truncate(s, n0);
        kvps__refuse(s, q, KVPS_ERR_MALFORMED, "import: %s (after %u keys)", why, s->nkeys - n0);
        return;
    }
    kvps__log(KVPS_LOG_INFO, "server %d: %u keys moved in", s->desc.rank, s->nkeys - n0);
    kvps__reply_ack(s, q->id, &q->h);
}

/* KEYS, EXPORT, DROP: the n keys named in v (KEYS: none, all are listed) are each held here,
   named once and between rounds; DROP forgets them, the others answer with records. */
static void kvps__move_keys(kvps_server *s, kvps__rq *q, const unsigned char *v, size_t vb) {
    int op = q->h.op;
    size_t n = vb / 8;
    uint8_t *mark = (uint8_t *)calloc((size_t)s->nkeys + 1, 1);
    if (!mark) { kvps__refuse(s, q, KVPS_ERR_NOMEM, "%s", q->op->name); return; }
    for (size_t i = 0; i < n; i++) {
        uint64_t key;
        memcpy(&key, v + 8 * i, 8);
        uint32_t ki = kvps__find(s, key);
        const char *bad = ki == UINT32_MAX ? "not held here" : mark[ki] ? "named twice" : !kvps__key_quiet(s, s->keys[ki]) ? "in the middle of a round" : NULL;
        if (bad) {
            char what[300];
            kvps__refuse(s, q, ki != UINT32_MAX && !kvps__key_quiet(s, s->keys[ki]) ? KVPS_ERR_STATE : KVPS_ERR_MALFORMED,
                         "%s: %s: %s", q->op->name, kvps__key_text(s, key, what, sizeof what), bad);
            free(mark);
            return;
        }
        mark[ki] = 1;
    }
    if (op == KVPS__OP_DROP) {
        kvps__keys_forget(s, mark);
        free(mark);
        kvps__log(KVPS_LOG_INFO, "server %d: %zu keys moved out", s->desc.rank, n);
        kvps__reply_ack(s, q->id, &q->h);
        return;
    }
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    kvps__cw w = {f, 0, 0};
    if (f && op == KVPS__OP_KEYS) {
        for (uint32_t i = 0; i < s->nkeys; i++) {
            kvps__kent e = {s->keys[i]->key, s->keys[i]->len};
            kvps__cw_put(&w, &e, sizeof e);
        }
    } else if (f) {
        for (size_t i = 0; i < n; i++) {
            uint64_t key;
            memcpy(&key, v + 8 * i, 8);
            kvps__key_put(s, &w, s->keys[kvps__find(s, key)]);
        }
    }
    free(mark);
    kvps__reply_stream(s, q, f, w.err, &buf, &size);
}

/* The RESHARD ops (KEYS ... PLACE_GET): the frame shape, then each op's own. */
static void kvps__serve_move(kvps_server *s, kvps__rq *q) {
    int op = q->h.op, want = q->op->values ? 3 : 2;
    if (q->nfr != want || q->h.nkeys != 0 || q->msz != KVPS__HDR) {
        kvps__refuse(s, q, KVPS_ERR_MALFORMED, "%s: %d frames, %u keys in the meta frame", q->op->name, q->nfr - 1, q->h.nkeys);
        return;
    }
    size_t vb = want == 3 ? zmq_msg_size(&q->fr[2]) : 0;
    const unsigned char *v = want == 3 ? (const unsigned char *)zmq_msg_data(&q->fr[2]) : NULL;
    if (op == KVPS__OP_EXPORT_ROWS || op == KVPS__OP_IMPORT_ROWS || op == KVPS__OP_DROP_ROWS) {
        kvps__serve_rows(s, q, v, vb);
        return;
    }
    if ((op == KVPS__OP_EXPORT || op == KVPS__OP_DROP) && vb % 8) {
        kvps__refuse(s, q, KVPS_ERR_MALFORMED, "%s: %zu bytes of keys", q->op->name, vb);
        return;
    }
    if (op == KVPS__OP_PLACE_GET) {
        if (!s->place.count) kvps__refuse(s, q, KVPS_ERR_STATE, "place_get: this server's keys were never resharded");
        else kvps__reply_place(s, q);
        return;
    }
    if (op == KVPS__OP_PLACE) {
        kvps__move_place(s, q, v, vb);
        return;
    }
    kvps__flush_all(s);
    if (op == KVPS__OP_IMPORT) kvps__move_import(s, q, v, vb);
    else kvps__move_keys(s, q, v, vb);
}

// >>replicas
/* A ROUND message is still to go (rounds applied or pushes completed since the last one). */
static int kvps__round_pending(const kvps_server *s) { return s->rb.len || s->rd.len; }
/* REPLICAS: each shard is a chain of servers (its entry of the server list, joined by '|').
   The primary sends every request that can change state (all but pulls and STATUS; under BSP
   not the pushes either, but each round's sum: see "rounds, not pushes" below), in the
   order it serves them, to each backup, which serves the same request through the same code
   (kvps__handle) with its replies going nowhere: the arithmetic is the same, so the backups
   hold the same bits. A reply the primary makes is held until every live backup has
   acknowledged every request sent before it, so whatever a worker was told survives the
   primary. A backup link starts with a snapshot (the checkpoint's bytes plus the session
   state), taken when no round is half summed; the requests served after it follow in order.
   Workers move to the next replica when a primary stays unreachable (failover_ms); a backup
   takes over only when its primary's connection is gone. */
enum { KVPS__LINK_DOWN, KVPS__LINK_JOINING, KVPS__LINK_SNAP, KVPS__LINK_LIVE };
typedef struct kvps__link {
    void *sock, *mon;   /* DEALER to that replica, and its connection events */
    int state;          /* KVPS__LINK_* */
    int wait_for;       /* a replica of the first chain: replies wait for it until it joins, or
                           until it has not connected for peer_timeout_ms */
    int64_t since;      /* when it went down (or was first looked for) */
    uint64_t acked;     /* the last sequence it acknowledged */
    uint64_t snap_seq;  /* the sequence its snapshot was taken at */
} kvps__link;
typedef struct kvps__held {
    zmq_msg_t f[3];
    int n;
    uint64_t tag; /* the sequence every live backup must hold before it goes */
} kvps__held;

static void kvps__handle(kvps_server *s, zmq_msg_t *fr, int nfr);

/* What every backup that replies wait for has acknowledged (a live one: its last
   acknowledgement; one of the first chain that has not joined yet: nothing); UINT64_MAX when
   none is waited for. */
static uint64_t kvps__repl_floor(const kvps_server *s) {
    uint64_t lo = UINT64_MAX;
    for (int j = 0; j < s->nrep; j++) {
        const kvps__link *l = &s->links[j];
        if (j == s->desc.replica || !l->sock) continue;
        uint64_t a = l->state == KVPS__LINK_LIVE ? l->acked : l->wait_for ? 0 : UINT64_MAX;
        if (a < lo) lo = a;
    }
    return lo;
}

/* The replica counters in stats (read by other threads). */
static void kvps__repl_stats(kvps_server *s) {
    uint64_t live = s->role == KVPS__ROLE_PRIMARY ? 1 : (uint64_t)s->synced;
    for (int j = 0; s->role == KVPS__ROLE_PRIMARY && j < s->nrep; j++)
        live += j != s->desc.replica && s->links[j].state == KVPS__LINK_LIVE;
    __atomic_store_n(&s->stats.primary, (uint64_t)(s->role == KVPS__ROLE_PRIMARY), __ATOMIC_RELAXED);
    __atomic_store_n(&s->stats.replicas_live, live, __ATOMIC_RELAXED);
}

/* Sends the held replies that every live backup now covers. */
static void kvps__repl_release(kvps_server *s) {
    if (s->fenced) { /* every backup waited for has gone past peer_timeout_ms unreachable: alone, it goes on */
        int waited = 0;
        for (int j = 0; j < s->nrep; j++) waited |= j != s->desc.replica && s->links[j].sock && s->links[j].wait_for;
        if (waited) return;
        s->fenced = 0;
        kvps__log(KVPS_LOG_WARN, "server %d replica %d: no backup confirmed or replaced this primary in time: going on as the primary",
                  s->desc.rank, s->desc.replica);
    }
    uint64_t lo = kvps__repl_floor(s);
    while (s->nheld && s->held[s->held_head].tag <= lo) {
        kvps__held *h = &s->held[s->held_head];
        if (kvps__send_frames(s->router, h->f, h->n) != 0) KVPS__STAT_ADD(s, replies_dropped, 1);
        s->held_head = (s->held_head + 1) % s->cap_held;
        s->nheld--;
    }
}

/* A reply to hold (its frames move here); 0, or -1 when out of memory (then sent at once). */
static int kvps__repl_hold(kvps_server *s, zmq_msg_t *frames, int n) {
    if (s->nheld == s->cap_held) {
        size_t nc = s->cap_held ? 2 * s->cap_held : 64;
        kvps__held *nh = (kvps__held *)malloc(nc * sizeof *nh);
        if (!nh) return -1;
        for (size_t i = 0; i < s->nheld; i++) nh[i] = s->held[(s->held_head + i) % s->cap_held];
        free(s->held);
        s->held = nh;
        s->held_head = 0;
        s->cap_held = nc;
    }
    kvps__held *h = &s->held[(s->held_head + s->nheld) % s->cap_held];
    for (int i = 0; i < n; i++) h->f[i] = frames[i];
    h->n = n;
    h->tag = s->fwd_seq + (uint64_t)kvps__round_pending(s); /* a ROUND message still to go is the next */
    s->nheld++;
    return 0;
}

/* A REPL header (kvps__rhdr): kind, this server's epoch, sequence seq, its place in the chain. */
static kvps__hdr kvps__repl_hdr(const kvps_server *s, int kind, uint64_t seq) {
    kvps__rhdr r;
    kvps__hdr h;
    memset(&r, 0, sizeof r);
    r.magic = KVPS__MAGIC;
    r.version = KVPS__VERSION;
    r.op = KVPS__OP_REPL;
    r.kind = (uint32_t)kind;
    r.epoch = s->epoch;
    r.seq = seq;
    r.place = (uint32_t)s->desc.replica;
    memcpy(&h, &r, sizeof h);
    return h;
}

/* Sends [hdr][frames...] (copies of them) to every backup that takes the stream: a worker's
   request [id][meta][values?] (FWD, before it is served), or an event of the primary's. */
static void kvps__repl_send(kvps_server *s, int kind, zmq_msg_t *frames, int n) {
    s->fwd_seq++;
    kvps__hdr h = kvps__repl_hdr(s, kind, s->fwd_seq);
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || !l->sock || (l->state != KVPS__LINK_SNAP && l->state != KVPS__LINK_LIVE)) continue;
        zmq_msg_t f[5];
        kvps__msg_from_buf(&f[0], &h, sizeof h);
        for (int i = 0; i < n; i++) { zmq_msg_init(&f[i + 1]); zmq_msg_copy(&f[i + 1], &frames[i]); }
        size_t bytes = sizeof h;
        for (int i = 0; i < n; i++) bytes += zmq_msg_size(&frames[i]);
        KVPS__STAT_ADD(s, repl_bytes, bytes);
        if (kvps__send_frames(l->sock, f, n + 1) != 0) {
            kvps__log(KVPS_LOG_WARN, "server %d replica %d: sending to backup replica %d (%s) failed: %s; it must join again",
                      s->desc.rank, s->desc.replica, j, s->chain[j], zmq_strerror(zmq_errno()));
            l->state = KVPS__LINK_JOINING;
        }
    }
}

/* ---- REPLICAS under BSP: rounds, not pushes ----
   Under BSP (not elastic) the primary does not send the pushes down the chain: each round it
   applies goes as one record, its sum and who is in it, so a backup receives 1 / num_workers of
   the pushed bytes and applies the same sum through the same code (kvps__apply: the same bits,
   optimizer state and round counters). The rounds a request completes go in one ROUND message,
   [done][records], after it is served:
     done     u32 records, u32 pushes done; per push done: u32 worker, u32 incarnation, u64 sequence
     record   u64 key, u64 len, u64 round (after it), u32 contributions, u32 0; per worker: u32
              incarnation, u32 in it (0/1), u64 sequence; then the sum, len floats padded to 8 bytes
   A push is answered (kvps__preq) once each round it is in has been applied and sent, and its
   answer is held until the backups acknowledge that message, so an answered push survives the
   primary. A push in flight when the primary dies is re-sent to the backup that takes over:
   one not done is served again, except the keys whose round already reached the backup (the
   record's sequence per worker, kept as the key's dtag). */

/* Primary: the backups cannot follow (out of memory for what they need): each starts again
   from a snapshot. */
static void kvps__repl_resync(kvps_server *s, const char *why) {
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || !l->sock || (l->state != KVPS__LINK_SNAP && l->state != KVPS__LINK_LIVE)) continue;
        l->state = KVPS__LINK_JOINING;
        kvps__log(KVPS_LOG_WARN, "server %d replica %d: %s; replica %d (%s) gets a snapshot", s->desc.rank, s->desc.replica,
                  why, j, s->chain[j]);
    }
}

/* n more bytes at the end of b (NULL when out of memory). */
static unsigned char *kvps__gbuf_add(struct kvps__gbuf *b, size_t n) {
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc < b->len + n) nc *= 2;
        unsigned char *np = (unsigned char *)realloc(b->p, nc);
        if (!np) return NULL;
        b->p = np;
        b->cap = nc;
    }
    b->len += n;
    return b->p + b->len - n;
}

enum { KVPS__RREC = 32, KVPS__RTAG = 16, KVPS__RDONE = 16 };

/* A push being served: its entry, tag = index + 1 (0 when out of memory). */
static uint32_t kvps__preq_new(kvps_server *s, const kvps__rq *q) {
    if (!s->preq_free) {
        uint32_t nc = s->cap_preq ? 2 * s->cap_preq : 64;
        kvps__preq *np = (kvps__preq *)realloc(s->preq, nc * sizeof *np); /* (zmq_msg_t moves as bytes: the held ring does too) */
        if (!np) return 0;
        s->preq = np;
        for (uint32_t i = s->cap_preq; i < nc; i++) { np[i].left = 0; np[i].next_free = i + 1 < nc ? i + 2 : s->preq_free; }
        s->preq_free = s->cap_preq + 1;
        s->cap_preq = nc;
    }
    uint32_t t = s->preq_free;
    kvps__preq *p = &s->preq[t - 1];
    s->preq_free = p->next_free;
    p->left = 1;
    p->ack = q->h.op == KVPS__OP_PUSH;
    p->answered = p->refused = 0;
    zmq_msg_init(&p->id);
    zmq_msg_copy(&p->id, q->id);
    p->hdr = q->h;
    s->npreq++;
    return t;
}

/* One of a push's contributions is in an applied round (or its hold ends): at 0 it is done. */
static void kvps__preq_drop(kvps_server *s, uint32_t tag) {
    kvps__preq *p = &s->preq[tag - 1];
    if (--p->left) return;
    if (!p->refused) {
        unsigned char *d = kvps__gbuf_add(&s->rd, KVPS__RDONE);
        if (d) {
            uint64_t seq = p->hdr.req_id >> 24;
            kvps__put32(d, p->hdr.rank);
            kvps__put32(d + 4, p->hdr.status);
            memcpy(d + 8, &seq, 8);
        } else {
            kvps__repl_resync(s, "no memory to record a push as applied");
        }
        if (p->ack && !p->answered) kvps__reply_ack(s, &p->id, &p->hdr); /* held until the backups have its rounds */
    }
    zmq_msg_close(&p->id);
    p->next_free = s->preq_free;
    s->preq_free = tag;
    s->npreq--;
}

/* A duplicate of a PUSH still waiting for its rounds: 1 (its answer will go to the new routing
   id), else 0. */
static int kvps__repl_resent(kvps_server *s, const kvps__hdr *h, zmq_msg_t *id) {
    for (uint32_t i = 0; s->npreq && i < s->cap_preq; i++) {
        kvps__preq *p = &s->preq[i];
        if (!p->left || !p->ack || p->answered || p->hdr.rank != h->rank || p->hdr.req_id != h->req_id || p->hdr.status != h->status)
            continue;
        zmq_msg_close(&p->id);
        zmq_msg_init(&p->id);
        zmq_msg_copy(&p->id, id);
        return 1;
    }
    return 0;
}

/* Answers a waiting PUSH with KVPS_ERR_PEER_LOST and why; it stays applied (in the re-send
   window), as a pushpull whose pull fails. */
static void kvps__preq_fail_one(kvps_server *s, uint32_t tag, const char *why) {
    kvps__preq *p = &s->preq[tag - 1];
    if (!p->ack || p->answered) return;
    p->answered = 1;
    kvps__hdr h = p->hdr;
    h.status = 0; /* (an error reply to status 0 leaves the re-send window alone) */
    kvps__reply_error(s, &p->id, &h, KVPS_ERR_PEER_LOST, "%s", why);
}

/* The waiting PUSHes in key k's round and buffers (k NULL: all of them) are told why their
   rounds cannot complete. */
static void kvps__repl_fail(kvps_server *s, kvps__key *k, const char *why) {
    if (!k) {
        for (uint32_t i = 0; s->npreq && i < s->cap_preq; i++)
            if (s->preq[i].left) kvps__preq_fail_one(s, i + 1, why);
        return;
    }
    for (int r = 0; r < s->m; r++) {
        if (k->ctag && k->ctag[r]) kvps__preq_fail_one(s, k->ctag[r], why);
        for (kvps__pend *p = k->qhead ? k->qhead[r] : NULL; p; p = p->next)
            if (p->tag) kvps__preq_fail_one(s, p->tag, why);
    }
}

/* Forgets every waiting push (a backup loading a snapshot, or taking over). */
static void kvps__preq_clear(kvps_server *s) {
    for (uint32_t i = 0; i < s->cap_preq; i++)
        if (s->preq[i].left) zmq_msg_close(&s->preq[i].id);
    free(s->preq);
    s->preq = NULL;
    s->npreq = s->cap_preq = s->preq_free = 0;
    s->rb.len = s->rd.len = 0;
    s->rb_keys = 0;
}

/* Primary: key k's round is applied with the sum in accum of count contributions: its record. */
static void kvps__round_note(kvps_server *s, kvps__key *k, int count) {
    size_t fl = (size_t)k->len * sizeof(float), rec = KVPS__RREC + (size_t)s->m * KVPS__RTAG + ((fl + 7) & ~(size_t)7);
    unsigned char *p = kvps__gbuf_add(&s->rb, rec);
    if (!p) kvps__repl_resync(s, "no memory for a round's record");
    else {
        uint32_t c = (uint32_t)count, zero = 0;
        memcpy(p, &k->key, 8);
        memcpy(p + 8, &k->len, 8);
        memcpy(p + 16, &k->round, 8);
        memcpy(p + 24, &c, 4);
        memcpy(p + 28, &zero, 4);
        unsigned char *t = p + KVPS__RREC;
        for (int r = 0; r < s->m; r++, t += KVPS__RTAG) {
            uint32_t tag = k->ctag ? k->ctag[r] : 0, inc = tag ? s->preq[tag - 1].hdr.status : 0, in = tag != 0;
            uint64_t seq = tag ? s->preq[tag - 1].hdr.req_id >> 24 : 0;
            memcpy(t, &inc, 4);
            memcpy(t + 4, &in, 4);
            memcpy(t + 8, &seq, 8);
            if (inc && (k->dtag || (k->dtag = (uint64_t *)calloc(2 * (size_t)s->m, sizeof *k->dtag)))) {
                k->dtag[2 * r] = inc; /* (as the backups keep it: a READ here waits on it too) */
                k->dtag[2 * r + 1] = seq;
            }
        }
        memcpy(t, k->accum, fl);
        if (fl & 7) memset(t + fl, 0, 8 - (fl & 7));
        s->rb_keys++;
    }
    for (int r = 0; k->ctag && r < s->m; r++)
        if (k->ctag[r]) {
            uint32_t tag = k->ctag[r];
            k->ctag[r] = 0;
            kvps__preq_drop(s, tag);
        }
}

static void kvps__gbuf_free(void *data, void *hint) { (void)hint; free(data); }

/* Primary: the rounds noted since the last message, down the chain as one ROUND message. */
static void kvps__round_send(kvps_server *s) {
    if (!kvps__round_pending(s)) return;
    zmq_msg_t f[2];
    size_t dn = 8 + s->rd.len;
    zmq_msg_init_size(&f[0], dn); /* (a few bytes: zmq keeps small messages inline) */
    unsigned char *d = (unsigned char *)zmq_msg_data(&f[0]);
    kvps__put32(d, s->rb_keys);
    kvps__put32(d + 4, (uint32_t)(s->rd.len / KVPS__RDONE));
    if (s->rd.len) memcpy(d + 8, s->rd.p, s->rd.len);
    if (s->rb.len && zmq_msg_init_data(&f[1], s->rb.p, s->rb.len, kvps__gbuf_free, NULL) == 0) {
        s->rb.p = NULL; /* (the message owns it now) */
        s->rb.cap = 0;
    } else {
        kvps__msg_from_buf(&f[1], s->rb.p, s->rb.len);
    }
    kvps__repl_send(s, KVPS__REPL_ROUND, f, 2);
    zmq_msg_close(&f[0]);
    zmq_msg_close(&f[1]);
    s->rb.len = s->rd.len = 0;
    s->rb_keys = 0;
    kvps__repl_release(s); /* (no backup waited for: what was held for this message goes) */
}

/* Backup: a ROUND message applied; NULL, or why not (then the primary sends a snapshot). */
static const char *kvps__round_apply(kvps_server *s, zmq_msg_t *done, zmq_msg_t *recs, char *why, size_t nwhy) {
    size_t dn = zmq_msg_size(done), rn = zmq_msg_size(recs), tags = (size_t)s->m * KVPS__RTAG;
    const unsigned char *d = (const unsigned char *)zmq_msg_data(done), *r0 = (const unsigned char *)zmq_msg_data(recs);
    uint32_t nk, nd;
    if (dn < 8) return "a round message without its counts";
    memcpy(&nk, d, 4);
    memcpy(&nd, d + 4, 4);
    if ((dn - 8) / KVPS__RDONE != nd || (dn - 8) % KVPS__RDONE) return "a round message whose done list is not its count";
    /* checked whole first: sizes, lengths, counts, workers */
    size_t off = 0;
    for (uint32_t i = 0; i < nk; i++) {
        uint64_t key, len;
        uint32_t c;
        if (rn - off < KVPS__RREC + tags) return "a round record cut short";
        memcpy(&key, r0 + off, 8);
        memcpy(&len, r0 + off + 8, 8);
        memcpy(&c, r0 + off + 24, 4);
        if (len == 0 || len > s->desc.max_value_len || c == 0 || c > (uint32_t)s->m) {
            snprintf(why, nwhy, "round record of key %llu: length %llu, %u contributions", (unsigned long long)key,
                     (unsigned long long)len, c);
            return why;
        }
        uint32_t ix = kvps__find(s, key);
        if (ix != UINT32_MAX && s->keys[ix]->len != len) {
            snprintf(why, nwhy, "round record of key %llu: length %llu, held %llu", (unsigned long long)key,
                     (unsigned long long)len, (unsigned long long)s->keys[ix]->len);
            return why;
        }
        size_t fl = ((size_t)len * sizeof(float) + 7) & ~(size_t)7;
        if (rn - off - KVPS__RREC - tags < fl) return "a round record cut short";
        off += KVPS__RREC + tags + fl;
    }
    if (off != rn) return "bytes after the last round record";
    off = 0;
    for (uint32_t i = 0; i < nk; i++) {
        const unsigned char *p = r0 + off;
        uint64_t key, len, round;
        uint32_t c;
        memcpy(&key, p, 8);
        memcpy(&len, p + 8, 8);
        memcpy(&round, p + 16, 8);
        memcpy(&c, p + 24, 4);
        off += KVPS__RREC + tags + (((size_t)len * sizeof(float) + 7) & ~(size_t)7);
        uint32_t ix = kvps__find(s, key);
        if (ix == UINT32_MAX && (ix = kvps__key_create(s, key, len)) == UINT32_MAX) return "no memory for a key";
        kvps__key *k = s->keys[ix];
        if (round != k->round + 1) {
            snprintf(why, nwhy, "round %llu of key %llu, but this replica holds round %llu", (unsigned long long)round,
                     (unsigned long long)key, (unsigned long long)k->round);
            return why;
        }
        const float *sum = (const float *)(const void *)(p + KVPS__RREC + tags);
        if (!kvps__aligned(sum)) {
            float *a = kvps__dscratch(s, len);
            if (!a) return "no memory";
            memcpy(a, sum, (size_t)len * sizeof(float));
            sum = a;
        }
        if (kvps__apply(s, k, sum, (int)c) != 0) return "no memory to apply a round";
        for (int r = 0; r < s->m; r++) {
            const unsigned char *t = p + KVPS__RREC + (size_t)r * KVPS__RTAG;
            uint32_t inc, in;
            uint64_t seq;
            memcpy(&inc, t, 4);
            memcpy(&in, t + 4, 4);
            memcpy(&seq, t + 8, 8);
            if (!in) continue;
            if (k->recv[r] < k->round) k->recv[r] = k->round;
            if (!inc) continue;
            if (!k->dtag && !(k->dtag = (uint64_t *)calloc(2 * (size_t)s->m, sizeof *k->dtag))) return "no memory";
            k->dtag[2 * r] = inc;
            k->dtag[2 * r + 1] = seq;
        }
        if (k->waiters) kvps__wake(s, k); /* READs that waited for this round */
    }
    for (uint32_t i = 0; i < nd; i++) { /* pushes whose every round is here: a re-send is a duplicate */
        uint32_t r, inc;
        uint64_t seq;
        memcpy(&r, d + 8 + (size_t)i * KVPS__RDONE, 4);
        memcpy(&inc, d + 12 + (size_t)i * KVPS__RDONE, 4);
        memcpy(&seq, d + 16 + (size_t)i * KVPS__RDONE, 8);
        if (r < (uint32_t)s->m && inc) kvps__seen_check(&s->seen[r], inc, seq);
    }
    return NULL;
}

/* ---- REPLICAS under BSP: reads from a replica on the worker's host ----
   A worker with .read_local sends a pushpull's push to the primary and its pull, as READ, to a
   replica of the shard on its own host, so the result does not cross the link a second time
   (the round's sum already reached that replica down the chain). READ's values frame is u64 X,
   the sequence of the push's first request. It is answered with the keys' values once every key
   holds that worker's contribution from request X or later (the key's dtag, which the rounds
   applied here set, on a backup and on a primary alike), and parked until then (kvps__try_pull,
   woken by each round). A primary answers READs the same way (a worker sends them to the
   shard's server while its read replica is gone). Where this replica cannot tell, it answers
   KVPS_ERR_NOT_PRIMARY and the worker pulls from the shard's server instead, once its push has
   been answered there (kvps__read_send): not BSP with replicas, not holding the shard yet, a key
   it does not hold, or one with no round of that worker's since it was made or loaded (the
   worker's first step, a snapshot). A READ changes nothing and is not sent down the chain; a
   backup answers it itself without taking over, and parked READs are refused when the replica
   loads a snapshot. */

/* The first key whose round with worker p->hdr.rank's request p->after is not applied here. */
static kvps__key *kvps__read_blocker(const kvps_server *s, const kvps__parked *p) {
    uint32_t r = p->hdr.rank;
    for (uint32_t i = 0; i < p->hdr.nkeys; i++) {
        kvps__key *k = s->keys[p->idx[i]];
        if (!k->dtag || k->dtag[2 * r] != (uint32_t)p->hdr.status || k->dtag[2 * r + 1] < p->after) return k;
    }
    return NULL;
}

/* Answers READ with KVPS_ERR_NOT_PRIMARY (the worker reads from the primary); quietly (info):
   it is how a worker's first step, or one after a snapshot, goes. */
static void kvps__read_elsewhere(kvps_server *s, zmq_msg_t *id, const kvps__hdr *req, int never, const char *fmt, ...) {
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    kvps__log(KVPS_LOG_INFO, "server %d replica %d: a read from worker %u goes to its server as a pull: %s", s->desc.rank,
              s->desc.replica, req->rank, text);
    kvps__hdr h = kvps__reply_hdr(req, KVPS_ERR_NOT_PRIMARY);
    h.aux = (uint32_t)never; /* 1: no READ will be answered here (the worker stops asking) */
    zmq_msg_t f[3];
    kvps__reply_start(f, id, 0, &h);
    kvps__msg_from_buf(&f[2], text, strlen(text));
    kvps__server_send(s, f, 3);
}

/* Every parked READ answered KVPS_ERR_NOT_PRIMARY (this replica's keys are about to go). */
static void kvps__reads_refuse(kvps_server *s, const char *why) {
    for (uint32_t i = 0; i < s->nkeys; i++) {
        kvps__parked **pp = &s->keys[i]->waiters;
        while (*pp) {
            kvps__parked *p = *pp;
            if (!p->after) { pp = &p->next; continue; }
            *pp = p->next;
            kvps__read_elsewhere(s, &p->id, &p->hdr, 0, "%s", why);
            kvps__parked_free(p);
        }
    }
}

static void kvps__serve_read(kvps_server *s, kvps__rq *q) {
    if (q->nfr != 3 || zmq_msg_size(&q->fr[2]) != 8 || q->msz - KVPS__HDR != (size_t)q->h.nkeys * KVPS__KENT) {
        kvps__refuse(s, q, q->nfr < 3 ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED, "read: %d frames, meta of %zu bytes for %u "
                     "keys, a values frame of %zu bytes (want 8)", q->nfr - 1, q->msz, q->h.nkeys,
                     q->nfr == 3 ? zmq_msg_size(&q->fr[2]) : (size_t)0);
        return;
    }
    if (!kvps__check_keys(s, q)) return;
    uint64_t after;
    memcpy(&after, zmq_msg_data(&q->fr[2]), 8);
    uint32_t r = q->h.rank;
    const char *why = !s->rmode ? "its shard is not BSP with replicas"
                      : s->role == KVPS__ROLE_BACKUP && !s->synced ? "it does not hold the shard yet" : NULL;
    if (!why && (!after || !q->h.status)) why = "a read without its push's sequence or the worker's incarnation";
    char kt[160] = "";
    for (uint32_t i = 0; i < q->h.nkeys && !why; i++) {
        kvps__key *k = q->idx[i] == UINT32_MAX ? NULL : s->keys[q->idx[i]];
        if (!k) why = "it does not hold key";
        else if (!k->dtag || k->dtag[2 * r] != (uint32_t)q->h.status) why = "no round of this worker's since it got key";
        if (why) kvps__key_text(s, kvps__ent(q, i).key, kt, sizeof kt);
    }
    if (why) {
        kvps__read_elsewhere(s, q->id, &q->h, !s->rmode, "server %d replica %d (%s): %s%s%s", s->desc.rank, s->desc.replica,
                             s->endpoint, why, *kt ? " " : "", kt);
        return;
    }
    kvps__park_pull(s, q, after);
}

/* Primary: worker r is lost (the backups do what this server did). */
static void kvps__repl_event(kvps_server *s, int kind, uint32_t r) {
    zmq_msg_t f[1];
    kvps__msg_from_buf(&f[0], &r, sizeof r);
    kvps__repl_send(s, kind, f, 1);
    zmq_msg_close(&f[0]);
}

/* The session state a snapshot carries after the checkpoint's bytes: per worker finished (bit
   0) and lost (bit 1, so that a backup that joins after a loss sees the job end too), heard,
   incarnation accepted; the reference hello. */
static size_t kvps__session_bytes(const kvps_server *s) { return (size_t)s->m * 6 + 4 + KVPS__HELLO_BYTES; }
static void kvps__session_put(const kvps_server *s, unsigned char *p) {
    for (int r = 0; r < s->m; r++) {
        p[0] = (unsigned char)(s->done[r] | s->lost[r] << 1);
        p[1] = s->heard[r];
        memcpy(p + 2, &s->live_inc[r], 4);
        p += 6;
    }
    int32_t rr = s->ref_rank;
    memcpy(p, &rr, 4);
    memcpy(p + 4, s->ref, KVPS__HELLO_BYTES);
}
static void kvps__session_get(kvps_server *s, const unsigned char *p) {
    s->ndone = s->nlost = 0;
    for (int r = 0; r < s->m; r++) {
        s->done[r] = p[0] & 1;
        s->lost[r] = (p[0] >> 1) & 1;
        s->heard[r] = p[1] != 0;
        memcpy(&s->live_inc[r], p + 2, 4);
        s->ndone += s->done[r];
        if (!s->desc.elastic) s->nlost += s->lost[r];
        p += 6;
    }
    int32_t rr;
    memcpy(&rr, p, 4);
    s->ref_rank = rr >= 0 && rr < s->m ? rr : -1;
    memcpy(s->ref, p + 4, KVPS__HELLO_BYTES);
}

/* Primary: a snapshot to each link that waits for one, once no round is half summed. */
static void kvps__repl_snapshots(kvps_server *s) {
    int want = 0;
    for (int j = 0; j < s->nrep; j++) want |= j != s->desc.replica && s->links[j].state == KVPS__LINK_JOINING;
    if (!want) return;
    kvps__flush_all(s);
    kvps__round_send(s); /* (before the snapshot, whose sequence follows it) */
    if (!kvps__quiescent(s, 0)) return;
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return;
    kvps__cw w = {f, 0, 0};
    kvps__ckpt_put(s, &w);
    if (fclose(f) != 0 || w.err) { free(buf); return; }
    zmq_msg_t fr[3];
    size_t sb = kvps__session_bytes(s);
    kvps__hdr h = kvps__repl_hdr(s, KVPS__REPL_SNAP, s->fwd_seq), hh = kvps__repl_hdr(s, KVPS__REPL_HELLO, 0);
    uint64_t proof[2] = {s->token, s->chain_hash};
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || l->state != KVPS__LINK_JOINING) continue;
        kvps__msg_from_buf(&fr[0], &hh, sizeof hh); /* first, on this connection: who sends the rest */
        kvps__msg_from_buf(&fr[1], proof, sizeof proof);
        if (kvps__send_frames(l->sock, fr, 2) != 0) continue;
        kvps__msg_from_buf(&fr[0], &h, sizeof h);
        kvps__msg_from_buf(&fr[1], buf, size);
        zmq_msg_init_size(&fr[2], sb);
        kvps__session_put(s, (unsigned char *)zmq_msg_data(&fr[2]));
        if (kvps__send_frames(l->sock, fr, 3) != 0) continue;
        l->state = KVPS__LINK_SNAP;
        l->snap_seq = s->fwd_seq;
        KVPS__STAT_ADD(s, snapshots, 1);
        kvps__log(KVPS_LOG_INFO, "server %d replica %d: snapshot of %u keys (%zu bytes) sent to replica %d (%s)", s->desc.rank,
                  s->desc.replica, s->nkeys, size, j, s->chain[j]);
    }
    free(buf);
}

/* Opens the links to every other replica of the chain (a primary's). */
static int kvps__repl_links(kvps_server *s, int first) {
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || l->sock) continue;
        memset(l, 0, sizeof *l);
        void *d = zmq_socket(s->ctx, ZMQ_DEALER);
        if (!d) return -1;
        int zero = 0, one = 1;
        zmq_setsockopt(d, ZMQ_SNDHWM, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_RCVHWM, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(d, ZMQ_IMMEDIATE, &one, sizeof one); /* nothing queued for a replica not connected */
        /* with a random part: a stranger cannot take this id over (ROUTER handover) at the backup */
        unsigned char rid[16] = {'k', 'v', 'p', 's', 'r', 'e', 'p', 'l'};
        uint32_t me = (uint32_t)s->desc.replica, nonce = kvps__random32();
        memcpy(rid + 8, &me, 4);
        memcpy(rid + 12, &nonce, 4);
        zmq_setsockopt(d, ZMQ_ROUTING_ID, rid, sizeof rid);
        if (s->curve_rep) { /* CURVE: this server's key pair, replica j's public key (SECURITY) */
            uint8_t tk[32];
            zmq_z85_decode(tk, s->curve_rep[j]);
            zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, tk, 32);
            zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, s->curve_pub, 32);
            zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, s->curve_sec, 32);
        }
        kvps__heartbeats(d, s->desc.heartbeat_ms, s->desc.peer_timeout_ms);
        if (kvps__monitor(s->ctx, d, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED, &l->mon) != 0 ||
            zmq_connect(d, s->chain[j]) != 0) {
            kvps__log(KVPS_LOG_ERROR, "server %d replica %d: cannot connect to replica %d (%s): %s", s->desc.rank,
                      s->desc.replica, j, s->chain[j], zmq_strerror(zmq_errno()));
            zmq_close(d);
            return -1;
        }
        l->sock = d;
        l->state = KVPS__LINK_DOWN;
        l->wait_for = first;
        l->since = kvps__now_ms();
        if (strncmp(s->chain[j], "inproc://", 9) == 0) l->state = KVPS__LINK_JOINING; /* no handshake events there */
    }
    return 0;
}

/* A primary learns that replica `by` is the primary of a later epoch (its refusal on a link, or
   its REPL): this server steps down. The replies it still holds (to requests its backups never
   acknowledged: the job's new primary may lack them) are not sent: each is answered
   KVPS_ERR_NOT_PRIMARY instead, so its worker sends the request to the primary. */
static void kvps__repl_step_down(kvps_server *s, uint32_t by, uint32_t epoch) {
    kvps__log(KVPS_LOG_WARN, "server %d replica %d: replica %u is primary of epoch %u (this one's is %u); this server "
              "becomes its backup, and the %zu replies it held are refused (KVPS_ERR_NOT_PRIMARY): their workers send "
              "them to the primary", s->desc.rank, s->desc.replica, by, epoch, s->epoch, (size_t)s->nheld);
    s->role = KVPS__ROLE_BACKUP;
    s->synced = 0;
    s->fenced = 0;
    static const char text[] = "this server stepped down before its backups had this request: send it to the primary";
    while (s->nheld) {
        kvps__held *h = &s->held[s->held_head];
        if (h->n >= 2 && zmq_msg_size(&h->f[1]) >= sizeof(kvps__hdr)) {
            kvps__hdr rh;
            memcpy(&rh, zmq_msg_data(&h->f[1]), sizeof rh);
            rh.status = KVPS_ERR_NOT_PRIMARY;
            rh.aux = (uint32_t)s->desc.replica;
            rh.flags = 0;
            rh.nkeys = 0;
            zmq_msg_t f[3];
            kvps__reply_start(f, &h->f[0], 0, &rh);
            kvps__msg_from_buf(&f[2], text, sizeof text - 1);
            kvps__send_frames(s->router, f, 3);
        }
        for (int i = 0; i < h->n; i++) zmq_msg_close(&h->f[i]);
        s->held_head = (s->held_head + 1) % s->cap_held;
        s->nheld--;
    }
    kvps__preq_clear(s);
    kvps__repl_stats(s);
}

/* A primary that stood still past peer_timeout_ms (stopped, as by SIGSTOP, or starved) may have
   been replaced: a backup takes over when the primary's connection is gone and a worker comes.
   Until a backup takes a snapshot from it again (it is still the primary) its replies wait, and
   a backup that answers with a later epoch makes it step down (kvps__repl_step_down); a backup
   unreachable for peer_timeout_ms is not waited for, and none is waited for past 2 x
   peer_timeout_ms (a snapshot waits for no round to be half summed, and under BSP a round can
   wait for a worker whose reply is held: a successor would have said so by then). The sequence moves past every message sent
   before the stop, so that no acknowledgement of those passes for the snapshot's. */
static void kvps__repl_fence(kvps_server *s, int64_t gap_ms) {
    s->fenced = 1;
    s->fence_at = kvps__now_ms();
    s->fwd_seq++;
    int64_t now = kvps__now_ms();
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || !l->sock || l->state == KVPS__LINK_DOWN) {
            if (l->sock && j != s->desc.replica) { l->wait_for = 1; l->since = now; }
            continue;
        }
        l->state = KVPS__LINK_JOINING;
        l->wait_for = 1;
        l->since = now;
    }
    kvps__log(KVPS_LOG_WARN, "server %d replica %d: this primary stood still for %lld ms (peer_timeout_ms is %d): a backup "
              "may have taken over; its replies wait until a backup takes a snapshot of epoch %u from it", s->desc.rank,
              s->desc.replica, (long long)gap_ms, s->desc.peer_timeout_ms, s->epoch);
}

/* Primary: connection events and acknowledgements from the backups. */
static void kvps__repl_links_poll(kvps_server *s) {
    int64_t now = kvps__now_ms();
    s->repl_look = now + 100;
    for (int j = 0; j < s->nrep; j++) {
        kvps__link *l = &s->links[j];
        if (j == s->desc.replica || !l->sock) continue;
        uint16_t ev = 0;
        int32_t val = 0;
        while (kvps__monitor_event(l->mon, &ev, &val)) {
            if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
                l->state = KVPS__LINK_JOINING;
                kvps__log(KVPS_LOG_INFO, "server %d replica %d: replica %d (%s) connected; it gets a snapshot", s->desc.rank,
                          s->desc.replica, j, s->chain[j]);
            } else if (ev == ZMQ_EVENT_DISCONNECTED && l->state != KVPS__LINK_DOWN) {
                int was_live = l->state == KVPS__LINK_LIVE;
                l->state = KVPS__LINK_DOWN;
                l->since = now;
                if (!s->fenced) l->wait_for = 0; /* (fenced: waited for until peer_timeout_ms passes) */
                int live = 1;
                for (int k = 0; k < s->nrep; k++) live += k != s->desc.replica && s->links[k].state == KVPS__LINK_LIVE;
                /* once the job has ended a backup leaving is no fault: it ends with the job (CLEAN FINISH) */
                kvps__log(s->finish || s->end_at ? KVPS_LOG_INFO : KVPS_LOG_WARN, "server %d replica %d: backup replica %d (%s) "
                          "is gone%s; shard %d goes on with %d of %d replicas", s->desc.rank, s->desc.replica, j, s->chain[j],
                          was_live ? "" : " (it had not joined)", s->desc.rank, live, s->nrep);
            }
        }
        if (l->wait_for && l->state == KVPS__LINK_DOWN && now - l->since >= s->desc.peer_timeout_ms) {
            l->wait_for = 0;
            kvps__log(KVPS_LOG_WARN, "server %d replica %d: backup replica %d (%s) did not connect within %d ms; going on "
                      "without it", s->desc.rank, s->desc.replica, j, s->chain[j], s->desc.peer_timeout_ms);
        }
        for (;;) {
            zmq_msg_t fr[2];
            int extra;
            int n = kvps__recv_msg(l->sock, fr, 2, &extra);
            if (n <= 0) break;
            kvps__hdr h;
            if (zmq_msg_size(&fr[0]) >= sizeof h) {
                memcpy(&h, zmq_msg_data(&fr[0]), sizeof h);
                if (h.magic == KVPS__MAGIC && h.op == (KVPS__OP_REPL | KVPS__OP_REPLY)) {
                    kvps__rhdr rh = kvps__rhdr_of(&h);
                    if (rh.status != KVPS_OK && rh.epoch > s->epoch) { /* it is the primary of a later epoch */
                        for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
                        kvps__repl_step_down(s, rh.place, rh.epoch);
                        return;
                    }
                    if (rh.status != KVPS_OK) {
                        char text[256];
                        kvps__frame_text(fr, n, text, sizeof text);
                        kvps__log(KVPS_LOG_WARN, "server %d replica %d: replica %d (%s) refused: %s (%s)%s", s->desc.rank,
                                  s->desc.replica, j, s->chain[j], text, kvps_result_str((kvps_result)rh.status),
                                  rh.status == KVPS_ERR_CHECKPOINT || rh.status == KVPS_ERR_CONFIG ? "; it stays out of the chain"
                                                                                                   : "; it gets a snapshot");
                        l->state = rh.status == KVPS_ERR_CHECKPOINT || rh.status == KVPS_ERR_CONFIG ? KVPS__LINK_DOWN
                                                                                                   : KVPS__LINK_JOINING;
                        if (!s->fenced) l->wait_for = 0; /* (fenced: its snapshot, or peer_timeout_ms, decides) */
                    } else if (l->state == KVPS__LINK_SNAP || l->state == KVPS__LINK_LIVE) {
                        l->acked = rh.seq;
                        if (l->state == KVPS__LINK_SNAP && rh.seq >= l->snap_seq) {
                            l->state = KVPS__LINK_LIVE;
                            l->wait_for = 0;
                            if (s->fenced) {
                                s->fenced = 0;
                                kvps__log(KVPS_LOG_WARN, "server %d replica %d: replica %d took a snapshot of epoch %u: this "
                                          "server is still the primary; its held replies go", s->desc.rank, s->desc.replica,
                                          j, s->epoch);
                            }
                            kvps__log(KVPS_LOG_INFO, "server %d replica %d: replica %d (%s) holds the shard now", s->desc.rank,
                                      s->desc.replica, j, s->chain[j]);
                        }
                    }
                }
            }
            for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
        }
    }
    kvps__repl_release(s);
    kvps__repl_snapshots(s);
    kvps__repl_stats(s);
}

/* Backup: answers the primary (an acknowledgement, or a refusal with its text). */
static void kvps__repl_answer(kvps_server *s, zmq_msg_t *id, uint64_t seq, kvps_result rc, const char *text) {
    kvps__hdr h = kvps__repl_hdr(s, 0, seq);
    h.op = KVPS__OP_REPL | KVPS__OP_REPLY;
    h.status = rc;
    zmq_msg_t f[3];
    zmq_msg_init(&f[0]);
    zmq_msg_copy(&f[0], id);
    kvps__msg_from_buf(&f[1], &h, sizeof h);
    int n = 2;
    if (rc != KVPS_OK) { kvps__msg_from_buf(&f[2], text, strlen(text)); n = 3; }
    kvps__send_frames(s->router, f, n);
}

/* Backup: acknowledges the last message applied, to the primary it came from. */
static void kvps__repl_ack(kvps_server *s) {
    if (zmq_msg_size(&s->primary_id) > 0) kvps__repl_answer(s, &s->primary_id, s->ack_due, KVPS_OK, "");
    s->ack_now = 0;
}

/* Backup: the shard as the snapshot has it, and nothing else (parked requests, buffered pushes
   and deferred pushes of the previous state go: their workers re-send what was not answered). */
static const char *kvps__repl_load(kvps_server *s, zmq_msg_t *ck, zmq_msg_t *sess) {
    if (zmq_msg_size(sess) != kvps__session_bytes(s)) return "session state of the wrong size (another number of workers)";
    kvps__reads_refuse(s, "it is loading a snapshot");
    kvps__flush_all(s);
    kvps__keys_truncate(s, 0);
    while (s->tables) { kvps__table *t = s->tables; s->tables = t->next; kvps__table_free(t); }
    kvps__stats_tables_zero(s); /* (other threads read stats) */
    while (s->barrier_waiters) { kvps__parked *p = s->barrier_waiters; s->barrier_waiters = p->next; kvps__parked_free(p); }
    s->max_round = 0;
    memset(s->barrier_gen, 0, (size_t)s->m * sizeof *s->barrier_gen);
    memset(s->seen, 0, (size_t)s->m * sizeof *s->seen);
    memset(s->out, 0, (size_t)s->m);
    kvps__preq_clear(s); /* (a primary that stepped down) */
    const char *why = kvps__ckpt_load(s, (const unsigned char *)zmq_msg_data(ck), zmq_msg_size(ck));
    if (!why) kvps__session_get(s, (const unsigned char *)zmq_msg_data(sess));
    return why;
}

/* Backup: one message from the primary, [id][repl hdr][...]. */
static void kvps__repl_serve(kvps_server *s, zmq_msg_t *fr, int nfr) {
    kvps__rhdr h;
    memcpy(&h, zmq_msg_data(&fr[1]), sizeof h);
    char text[600];
    if (h.kind == KVPS__REPL_HELLO) return; /* (proved in kvps__admit; over inproc there is nothing to prove) */
    if (s->role == KVPS__ROLE_NONE || h.place >= (uint32_t)s->nrep || h.place == (uint32_t)s->desc.replica) {
        snprintf(text, sizeof text, "server %d (%s) is not a replica of that chain (it has %d replicas, the sender says it is "
                 "replica %u)", s->desc.rank, s->endpoint, s->nrep, h.place);
        kvps__repl_answer(s, &fr[0], h.seq, KVPS_ERR_CONFIG, text);
        return;
    }
    if (h.epoch < s->epoch) {
        snprintf(text, sizeof text, "replica %u speaks for epoch %u, but replica %d (%s) was promoted in epoch %u", h.place,
                 h.epoch, s->desc.replica, s->endpoint, s->epoch);
        kvps__repl_answer(s, &fr[0], h.seq, KVPS_ERR_STATE, text);
        return;
    }
    if (s->role == KVPS__ROLE_PRIMARY) kvps__repl_step_down(s, h.place, h.epoch); /* a primary of a later epoch */
    int fd = zmq_msg_get(&fr[1], ZMQ_SRCFD);
    if (fd >= 0) s->primary_fd = fd;
    s->epoch = h.epoch;
    zmq_msg_close(&s->primary_id);
    zmq_msg_init(&s->primary_id);
    zmq_msg_copy(&s->primary_id, &fr[0]);
    if (h.kind == KVPS__REPL_SNAP) {
        const char *why = nfr == 4 ? kvps__repl_load(s, &fr[2], &fr[3]) : "a snapshot of the wrong shape";
        if (why) {
            s->synced = 0;
            snprintf(text, sizeof text, "server %d replica %d (%s) refused the snapshot: %s", s->desc.rank, s->desc.replica,
                     s->endpoint, why);
            kvps__log(KVPS_LOG_ERROR, "%s", text);
            kvps__repl_answer(s, &fr[0], h.seq, KVPS_ERR_CHECKPOINT, text);
            return;
        }
        s->synced = 1;
        s->fwd_seq = h.seq;
        s->ack_due = h.seq;
        s->ack_now = 1;
        KVPS__STAT_ADD(s, snapshots, 1);
        kvps__repl_stats(s);
        kvps__log(KVPS_LOG_INFO, "server %d replica %d: snapshot of %u keys at round %llu from replica %u (epoch %u)",
                  s->desc.rank, s->desc.replica, s->nkeys, (unsigned long long)s->max_round, h.place, h.epoch);
        return;
    }
    if (!s->synced || h.seq != s->fwd_seq + 1 || h.kind >= KVPS__REPL_KINDS) {
        snprintf(text, sizeof text, "message %llu of kind %u after %llu%s", (unsigned long long)h.seq, h.kind,
                 (unsigned long long)s->fwd_seq, s->synced ? "" : " without a snapshot");
        kvps__repl_answer(s, &fr[0], h.seq, KVPS_ERR_STATE, text);
        return;
    }
    s->fwd_seq = h.seq;
    s->ack_due = h.seq;
    s->ack_now = 1;
    s->replaying = 1;
    if (h.kind == KVPS__REPL_FWD && nfr >= 4) { /* [id][repl][worker id][meta][values?] */
        zmq_msg_t sub[3];
        int ns = nfr - 2 > 3 ? 3 : nfr - 2;
        for (int i = 0; i < ns; i++) { zmq_msg_init(&sub[i]); zmq_msg_move(&sub[i], &fr[i + 2]); }
        kvps__handle(s, sub, ns);
        for (int i = 0; i < ns; i++) zmq_msg_close(&sub[i]);
    } else if (h.kind == KVPS__REPL_ROUND) {
        char why[300];
        const char *bad = !s->rmode ? "a round's sum, but this replica takes every push (its consistency is not BSP, or "
                                      "it is elastic)"
                          : nfr != 4 ? "a round message of the wrong shape"
                                     : kvps__round_apply(s, &fr[2], &fr[3], why, sizeof why);
        if (bad) { /* this replica no longer holds the shard: a snapshot must come before anything else */
            s->synced = 0;
            s->ack_now = 0;
            kvps__repl_stats(s);
            snprintf(text, sizeof text, "server %d replica %d (%s): message %llu refused: %s", s->desc.rank, s->desc.replica,
                     s->endpoint, (unsigned long long)h.seq, bad);
            kvps__log(KVPS_LOG_ERROR, "%s", text);
            kvps__repl_answer(s, &fr[0], h.seq, KVPS_ERR_STATE, text);
        }
    } else if (h.kind == KVPS__REPL_LOST && nfr == 3 && zmq_msg_size(&fr[2]) == 4) {
        uint32_t r;
        memcpy(&r, zmq_msg_data(&fr[2]), 4);
        if (r < (uint32_t)s->m && !s->lost[r]) kvps__worker_lost(s, (int)r);
    }
    s->replaying = 0;
}

/* Backup: a worker's request. 1: serve it (this server has taken over as primary); 0: refused,
   because the primary is alive or this server does not hold the shard. */
static int kvps__repl_take_over(kvps_server *s, zmq_msg_t *fr, int nfr) {
    kvps__liveness_events(s); /* the primary's drop may be waiting to be read */
    kvps__hdr req;
    int has = nfr >= 2 && zmq_msg_size(&fr[1]) >= sizeof req;
    if (has) memcpy(&req, zmq_msg_data(&fr[1]), sizeof req);
    if (s->primary_fd >= 0 || !s->synced) {
        char text[600];
        if (!s->synced)
            snprintf(text, sizeof text, "server %d replica %d (%s) does not hold the shard yet (waiting for its primary's "
                     "snapshot)", s->desc.rank, s->desc.replica, s->endpoint);
        else
            snprintf(text, sizeof text, "server %d replica %d (%s) is a backup and its primary is alive: use the primary",
                     s->desc.rank, s->desc.replica, s->endpoint);
        kvps__hdr h = kvps__reply_hdr(has ? &req : NULL, KVPS_ERR_NOT_PRIMARY);
        h.aux = (uint32_t)s->desc.replica;
        zmq_msg_t f[3];
        kvps__reply_start(f, &fr[0], 0, &h);
        kvps__msg_from_buf(&f[2], text, strlen(text));
        kvps__send_frames(s->router, f, 3);
        return 0;
    }
    s->role = KVPS__ROLE_PRIMARY;
    s->epoch++;
    s->fwd_seq = 0;
    kvps__preq_clear(s);
    for (uint32_t i = 0; s->rmode && i < s->nkeys; i++) { /* rounds start clean: what was not replicated comes again */
        kvps__key *k = s->keys[i];
        k->summed = k->nin = 0;
        for (int r = 0; k->qhead && r < s->m; r++)
            while (k->qhead[r]) { kvps__pend *p = k->qhead[r]; k->qhead[r] = p->next; free(p); }
        for (int r = 0; k->qtail && r < s->m; r++) k->qtail[r] = NULL;
        if (k->ctag) memset(k->ctag, 0, (size_t)s->m * sizeof *k->ctag);
    }
    kvps__log(KVPS_LOG_WARN, "server %d replica %d (%s): the primary is gone and a worker has come: taking over as primary of "
              "shard %d (epoch %u)", s->desc.rank, s->desc.replica, s->endpoint, s->desc.rank, s->epoch);
    for (int j = 0; j < s->nrep; j++) /* the others start again from a snapshot */
        if (j != s->desc.replica && s->links[j].sock) s->links[j].state = KVPS__LINK_JOINING;
    kvps__repl_links(s, 0);
    KVPS__STAT_ADD(s, takeovers, 1);
    kvps__repl_stats(s);
    return 1;
}

/* Primary, stopping: the replies still held go once the backups have what they depend on, and
   the backups acknowledge everything sent down the chain (the last goodbyes, LOST: so that they
   see the job end too), for at most timeout_ms. */
static void kvps__repl_drain(kvps_server *s, int timeout_ms) {
    int64_t end = kvps__now_ms() + timeout_ms;
    while ((s->nheld || kvps__repl_floor(s) < s->fwd_seq) && kvps__now_ms() < end) {
        zmq_pollitem_t it[8];
        int n = 0;
        for (int j = 0; j < s->nrep && n < 8; j++)
            if (j != s->desc.replica && s->links[j].sock) { it[n].socket = s->links[j].sock; it[n].fd = 0; it[n].events = ZMQ_POLLIN; it[n].revents = 0; n++; }
        if (n == 0) break;
        zmq_poll(it, n, 10);
        kvps__repl_links_poll(s);
    }
    kvps__repl_release(s);
}

/* Server create: the chain, this server's role, and (primary) its links. */
static int kvps__repl_setup(kvps_server *s) {
    const char *list = s->desc.replicas;
    if (!list || !strchr(list, '|')) return 0;
    s->nrep = kvps__split_by(list, '|', &s->chain);
    if (s->nrep < 2 || s->desc.replica < 0 || s->desc.replica >= s->nrep) {
        kvps__log(KVPS_LOG_ERROR, "server %d: replicas '%s' malformed, or replica %d not in it", s->desc.rank, list,
                  s->desc.replica);
        return -1;
    }
    s->links = (kvps__link *)calloc((size_t)s->nrep, sizeof *s->links);
    s->member_fd = (int *)malloc((size_t)s->nrep * sizeof *s->member_fd);
    if (!s->links || !s->member_fd) return -1;
    s->chain_hash = KVPS__FNV_BASIS;
    for (int j = 0; j < s->nrep; j++) {
        s->member_fd[j] = -2;
        s->chain_hash = kvps__fnv(s->chain_hash, s->chain[j], strlen(s->chain[j]) + 1); /* (with its NUL) */
    }
    s->desc.replicas = NULL; /* (not kept: the chain is) */
    s->primary_fd = -1;
    s->rmode = s->desc.consistency == KVPS_BSP && !s->desc.elastic; /* rounds go down the chain, not pushes */
    if (s->desc.replica == 0 && !s->desc.replacement) {
        s->role = KVPS__ROLE_PRIMARY;
        s->epoch = 1;
        int rc = kvps__repl_links(s, 1);
        kvps__repl_stats(s);
        return rc;
    }
    s->role = KVPS__ROLE_BACKUP;
    s->synced = 0;
    return 0;
}

static void kvps__repl_free(kvps_server *s) {
    zmq_msg_close(&s->primary_id);
    for (int j = 0; s->links && j < s->nrep; j++) {
        if (s->links[j].mon) zmq_close(s->links[j].mon);
        if (s->links[j].sock) zmq_close(s->links[j].sock);
    }
    while (s->nheld) {
        kvps__held *h = &s->held[s->held_head];
        for (int i = 0; i < h->n; i++) zmq_msg_close(&h->f[i]);
        s->held_head = (s->held_head + 1) % s->cap_held;
        s->nheld--;
    }
    free(s->held);
    free(s->links);
    free(s->member_fd);
    kvps__preq_clear(s);
    free(s->rb.p);
    free(s->rd.p);
    kvps__free_strv(s->chain, s->nrep);
}

/* ---- what the rest of the server asks of replication (the interface in >>state) ---- */

/* REPL hello, [id][hdr][u64 job token digest, u64 chain hash]: the connection it comes on is
   replica h.aux's, when the chain and the token are this server's. */
static void kvps__repl_hello(kvps_server *s, zmq_msg_t *fr, int nfr, int fd, const kvps__hdr *h) {
    uint64_t v[2] = {0, 0};
    kvps__rhdr rh = kvps__rhdr_of(h);
    const char *bad = NULL;
    if (nfr != 3 || zmq_msg_size(&fr[2]) != sizeof v) bad = "a REPL hello of the wrong shape";
    else memcpy(v, zmq_msg_data(&fr[2]), sizeof v);
    if (bad) {
    } else if (!s->member_fd) bad = "this server is no replica of a chain";
    else if (rh.place >= (uint32_t)s->nrep || rh.place == (uint32_t)s->desc.replica) bad = "the sender names no other replica of this chain";
    else if (v[1] != s->chain_hash) bad = "the sender's chain is not this server's";
    else if (v[0] != s->token) bad = "the sender does not carry this job's token (KVPS_JOB_TOKEN)";
    if (bad) {
        kvps__stranger(s, fr, h, fd, bad);
        return;
    }
    s->member_fd[rh.place] = fd;
}

/* ONLY THE JOB TALKS TO THE JOB, for replication: REPL only from a connection on which a replica
   of this chain proved itself (its REPL hello), and with CURVE only from that replica's key; a
   replica's key never speaks for a worker. -1: not replication's to judge. */
static int kvps__repl_admit(kvps_server *s, zmq_msg_t *fr, int nfr, int fd, const kvps__hdr *h0, const char *uid) {
    int rep = uid && strncmp(uid, "replica ", 8) == 0;
    kvps__rhdr rh = kvps__rhdr_of(h0); /* (what it is if its op is REPL) */
    if (uid && h0->op == KVPS__OP_REPL &&
        (!rep || !s->curve_rep || rh.place >= (uint32_t)s->ncurve_rep || strcmp(uid + 8, s->curve_rep[rh.place]) != 0)) {
        kvps__stranger(s, fr, h0, fd, rep ? "replica traffic from a CURVE key that is not the key of the replica it "
                                            "names (curve_replica_keys)"
                                          : "replica traffic from a CURVE key that is not one of this chain's replicas' "
                                            "(curve_replica_keys): a worker's key cannot speak for a replica");
        return 0;
    }
    if (h0->op != KVPS__OP_REPL && rep) {
        kvps__stranger(s, fr, h0, fd, "a replica's CURVE key (curve_replica_keys) is not a worker's");
        return 0;
    }
    if (h0->op != KVPS__OP_REPL) return -1;
    if (rh.kind == KVPS__REPL_HELLO) {
        kvps__repl_hello(s, fr, nfr, fd, h0);
        return 0;
    }
    if (s->member_fd && rh.place < (uint32_t)s->nrep && rh.place != (uint32_t)s->desc.replica && s->member_fd[rh.place] == fd)
        return 1;
    kvps__stranger(s, fr, h0, fd, "replica traffic from a connection that has not proved itself a replica of this "
                   "shard's chain (no REPL hello with the job's token and chain)");
    return 0;
}

static int kvps__repl_inbound(kvps_server *s, zmq_msg_t *fr, int nfr, const kvps__hdr *h0) {
    if (h0->magic == KVPS__MAGIC && h0->op == KVPS__OP_REPL) { /* from this shard's primary */
        if (nfr <= 5) kvps__repl_serve(s, fr, nfr);
        else kvps__repl_answer(s, &fr[0], h0->req_id, KVPS_ERR_MALFORMED, "a REPL message of more than 4 frames");
        return 1;
    }
    return s->role == KVPS__ROLE_BACKUP && !kvps__op(h0->op)->backup && !kvps__repl_take_over(s, fr, nfr);
}

static void kvps__repl_forward(kvps_server *s, const kvps__rq *q, zmq_msg_t *fr, int nfr) {
    if (s->role == KVPS__ROLE_PRIMARY && q->op->chain != KVPS__CHAIN_LOCAL && !(s->rmode && q->op->chain == KVPS__CHAIN_ROUNDS))
        kvps__repl_send(s, KVPS__REPL_FWD, fr, nfr); /* (BSP pushes: their rounds' sums go instead, kvps__round_send) */
}

/* A BSP push at a primary of a chain is answered once every round it is in has been applied and
   sent down the chain (kvps__preq); its tag (s->cur_preq) goes with each contribution. */
static int kvps__repl_track(kvps_server *s, const kvps__rq *q) {
    if (!(s->rmode && s->role == KVPS__ROLE_PRIMARY && q->op->chain == KVPS__CHAIN_ROUNDS)) return 0;
    return (s->cur_preq = kvps__preq_new(s, q)) ? 1 : -1;
}
static void kvps__repl_untrack(kvps_server *s, int applied) {
    uint32_t t = s->cur_preq;
    if (!t) return;
    s->cur_preq = 0;
    if (applied != 1) s->preq[t - 1].answered = s->preq[t - 1].refused = 1; /* (answered with the refusal) */
    kvps__preq_drop(s, t); /* the request's own hold: answered now if its rounds are all applied */
}

static void kvps__repl_round(kvps_server *s, kvps__key *k, int count) {
    if (s->rmode && s->role == KVPS__ROLE_PRIMARY) kvps__round_note(s, k, count);
}
static void kvps__repl_after(kvps_server *s) {
    if (kvps__round_pending(s)) kvps__round_send(s);
}

static int kvps__repl_reply(kvps_server *s, zmq_msg_t *frames, int n) {
    if (s->role == KVPS__ROLE_BACKUP && !kvps__read_reply(frames, n)) { /* serving the primary's copy: the primary answers */
        for (int i = 0; i < n; i++) zmq_msg_close(&frames[i]);
        return 1;
    }
    /* held until the backups have what it depends on (rounds not yet sent: the next message) */
    return s->role == KVPS__ROLE_PRIMARY && (s->nheld || kvps__round_pending(s) || kvps__repl_floor(s) < s->fwd_seq) &&
           kvps__repl_hold(s, frames, n) == 0;
}

static void kvps__repl_worker_lost(kvps_server *s, int r) {
    if (s->role == KVPS__ROLE_PRIMARY) kvps__repl_event(s, KVPS__REPL_LOST, (uint32_t)r);
}

/* A backup whose primary is alive, or that does not hold the shard yet, serves no worker request:
   it sends each one on to another replica (KVPS_ERR_NOT_PRIMARY, kvps__repl_take_over), also one
   from a connection that names a worker (kvps__admit's `named`) whose hello it has not accepted,
   since answering it changes nothing and tells nothing but that. So a worker whose connection
   came back to a replacement before its hello was answered there (kvps-run --respawn starts one
   at the dead primary's endpoint) moves on to the next replica rather than being refused as a
   stranger (KVPS_ERR_AUTH, which ends its request). A connection that names no worker is still
   a stranger's; a backup that would take over is not one of these: it takes over only at a
   hello, and serves a worker only after it. */
static int kvps__repl_declines(kvps_server *s) {
    if (s->role != KVPS__ROLE_BACKUP) return 0;
    kvps__liveness_events(s); /* (the primary's drop may be waiting to be read) */
    return s->primary_fd >= 0 || !s->synced;
}

static void kvps__repl_disconnected(kvps_server *s, int fd) {
    for (int j = 0; s->member_fd && j < s->nrep; j++) /* a later connection with that number proves itself anew */
        if (s->member_fd[j] == fd) s->member_fd[j] = -2;
    if (s->primary_fd >= 0 && fd == s->primary_fd) {
        s->primary_fd = -1; /* (once the job has ended, the primary leaving is no fault: it ends with it) */
        kvps__log(s->finish || s->end_at ? KVPS_LOG_INFO : KVPS_LOG_WARN, "server %d replica %d: the primary's connection "
                  "closed; this backup takes over when a worker comes", s->desc.rank, s->desc.replica);
    }
}

static int kvps__repl_poll_items(kvps_server *s, zmq_pollitem_t *items, int n, int cap) {
    for (int j = 0; j < s->nrep && n + 2 <= cap; j++) {
        if (j == s->desc.replica || !s->links || !s->links[j].sock) continue;
        zmq_pollitem_t a = {s->links[j].sock, 0, ZMQ_POLLIN, 0}, b = {s->links[j].mon, 0, ZMQ_POLLIN, 0};
        items[n++] = a;
        items[n++] = b;
    }
    return n;
}
static long kvps__repl_timeout(const kvps_server *s, long tmo) {
    return s->role == KVPS__ROLE_PRIMARY && (tmo < 0 || tmo > 100) ? 100 : tmo;
}
static void kvps__repl_woke(kvps_server *s, long tmo) {
    if (s->role != KVPS__ROLE_PRIMARY || s->nrep < 2) return;
    int64_t now = kvps__now_ms();
    if (s->loop_at && !s->fenced && now - s->loop_at > (tmo > 0 ? tmo : 0) + s->desc.peer_timeout_ms) {
        kvps__repl_fence(s, now - s->loop_at);
        kvps__repl_links_poll(s); /* what the backups said meanwhile, before any request is served */
    } else if (s->fenced && now - s->fence_at > 2 * (int64_t)s->desc.peer_timeout_ms) {
        for (int j = 0; j < s->nrep; j++) s->links[j].wait_for = 0; /* kvps__repl_release unfences */
        kvps__repl_release(s);
    }
    s->loop_at = now;
}
static void kvps__repl_batch(kvps_server *s, const zmq_pollitem_t *links, int nlinks) {
    if (s->role == KVPS__ROLE_PRIMARY) { /* the links are read when they have something (or 10 times a second) */
        int linked = 0;
        for (int i = 0; i < nlinks; i++) linked |= links[i].revents & ZMQ_POLLIN;
        if (linked || kvps__now_ms() >= s->repl_look) kvps__repl_links_poll(s); /* acknowledgements, connects, drops */
        else kvps__repl_snapshots(s); /* one that waited for no round to be half summed */
    }
    if (s->ack_now) kvps__repl_ack(s); /* a backup: one acknowledgement per batch, of the last message applied */
}
static void kvps__repl_finish(kvps_server *s) {
    /* the backups hold every goodbye and LOST sent, so they end too */
    if (s->role == KVPS__ROLE_PRIMARY) kvps__repl_drain(s, 1000);
}

// >>curve
/* CURVE on the server socket and its ZAP handler; certificates. */
static int kvps__z85_key(const char *z85, uint8_t out[32]) {
    return z85 && strlen(z85) == 40 && zmq_z85_decode(out, z85) != NULL ? 0 : -1;
}

/* CURVE with REPLICAS: the chain's public keys (curve_replica_keys, else
   $KVPS_CURVE_REPLICA_KEYS: one per place joined by '|', or one for all), checked against this
   server's own (derived from its secret sk) and against the workers' keys; this server's key
   pair is kept for its replica links. 0, or -1 (logged). Nothing to do without a chain. */
static int kvps__curve_replicas(kvps_server *s, const uint8_t sk[32]) {
    const kvps_server_desc *d = &s->desc;
    const char *list = d->curve_replica_keys ? d->curve_replica_keys : getenv("KVPS_CURVE_REPLICA_KEYS");
    s->desc.curve_replica_keys = NULL; /* (not kept: the keys are) */
    if (!d->replicas || !strchr(d->replicas, '|')) return 0;
    int nrep = 1;
    for (const char *p = d->replicas; *p; p++) nrep += *p == '|';
    if (!list || !*list) {
        kvps__log(KVPS_LOG_ERROR, "server %d: CURVE with replicas needs curve_replica_keys (else $KVPS_CURVE_REPLICA_KEYS): "
                  "the chain's public keys in chain order, joined by '|' as .replicas is (or one key for all), so that "
                  "the replica links speak CURVE and only the chain's servers may send replica traffic", d->rank);
        return -1;
    }
    char **keys = NULL;
    int nk = kvps__split_by(list, '|', &keys), bad = nk != 1 && nk != nrep;
    uint8_t k[32];
    for (int i = 0; i < nk && !bad; i++) bad = kvps__z85_key(keys[i], k) != 0;
    if (bad) {
        kvps__log(KVPS_LOG_ERROR, "server %d: curve_replica_keys must be one 40-character Z85 public key, or one per replica "
                  "of the chain (%d) joined by '|'; got %d", d->rank, nrep, nk);
        kvps__free_strv(keys, nk);
        return -1;
    }
    s->curve_rep = (char(*)[41])calloc((size_t)nrep, 41);
    if (!s->curve_rep) { kvps__free_strv(keys, nk); return -1; }
    for (int j = 0; j < nrep; j++) memcpy(s->curve_rep[j], keys[nk == 1 ? 0 : j], 41);
    kvps__free_strv(keys, nk);
    s->ncurve_rep = nrep;
    char skz[41], pubz[41];
    zmq_z85_encode(skz, sk, 32);
    int rc = zmq_curve_public(pubz, skz);
    memset(skz, 0, sizeof skz);
    if (rc != 0) { kvps__log(KVPS_LOG_ERROR, "server %d: cannot derive the public key (zmq_curve_public)", d->rank); return -1; }
    if (d->replica >= 0 && d->replica < nrep && strcmp(pubz, s->curve_rep[d->replica]) != 0) {
        kvps__log(KVPS_LOG_ERROR, "server %d replica %d: curve_replica_keys entry %d (%s) is not this server's public key "
                  "(%s, from its curve_secret_key)", d->rank, d->replica, d->replica, s->curve_rep[d->replica], pubz);
        return -1;
    }
    for (int i = 0; i < s->ncurve_ok; i++)
        for (int j = 0; j < nrep; j++) {
            zmq_z85_decode(k, s->curve_rep[j]);
            if (memcmp(k, s->curve_ok[i], 32) == 0) {
                kvps__log(KVPS_LOG_ERROR, "server %d: curve_clients[%d] is also replica %d's key in curve_replica_keys: a "
                          "worker's key cannot speak for a replica (give the workers keys of their own)", d->rank, i, j);
                return -1;
            }
        }
    zmq_z85_decode(s->curve_pub, pubz);
    memcpy(s->curve_sec, sk, 32);
    return 0;
}

/* CURVE on the server socket, and a ZAP handler that lets in only the listed public keys: the
   workers' (User-Id "worker KEY") and, with replicas, the chain's ("replica KEY"; kvps__admit
   tells them apart). */
static int kvps__curve_server(kvps_server *s) {
    uint8_t sk[32];
    const kvps_server_desc *d = &s->desc;
    if (!zmq_has("curve")) { kvps__log(KVPS_LOG_ERROR, "server: this libzmq has no CURVE"); return -1; }
    if (!s->own_ctx) { kvps__log(KVPS_LOG_ERROR, "server: CURVE needs a ZeroMQ context of the server's own"); return -1; }
    if (kvps__z85_key(d->curve_secret_key, sk) != 0 || d->num_curve_clients < 0 ||
        (d->num_curve_clients > 0 && !d->curve_clients)) {
        kvps__log(KVPS_LOG_ERROR, "server: curve_secret_key must be 40 Z85 characters, curve_clients a list");
        return -1;
    }
    s->curve_ok = (uint8_t(*)[32])calloc((size_t)d->num_curve_clients + 1, 32);
    if (!s->curve_ok) return -1;
    for (int i = 0; i < d->num_curve_clients; i++)
        if (kvps__z85_key(d->curve_clients[i], s->curve_ok[i]) != 0) {
            kvps__log(KVPS_LOG_ERROR, "server: curve_clients[%d] is not a 40-character Z85 key", i);
            return -1;
        }
    s->ncurve_ok = d->num_curve_clients;
    if (kvps__curve_replicas(s, sk) != 0) return -1;
    s->zap = zmq_socket(s->ctx, ZMQ_REP);
    if (!s->zap || zmq_bind(s->zap, "inproc://zeromq.zap.01") != 0) return -1;
    int one = 1;
    zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, sk, 32);
    zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "kvps", 4);
    memset(sk, 0, sizeof sk);
    s->desc.curve_secret_key = NULL; /* the caller's strings are not kept */
    s->desc.curve_clients = NULL;
    return 0;
}

/* Answers one ZAP request: 200 for a listed CURVE key, 400 for anything else. */
static void kvps__zap_serve(kvps_server *s) {
    zmq_msg_t fr[7];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp, *m = n < 7 ? &fr[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n && i < 7; i++) zmq_msg_close(&fr[i]);
            return;
        }
        more = zmq_msg_more(m);
        if (n < 7) n++;
        else zmq_msg_close(m);
    }
    /* version, request id, domain, address, routing id, mechanism, credentials */
    int ok = 0;
    char uid[64] = "";
    if (n == 7 && zmq_msg_size(&fr[5]) == 5 && memcmp(zmq_msg_data(&fr[5]), "CURVE", 5) == 0 &&
        zmq_msg_size(&fr[6]) == 32) {
        char kz[41];
        zmq_z85_encode(kz, (const uint8_t *)zmq_msg_data(&fr[6]), 32);
        for (int i = 0; i < s->ncurve_ok && !ok; i++) ok = memcmp(zmq_msg_data(&fr[6]), s->curve_ok[i], 32) == 0;
        if (ok) snprintf(uid, sizeof uid, "worker %s", kz);
        for (int j = 0; j < s->ncurve_rep && !ok; j++) ok = strcmp(kz, s->curve_rep[j]) == 0;
        if (ok && !uid[0]) snprintf(uid, sizeof uid, "replica %s", kz); /* (a key is not both: kvps__curve_replicas) */
    }
    if (!ok) {
        KVPS__STAT_ADD(s, errors, 1);
        kvps__log(KVPS_LOG_WARN, "server %d: refused a connection: %s", s->desc.rank,
                  n == 7 ? "its CURVE key is not listed" : "not a CURVE handshake");
    }
    const char *status = ok ? "200" : "400", *text = ok ? "OK" : "key not allowed";
    zmq_msg_t out[6];
    kvps__msg_from_buf(&out[0], "1.0", 3);
    zmq_msg_init(&out[1]);
    if (n >= 2) zmq_msg_copy(&out[1], &fr[1]);
    kvps__msg_from_buf(&out[2], status, 3);
    kvps__msg_from_buf(&out[3], text, strlen(text));
    kvps__msg_from_buf(&out[4], uid, strlen(uid)); /* the User-Id of every message of that connection */
    kvps__msg_from_buf(&out[5], "", 0);
    for (int i = 0; i < 6; i++) zmq_msg_send(&out[i], s->zap, i < 5 ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < n && i < 7; i++) zmq_msg_close(&fr[i]);
}

KVPS_API kvps_result kvps_cert_load(const char *path, char public_z85[41], char secret_z85[41]) {
    if (!path || !public_z85 || !secret_z85) return KVPS_ERR_INVALID_ARG;
    public_z85[0] = secret_z85[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return KVPS_ERR_CONFIG;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *names[2] = {"public-key", "secret-key"};
        char *outs[2] = {public_z85, secret_z85};
        for (int i = 0; i < 2; i++) {
            char *p = strstr(line, names[i]), *q1, *q2;
            if (!p || (q1 = strchr(p, '"')) == NULL || (q2 = strchr(q1 + 1, '"')) == NULL || q2 - q1 - 1 != 40) continue;
            memcpy(outs[i], q1 + 1, 40);
            outs[i][40] = 0;
        }
    }
    fclose(f);
    uint8_t k[32];
    if (kvps__z85_key(public_z85, k) != 0 || (secret_z85[0] && kvps__z85_key(secret_z85, k) != 0)) {
        public_z85[0] = secret_z85[0] = 0;
        return KVPS_ERR_CONFIG;
    }
    return KVPS_OK;
}

// >>server-api
/* Server create, run, start, stop, destroy, stats. */
static kvps_result kvps__server_fail(kvps_server *s, int rc, const char *what) {
    if (rc == KVPS_ERR_CONFIG) kvps__log(KVPS_LOG_ERROR, "server: %s: bad configuration", what);
    else kvps__log(KVPS_LOG_ERROR, "server: %s: %s", what, zmq_strerror(zmq_errno()));
    kvps_server_destroy(&s);
    return (kvps_result)rc;
}

/* The desc's settings that the server cannot work with, each logged; KVPS_OK or KVPS_ERR_CONFIG. */
/* USER RULES: at most 64, each with a function and 0 to KVPS_MAX_RULE_STATE state floats. */
static kvps_result kvps__user_rules_ok(const kvps_server_desc *desc) {
    int most = KVPS_RULE_USER_LAST - KVPS_RULE_USER + 1;
    if (desc->num_user_rules < 0 || desc->num_user_rules > most || (desc->num_user_rules && !desc->user_rules)) {
        kvps__log(KVPS_LOG_ERROR, "server desc: num_user_rules %d (0 to %d, with user_rules set)", desc->num_user_rules, most);
        return KVPS_ERR_CONFIG;
    }
    for (int i = 0; i < desc->num_user_rules; i++) {
        const kvps_user_rule *u = &desc->user_rules[i];
        if (!u->fn || u->n_state < 0 || u->n_state > KVPS_MAX_RULE_STATE) {
            kvps__log(KVPS_LOG_ERROR, "server desc: user rule %d ('%s'): %s", i, u->name ? u->name : "",
                      !u->fn ? "fn is NULL" : "n_state is not 0 to KVPS_MAX_RULE_STATE (8)");
            return KVPS_ERR_CONFIG;
        }
    }
    return KVPS_OK;
}

static kvps_result kvps__server_desc_ok(const kvps_server_desc *desc) {
    if (!kvps__io_cpus_ok(desc->zmq_ctx, desc->io_cpus, "server")) return KVPS_ERR_CONFIG;
    if (!kvps__heartbeat_ok(desc->heartbeat_ms, desc->peer_timeout_ms, "server")) return KVPS_ERR_CONFIG;
    if (desc->lr != 0.0f && desc->update != KVPS_UPDATE_SGD) {
        static const char *const updates[] = {"KVPS_UPDATE_MEAN", "KVPS_UPDATE_ACCUMULATE", "KVPS_UPDATE_SGD", "KVPS_UPDATE_CUSTOM"};
        kvps__log(KVPS_LOG_ERROR, "server desc: lr %g is set but update is %s, which has no learning rate: set .update = "
                                  "KVPS_UPDATE_SGD (or give tensors a rule of their own with kvps_worker_tensor_optim)",
                  (double)desc->lr, (unsigned)desc->update < KVPS_UPDATE_COUNT ? updates[desc->update] : "unknown");
        return KVPS_ERR_CONFIG;
    }
    if (!desc->endpoint || desc->num_workers < 1 || desc->rank < 0 || desc->io_threads < 0 ||
        (unsigned)desc->consistency >= KVPS_CONSISTENCY_COUNT || (unsigned)desc->update >= KVPS_UPDATE_COUNT ||
        desc->staleness < 0 || desc->staleness_min < 0 ||
        (desc->consistency == KVPS_ADAPTIVE && desc->staleness_min > desc->staleness) ||
        (desc->update == KVPS_UPDATE_CUSTOM && !desc->update_fn)) {
        kvps__log(KVPS_LOG_ERROR, "server desc: need endpoint, num_workers >= 1, a known consistency "
                                  "and update rule (CUSTOM needs update_fn)");
        return KVPS_ERR_CONFIG;
    }
    return kvps__user_rules_ok(desc);
}

/* The per-worker arrays (num_workers entries each) and the first table slots; 0, or -1 with
   none of them left allocated. */
static int kvps__server_arrays(kvps_server *s) {
    s->barrier_gen = (uint64_t *)calloc((size_t)s->m, sizeof *s->barrier_gen);
    s->seen = (kvps__seen *)calloc((size_t)s->m, sizeof *s->seen);
    s->rank_fd = (int *)malloc((size_t)s->m * sizeof *s->rank_fd);
    s->gone_since = (int64_t *)calloc((size_t)s->m, sizeof *s->gone_since);
    s->lost = (uint8_t *)calloc((size_t)s->m, 1);
    s->out = (uint8_t *)calloc((size_t)s->m, 1);
    s->ar_last = (double *)calloc((size_t)s->m, sizeof *s->ar_last);
    s->live_inc = (uint32_t *)calloc((size_t)s->m, sizeof *s->live_inc);
    s->bad_inc = (uint32_t *)calloc((size_t)s->m, sizeof *s->bad_inc);
    s->bad_text = (char(*)[200])calloc((size_t)s->m, sizeof *s->bad_text);
    s->heard = (uint8_t *)calloc((size_t)s->m, 1);
    s->done = (uint8_t *)calloc((size_t)s->m, 1);
    s->place_wait = (uint8_t *)calloc((size_t)s->m, 1);
    s->rejoin = (uint8_t *)calloc((size_t)s->m, 1);
    if (!s->barrier_gen || !s->seen || !s->rank_fd || !s->gone_since || !s->lost || !s->out || !s->ar_last || !s->live_inc || !s->bad_inc ||
        !s->bad_text || !s->heard || !s->done || !s->place_wait || !s->rejoin || kvps__table_grow(s) != 0) {
        free(s->barrier_gen); free(s->seen); free(s->rank_fd); free(s->gone_since); free(s->lost); free(s->out);
        free(s->ar_last); free(s->live_inc); free(s->bad_inc); free(s->bad_text); free(s->heard); free(s->done); free(s->place_wait);
        free(s->rejoin);
        return -1;
    }
    return 0;
}

/* The server's ROUTER: its options, its monitor, CURVE, the bind and the endpoint it resolved.
   KVPS_OK, or the result with s destroyed (kvps__server_fail). */
static kvps_result kvps__server_socket(kvps_server *s, const kvps_server_desc *desc) {
    s->router = zmq_socket(s->ctx, ZMQ_ROUTER);
    if (!s->router) return kvps__server_fail(s, KVPS_ERR_ZMQ, "zmq_socket");
    /* A peer that does not read its replies loses those past max_queued_replies (counted in
       stats.replies_dropped) instead of growing the server without bound; ROUTER_MANDATORY makes
       such a reply an error we can count rather than a silent drop. A worker reads replies on its
       I/O thread whatever its application does, so its queue never fills. RCVHWM stays
       unlimited: libzmq 4.3.4 aborts ("!_io_error", stream_engine_base.cpp) when a heartbeat
       times out on a connection whose input it stopped at a finite RCVHWM (libzmq#4364, #4767). */
    int hwm = s->desc.max_queued_replies, one_m = 1, zero = 0;
    zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->router, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one_m, sizeof one_m);
    /* cap what libzmq will allocate for one frame before kvps sees it */
    int64_t maxmsg = desc->max_msg_bytes > 0 ? desc->max_msg_bytes
                                              : (int64_t)(s->desc.max_value_len * sizeof(float)) + ((int64_t)64 << 20);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    int linger = 1000; /* a stopping server still flushes its last replies, for at most 1 s */
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
    int one = 1; /* a worker that reconnects takes its routing id (and parked answers) back */
    zmq_setsockopt(s->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    kvps__heartbeats(s->router, s->desc.heartbeat_ms, s->desc.peer_timeout_ms);
    if (kvps__monitor(s->ctx, s->router, ZMQ_EVENT_DISCONNECTED, &s->mon) != 0)
        return kvps__server_fail(s, KVPS_ERR_ZMQ, "zmq_socket_monitor");
    if (desc->curve_secret_key && kvps__curve_server(s) != 0) return kvps__server_fail(s, KVPS_ERR_CONFIG, "CURVE");
    if (kvps__zmq_bind(s->router, desc->endpoint) != 0) {
        kvps__log(KVPS_LOG_ERROR, "server %d: cannot bind its endpoint '%s' (the server's ZeroMQ socket): %s", desc->rank,
                  desc->endpoint, zmq_strerror(zmq_errno()));
        return kvps__server_fail(s, KVPS_ERR_BIND, "zmq_bind");
    }
    size_t sz = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &sz) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", desc->endpoint);
    s->desc.endpoint = s->endpoint;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_server_create(const kvps_server_desc *desc, kvps_server **out) {
    if (!desc || !out) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    kvps_result crc = kvps__server_desc_ok(desc);
    if (crc != KVPS_OK) return crc;
    kvps__tune_malloc(desc->no_malloc_tuning);
    kvps_server *s = (kvps_server *)calloc(1, sizeof *s);
    if (!s) return KVPS_ERR_NOMEM;
    s->desc = *desc;
    s->token = kvps__token_digest(desc->job_token);
    s->desc.job_token = NULL; /* (not kept: its digest is) */
    s->desc.max_value_len = kvps__def(desc->max_value_len, (uint64_t)1 << 28);
    if (s->desc.max_value_len > (SIZE_MAX - 128) / sizeof(float)) s->desc.max_value_len = (SIZE_MAX - 128) / sizeof(float);
    s->desc.lr = desc->lr != 0.0f ? desc->lr : KVPS_DEFAULT_LR;
    s->m = desc->num_workers;
    s->stop_pipe[0] = s->stop_pipe[1] = -1;
    s->cur_k = desc->consistency == KVPS_ADAPTIVE ? desc->staleness_min : desc->staleness;
    s->stats.staleness = (uint64_t)s->cur_k;
    /* the built-in update rules are the matching kvps_rule; update_fn is for your own */
    s->update_fn = desc->update_fn;
    static const kvps_rule builtin[] = {KVPS_RULE_MEAN, KVPS_RULE_ACCUMULATE, KVPS_RULE_SGD, KVPS_RULE_DEFAULT};
    s->default_opt.rule = builtin[desc->update];
    s->default_opt.lr = s->desc.lr;
    s->nurules = desc->num_user_rules;
    if (s->nurules) memcpy(s->urules, desc->user_rules, (size_t)s->nurules * sizeof *s->urules);
    s->desc.user_rules = NULL; /* (not kept: copied) */
    if (kvps__server_arrays(s) != 0) {
        free(s);
        return KVPS_ERR_NOMEM;
    }
    s->ref_rank = -1;
    s->primary_fd = -1;
    zmq_msg_init(&s->primary_id);
    s->desc.stall_ms = kvps__def(desc->stall_ms, 60000);
    for (int r = 0; r < s->m; r++) s->rank_fd[r] = -1;
    s->desc.heartbeat_ms = kvps__def(desc->heartbeat_ms, KVPS_DEFAULT_HEARTBEAT_MS);
    s->desc.peer_timeout_ms = kvps__def(desc->peer_timeout_ms, KVPS_DEFAULT_PEER_TIMEOUT_MS);
    s->desc.max_queued_replies = kvps__def(desc->max_queued_replies, 10000);
    pthread_mutex_init(&s->ckpt_mu, NULL);
    pthread_cond_init(&s->ckpt_cv, NULL);
    if (pipe(s->stop_pipe) != 0) return kvps__server_fail(s, KVPS_ERR_CONFIG, "pipe");
    fcntl(s->stop_pipe[0], F_SETFL, O_NONBLOCK);
    fcntl(s->stop_pipe[1], F_SETFL, O_NONBLOCK);
    crc = kvps__ctx_take(desc->zmq_ctx, desc->io_threads, &s->desc.io_cpus, &s->ctx, &s->own_ctx);
    if (crc != KVPS_OK) return kvps__server_fail(s, crc, "context");
    crc = kvps__server_socket(s, desc);
    if (crc != KVPS_OK) return crc; /* (s is gone) */
    crc = kvps__tl_open(&s->tl, desc->timeline, "server", "server", desc->rank, desc->rank);
    if (crc != KVPS_OK) return kvps__server_fail(s, crc, "timeline");
    if (kvps__repl_setup(s) != 0) return kvps__server_fail(s, KVPS_ERR_CONFIG, "replicas");
    kvps__log(KVPS_LOG_INFO, "server %d: bound %s, %d workers, %s", desc->rank, s->endpoint, s->m,
              (const char *[]){"BSP", "async", "SSP", "adaptive"}[desc->consistency]);
    if (desc->checkpoint_path && *desc->checkpoint_path) kvps__ckpt_sweep(desc->rank, desc->checkpoint_path);
    *out = s;
    return KVPS_OK;
}

KVPS_API const char *kvps_server_endpoint(const kvps_server *s) { return s ? s->endpoint : NULL; }

KVPS_API void kvps_server_stats_get(const kvps_server *s, kvps_server_stats *out) {
    if (!s || !out) return;
    const uint64_t *src = (const uint64_t *)&s->stats;
    uint64_t *dst = (uint64_t *)out;
    for (size_t i = 0; i < sizeof *out / sizeof(uint64_t); i++)
        dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

KVPS_API kvps_result kvps_server_run(kvps_server *s) {
    if (!s) return KVPS_ERR_INVALID_ARG;
    zmq_pollitem_t items[4 + 2 * 8];
    for (;;) {
        /* router, stop pipe, monitor, ZAP handler; then a primary's links to its backups and
           their connection events */
        zmq_pollitem_t base[4] = {{s->router, 0, ZMQ_POLLIN, 0}, {NULL, s->stop_pipe[0], ZMQ_POLLIN, 0},
                                  {s->mon, 0, ZMQ_POLLIN, 0}, {s->zap, 0, ZMQ_POLLIN, 0}};
        memcpy(items, base, sizeof base);
        int nitems = 4;
        if (!s->zap) items[3].socket = s->mon, items[3].events = 0; /* (a slot that never fires) */
        nitems = kvps__repl_poll_items(s, items, nitems, (int)(sizeof items / sizeof items[0]));
        /* the stall inspector looks once a second (an idle server wakes that often); a primary
           with a backup not yet joined looks at its links every 100 ms */
        long tmo = kvps__liveness_pending(s) ? 100 : s->desc.stall_ms > 0 ? 1000 : -1;
        tmo = kvps__repl_timeout(s, tmo);
        if (s->end_at) { /* an elastic job that has ended: its wait for a lost worker to come back */
            int64_t left = s->end_at - kvps__now_ms();
            if (tmo < 0 || tmo > left) tmo = left < 0 ? 0 : (long)left;
        }
        if (zmq_poll(items, nitems, tmo) < 0) {
            if (zmq_errno() == EINTR) continue;
            kvps__log(KVPS_LOG_ERROR, "server %d: zmq_poll: %s", s->desc.rank, zmq_strerror(zmq_errno()));
            return KVPS_ERR_ZMQ;
        }
        kvps__repl_woke(s, tmo); /* a primary that stood still (stopped) past peer_timeout_ms is fenced */
        if (items[1].revents & ZMQ_POLLIN) {
            char c;
            int stop = 0;
            while (read(s->stop_pipe[0], &c, 1) == 1) stop |= c != 'c'; /* 'c': a checkpoint is asked for */
            if (stop) return KVPS_OK;
        }
        /* Drain a batch, then look at the stop pipe again. */
        for (int i = 0; i < 256; i++) {
            zmq_msg_t fr[5]; /* a request is at most [id][meta][values]; a primary's copy of one has 2 more */
            int extra;
            int n = kvps__recv_msg(s->router, fr, 5, &extra);
            if (n <= 0) break;
            kvps__handle(s, fr, n + extra);
            for (int j = 0; j < n; j++) zmq_msg_close(&fr[j]);
        }
        kvps__flush_all(s); /* nothing more queued: apply what was held back */
        kvps__repl_batch(s, items + 4, nitems - 4); /* the links' news; a backup's acknowledgement */
        if (s->zap && (items[3].revents & ZMQ_POLLIN)) kvps__zap_serve(s);
        if (items[2].revents & ZMQ_POLLIN) kvps__liveness_events(s);
        if (kvps__liveness_pending(s)) kvps__liveness(s);
        kvps__checkpoint_maybe(s);
        kvps__job_end(s);
        if (s->finish) {
            /* the last goodbyes' answers; the backups hold every goodbye and LOST sent, so they end too */
            kvps__repl_finish(s);
            if (s->finish == 2) {
                char lost[200], fin[200];
                kvps__log(KVPS_LOG_WARN, "server %d: the job has ended with workers lost: lost %s, finished %s (of %d); "
                          "stopping", s->desc.rank, kvps__ranks_text(s, s->lost, lost, sizeof lost),
                          kvps__ranks_text(s, s->done, fin, sizeof fin), s->m);
                return KVPS_ERR_PEER_LOST;
            }
            kvps__log(KVPS_LOG_INFO, "server %d: all %d workers finished; stopping", s->desc.rank, s->m);
            return KVPS_OK; /* (closing the socket flushes the last acknowledgements: ZMQ_LINGER) */
        }
        if (s->desc.stall_ms > 0) {
            int64_t now = kvps__now_ms();
            if (now >= s->stall_next) {
                s->stall_next = now + 1000;
                kvps__stall_check(s, now);
            }
        }
    }
}

static void *kvps__server_thread(void *arg) {
    kvps_server *s = (kvps_server *)arg;
    kvps_result r = kvps_server_run(s);
    pthread_mutex_lock(&s->ckpt_mu);
    s->run_result = r;
    s->stopped = 1;
    pthread_cond_broadcast(&s->ckpt_cv);
    pthread_mutex_unlock(&s->ckpt_mu);
    return NULL;
}

KVPS_API kvps_result kvps_server_wait(kvps_server *s, int timeout_ms) {
    if (!s) return KVPS_ERR_INVALID_ARG;
    if (!s->started) return KVPS_ERR_STATE;
    struct timespec until = kvps__deadline_ts(timeout_ms < 0 ? 0 : timeout_ms); /* (< 0: not used) */
    int rc = 0;
    pthread_mutex_lock(&s->ckpt_mu);
    while (!s->stopped && rc == 0)
        rc = timeout_ms < 0 ? pthread_cond_wait(&s->ckpt_cv, &s->ckpt_mu) : pthread_cond_timedwait(&s->ckpt_cv, &s->ckpt_mu, &until);
    int stopped = s->stopped;
    kvps_result r = s->run_result;
    pthread_mutex_unlock(&s->ckpt_mu);
    return stopped ? r : KVPS_ERR_TIMEOUT;
}

KVPS_API kvps_result kvps_server_start(kvps_server *s) {
    if (!s) return KVPS_ERR_INVALID_ARG;
    if (s->started) return KVPS_ERR_STATE;
    if (pthread_create(&s->thread, NULL, kvps__server_thread, s) != 0) return KVPS_ERR_NOMEM;
    s->started = 1;
    return KVPS_OK;
}

KVPS_API void kvps_server_stop(kvps_server *s) {
    if (!s || s->stop_pipe[1] < 0) return;
    char c = 1;
    ssize_t rc = write(s->stop_pipe[1], &c, 1);
    (void)rc;
}

KVPS_API void kvps_server_destroy(kvps_server **sp) {
    if (!sp || !*sp) return;
    kvps_server *s = *sp;
    *sp = NULL;
    if (s->started) {
        kvps_server_stop(s);
        pthread_join(s->thread, NULL);
    }
    kvps__tl_server_end(s);
    for (uint32_t i = 0; i < s->nkeys; i++) kvps__key_free(s->keys[i], s->m);
    while (s->barrier_waiters) {
        kvps__parked *p = s->barrier_waiters;
        s->barrier_waiters = p->next;
        kvps__parked_free(p);
    }
    kvps__repl_free(s);
    if (s->mon) zmq_close(s->mon);
    if (s->zap) zmq_close(s->zap);
    free(s->curve_ok);
    free(s->curve_rep);
    memset(s->curve_sec, 0, sizeof s->curve_sec);
    if (s->router) zmq_close(s->router);
    if (s->own_ctx && s->ctx) zmq_ctx_term(s->ctx);
    for (int i = 0; i < 2; i++)
        if (s->stop_pipe[i] >= 0) close(s->stop_pipe[i]);
    free(s->keys); free(s->slots); free(s->barrier_gen); free(s->scratch_idx); free(s->scratch);
    free(s->dscratch); free(s->seen); free(s->dirty); free(s->rank_fd); free(s->gone_since); free(s->lost); free(s->out);
    free(s->ar_last);
    free(s->live_inc); free(s->bad_inc); free(s->bad_text); free(s->heard); free(s->done); free(s->place_wait);
    free(s->rejoin);
    kvps__place_free(&s->place);
    for (uint32_t i = 0; i < s->cap_tnames; i++) free(s->tnames[i].name);
    free(s->tnames);
    pthread_mutex_destroy(&s->ckpt_mu);
    pthread_cond_destroy(&s->ckpt_cv);
    while (s->tables) { struct kvps__table *t = s->tables; s->tables = t->next; kvps__table_free(t); }
    free(s);
}

// >>client
typedef struct kvps__dest { float *ptr; uint64_t len; } kvps__dest;

/* Where a request stands with one of its servers. */
typedef enum kvps__rstate {
    KVPS__RS_NONE = 0,  /* nothing sent to it */
    KVPS__RS_SENT = 1,  /* sent, awaiting its reply */
    KVPS__RS_DONE = 2,  /* answered */
    KVPS__RS_LOST = 3   /* answered KVPS_ERR_PEER_LOST (a worker the server waits for is lost): sent again by
                           the next wait or test */
} kvps__rstate;
typedef struct kvps__req {
    uint64_t id;
    int refs;            /* 1 for the worker + one per zero-copy frame ZeroMQ still holds */
    int pending;         /* replies still expected */
    int sent;            /* messages sent */
    kvps_result status;
    uint32_t *dbegin;    /* per server: first index in dest (n + 1 entries) */
    uint8_t *state;      /* per server: a kvps__rstate */
    int lost;            /* servers in KVPS__RS_LOST */
    int64_t lost_at;     /* when the last such answer came (ms): re-sent no sooner than 100 ms after */
    int lost_told;       /* (first round) the caller was told KVPS_ERR_PEER_LOST: later waits ride it out */
    int tensor;          /* tensor requests: its index + 1 (0: none), for stats and messages (an index:
                            registering more tensors may move w->tensors while the request is out) */
    uint32_t *dups;      /* row pulls: (from, to) row positions to copy once all replies are in */
    size_t ndups;
    float *dup_base;
    uint32_t dup_dim;
    int coded_pull;
    kvps_codec pull_c;
    kvps__dest *dest;    /* pull destinations in send order */
    struct kvps_view *view; /* zero-copy tensor pull: replies are kept, not copied */
    zmq_msg_t (*kept)[2];   /* per server: the frames sent, kept until its reply to re-send them */
    uint8_t *nkept;
    uint64_t next;       /* a tensor op with more slices than servers goes out in rounds of at most one
                            slice per server, chained: the next round's request, 0 for the last */
    uint32_t vbase;      /* the tensor slice (view part) of dest[0] */
    uint8_t ctl;         /* a request of the worker's own (KVPS__OP_HELLO, NAME, BYE), 0 for the caller's */
    uint8_t read;        /* its messages are READs (kept as READs; sent to the shard's read replica, or to
                            its server as a READ or, once the push is answered there, a pull: kvps__read_send) */
    uint64_t push;       /* a READ: the handle of the push it reads after (that chain's first round) */
    uint8_t *rwait;      /* a READ, per server: refused before the push was answered there; its pull goes
                            when it is (kvps__reads_release) */
    int prio;            /* FUSION: its messages' priority (its tensor's; a fused round's highest) */
    uint8_t zc;          /* a values frame is the caller's buffer (zero-copy): copied if it is kept for replay */
    uint64_t *sbytes;    /* credit_bytes set: per server, the bytes of its message in flight (0: none) */
    uint8_t *queued;     /* credit_bytes set: per server, its message waits in the worker's queue */
    int tl_op;           /* timeline on: the op (0: not drawn), when posted (ns), bytes, keys or rows */
    uint64_t tl_t0, tl_bytes, tl_n;
} kvps__req;

typedef struct kvps__vpart {
    const float *data;
    uint64_t off, len;
    zmq_msg_t msg; /* the reply that holds data (moved out of the socket's frame) */
    float *own;    /* decoded (coded pulls) or realigned values, when data is not in msg */
} kvps__vpart;
struct kvps_view {
    size_t n;
    kvps__vpart *part;
};

/* FAULTS, checkpoints: what a worker keeps to send a restored server again. A request that changed
   a shard's state (push, pushpull, init, config, push_rows, table, barrier) and was answered by a
   server that writes checkpoints is kept, stamped with the reply's checkpoint stamp
   (kvps__stamp), until the server says a higher one: its checkpoints hold the request from then
   on. A server restored from its newest checkpoint gets, behind the worker's hello, every request
   of the worker it may lack, in the order they were first sent; the re-send windows drop those it
   holds. A pushpull is kept as the push it carried (its pull was answered). */
typedef struct kvps__rent { /* one request kept: its id, its stamp, its frames (to the server) */
    uint64_t id;
    uint32_t stamp;
    int nf;
    zmq_msg_t f[2];
} kvps__rent;
typedef struct kvps__replay { /* per server */
    kvps__rent *e;    /* in the order they were answered */
    size_t n, cap;
    uint32_t heard;   /* the highest stamp heard from the server (0: none, or it writes no checkpoints) */
    uint8_t reset;    /* moved to another replica (stamps of its own): the next stamp heard restamps e */
    uint8_t hello_ok; /* the server accepted this worker's hello: after a reconnect it says hello again */
} kvps__replay;

typedef struct kvps__tensor_info {
    char *name;
    uint64_t len;
    uint32_t nslices, hv;
    uint64_t *keys, *off, *slen; /* per slice */
    int *server;
    kvps_codec push_c, pull_c;
    int has_push, has_pull;
    float **resid; /* error feedback per slice, or NULL */
    kvps_tensor_stats st;
    kvps_result bad;  /* a server refused its name (another worker registered it otherwise) */
    char *bad_text;
    int prio;         /* FUSION: higher goes first */
    uint64_t fstamp;  /* FUSION: marks a tensor already in the list being sent */
} kvps__tensor_info;

struct kvps_worker {
    kvps_worker_desc desc;
    void *ctx;
    int own_ctx;
    int n;
    void **socks;
    zmq_pollitem_t *items;
    char **endpoints;  /* per server (shard): its entry of the list (REPLICAS: the chain) */
    char ***reps;      /* per shard: its replicas' endpoints (one without REPLICAS) */
    int *nrep, *cur;   /* per shard: how many, and which one this worker speaks to */
    /* placement (KEYS, TENSORS AND SHARDING): key -> one of V virtual shards (V = 256 x the
       first n, so that v mod n is today's server) -> vmap[v], the server; a reshard moves whole
       virtual shards */
    uint32_t V;
    uint32_t *vmap;
    kvps__place place; /* the server counts vmap went through (one: never resharded) */
    int place_fixed;   /* a keyed request has gone out: the placement can no longer be taken from a
                          server's hello answer */
    int hellos_heard;  /* hello answers (kvps__place_ready waits for the first) */
    /* FUSION, credit_bytes set: bytes in flight per server, and the messages waiting for credit */
    uint64_t *inflight;
    struct kvps__qent *cq;
    size_t ncq, cap_cq;
    uint64_t cq_seq;
    zmq_msg_t ctl_reply; /* the values of the last KEYS / EXPORT answer (a reshard's) */
    uint64_t *rstamp, round_stamp; /* per server: kvps__round_end's marks */
    kvps__replay *rp;  /* per server: answered requests its checkpoints may not hold yet (FAULTS) */
    kvps__req **slots; /* request table: handle = (sequence << 24) | (slot + 1), rising */
    uint64_t seq;
    uint32_t incarnation; /* random per worker object: tells a restarted worker from a re-send */
    uint64_t token;       /* the job token's digest (JOB TOKEN; 0: none), for every hello */
    void **mons;       /* per server: PAIR socket receiving its DEALER's connect events */
    uint8_t *down;     /* per server: connection lost, not back yet */
    uint8_t *refused;  /* per server: why its handshakes fail (KVPS__HS_*), 0 when they do not */
    uint16_t *hs_cuts; /* per server: handshakes cut short in a row */
    int32_t *hs_val;   /* per server: the last failure's ZAP status, protocol error or errno */
    int curve;         /* this worker speaks CURVE */
    uint8_t curve_pub[32], curve_sec[32]; /* its key pair, for the servers a reshard adds (zeroed
                                             by destroy) */
    uint8_t *curve_skeys; /* the servers' public keys: 32 bytes each, ncurve_skeys of them (1: all) */
    int ncurve_skeys;
    int64_t last_watch; /* when connection events were last read (each read is a syscall) */
    int64_t *down_since;
    uint8_t *up_once;  /* per server: a connection was ever made (inproc: from the start) */
    /* REPLICAS, .read_local: per shard, the replica on this host that READs go to (rj: its place in
       the chain, -1: none), its socket and monitor, whether it is connected, and whether it said it
       never answers READs (its shard is not BSP); the pushpull's push (its handle) a READ being made
       reads after */
    int *rj;
    void **rsocks, **rmons;
    uint8_t *rup;
    uint8_t *rnever;
    int nitems;
    uint64_t read_push;
    int ready;         /* create succeeded: destroy says goodbye */
    int finished;      /* kvps_worker_finish was called */
    kvps_result fatal; /* a server refused this worker's hello: every wait says so */
    char (*status_text)[400]; /* per server: its answer to the last STATUS asked */
    uint8_t *status_got;
    uint32_t nslots;
    uint32_t *free_slots;
    uint32_t nfree;
    kvps__tensor_info *tensors;
    int ntensors, cap_tensors;
    struct { uint64_t id; uint32_t dim; } *tables;
    int ntables;
    /* per-call scratch: keys grouped by server */
    uint32_t *order, *count, *bucket; /* raw keys by server (kvps__keys_op): the order, the servers' starts, each key's server */
    size_t order_cap;
    char errmsg[1024];
    char fatal_text[300];
    kvps__tl *tl;       /* the timeline, NULL when off */
};

/* The endpoint this worker speaks to for server (shard) s: its current replica's. */
static const char *kvps__ep(const kvps_worker *w, int s) { return w->reps ? w->reps[s][w->cur[s]] : w->endpoints[s]; }

static void kvps__req_drop_kept(kvps__req *q, int srv) {
    if (!q->nkept) return;
    for (int j = 0; j < q->nkept[srv]; j++) zmq_msg_close(&q->kept[srv][j]);
    q->nkept[srv] = 0;
}

static void kvps__req_unref(kvps__req *q) {
    if (__atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        free(q->kept);
        free(q->nkept);
        free(q->dbegin);
        free(q->dest);
        free(q->state);
        free(q->dups);
        free(q->sbytes);
        free(q->queued);
        free(q->rwait);
        free(q);
    }
}

static void kvps__zc_free(void *data, void *hint) {
    (void)data;
    kvps__req_unref((kvps__req *)hint);
}

/* ---- FAULTS, checkpoints: the replay log (kvps__replay) ---- */
static void kvps__rent_close(kvps__rent *e) {
    for (int j = 0; j < e->nf; j++) zmq_msg_close(&e->f[j]);
    e->nf = 0;
}
static void kvps__replay_clear(kvps__replay *p) {
    for (size_t i = 0; i < p->n; i++) kvps__rent_close(&p->e[i]);
    free(p->e);
    memset(p, 0, sizeof *p);
}
/* 1 when a stamp is older than another (stamps rise by one per checkpoint; compared round the circle). */
static int kvps__stamp_before(uint32_t a, uint32_t b) { return (int32_t)(a - b) < 0; }

/* Server srv answered, with checkpoint stamp a (every reply that succeeded carries one, 0 from a
   server that writes none): what it has checkpointed is no longer kept. */
static void kvps__stamp_heard(kvps_worker *w, int srv, uint32_t a) {
    kvps__replay *p = &w->rp[srv];
    if (!a) { /* no checkpoints there: nothing to keep */
        if (p->n) {
            uint8_t ok = p->hello_ok;
            kvps__replay_clear(p);
            p->hello_ok = ok;
        }
        p->heard = 0;
        p->reset = 0;
        return;
    }
    if (p->reset) { /* another replica, whose checkpoints count apart: what is kept, it holds before its stamp a */
        for (size_t i = 0; i < p->n; i++) p->e[i].stamp = a;
        p->reset = 0;
        p->heard = a;
        return;
    }
    if (p->heard && !kvps__stamp_before(p->heard, a)) return;
    p->heard = a;
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (kvps__stamp_before(p->e[i].stamp, a)) { kvps__rent_close(&p->e[i]); continue; }
        if (k != i) {
            p->e[k] = p->e[i]; /* (ids and stamps; the frames move below) */
            for (int j = 0; j < p->e[i].nf; j++) {
                zmq_msg_init(&p->e[k].f[j]);
                zmq_msg_move(&p->e[k].f[j], &p->e[i].f[j]);
            }
        }
        k++;
    }
    p->n = k;
}

static void kvps__req_drop_kept(kvps__req *q, int srv);
/* Request q's message to srv was answered KVPS_OK with stamp a: kept for a restore (above) when it
   changed the shard and the server writes checkpoints, else its frames are let go. A pushpull is
   kept as a push; a frame that is the caller's buffer is copied (the caller has it back after wait). */
static void kvps__req_answered(kvps_worker *w, kvps__req *q, int srv, uint32_t a) {
    kvps__replay *p = &w->rp[srv];
    kvps__hdr h;
    int op = 0, nf = q->nkept[srv];
    if (a && !q->ctl && !q->read && nf && zmq_msg_size(&q->kept[srv][0]) >= sizeof h) {
        memcpy(&h, zmq_msg_data(&q->kept[srv][0]), sizeof h);
        op = h.op;
    }
    if (!kvps__op((unsigned)op)->kept) {
        kvps__req_drop_kept(q, srv);
        return;
    }
    if (p->n == p->cap) {
        size_t nc = p->cap ? 2 * p->cap : 64;
        kvps__rent *ne = (kvps__rent *)malloc(nc * sizeof *ne);
        if (!ne) {
            kvps__log(KVPS_LOG_ERROR, "worker %d: out of memory keeping a request for server %d: a restore from its "
                      "checkpoint would lose it", w->desc.rank, srv);
            kvps__req_drop_kept(q, srv);
            return;
        }
        for (size_t i = 0; i < p->n; i++) { /* (messages move by zmq_msg_move, never as bytes) */
            ne[i] = p->e[i];
            for (int j = 0; j < p->e[i].nf; j++) {
                zmq_msg_init(&ne[i].f[j]);
                zmq_msg_move(&ne[i].f[j], &p->e[i].f[j]);
                zmq_msg_close(&p->e[i].f[j]);
            }
        }
        free(p->e);
        p->e = ne;
        p->cap = nc;
    }
    kvps__rent *e = &p->e[p->n];
    e->id = q->id;
    e->stamp = a;
    e->nf = 0;
    int bad = 0;
    if (op == KVPS__OP_PUSHPULL) { /* the push it carried: its pull was answered */
        h.op = KVPS__OP_PUSH;
        h.flags = (uint16_t)(h.flags & ~KVPS__FLAG_CODED_REPLY);
        h.aux = 0;
        bad = kvps__msg_from_buf(&e->f[0], zmq_msg_data(&q->kept[srv][0]), zmq_msg_size(&q->kept[srv][0])) != 0;
        if (!bad) memcpy(zmq_msg_data(&e->f[0]), &h, sizeof h);
    } else {
        zmq_msg_init(&e->f[0]);
        zmq_msg_move(&e->f[0], &q->kept[srv][0]);
    }
    if (!bad) e->nf = 1;
    if (!bad && nf == 2) {
        if (q->zc) bad = kvps__msg_from_buf(&e->f[1], zmq_msg_data(&q->kept[srv][1]), zmq_msg_size(&q->kept[srv][1])) != 0;
        else { zmq_msg_init(&e->f[1]); zmq_msg_move(&e->f[1], &q->kept[srv][1]); }
        if (!bad) e->nf = 2;
    }
    kvps__req_drop_kept(q, srv);
    if (bad) {
        kvps__rent_close(e);
        kvps__log(KVPS_LOG_ERROR, "worker %d: out of memory keeping a request for server %d: a restore from its checkpoint "
                  "would lose it", w->desc.rank, srv);
        return;
    }
    p->n++;
}

static kvps_result kvps__hello_all(kvps_worker *w);

/* A DEALER to shard i, with a routing id that survives reconnects ('s': its server's socket,
   'r': its read replica's), so the server's answers to requests it parked before a drop still
   reach it (the server hands the id over); NULL when ZeroMQ cannot make one. */
static void *kvps__worker_dealer(kvps_worker *w, int i, char kind) {
    void *s = zmq_socket(w->ctx, ZMQ_DEALER);
    if (!s) return NULL;
    int zero = 0;
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    unsigned char rid[16] = {'k', 'v', 'p', (unsigned char)kind};
    uint32_t rk = (uint32_t)w->desc.rank, si = (uint32_t)i;
    memcpy(rid + 4, &w->incarnation, 4);
    memcpy(rid + 8, &rk, 4);
    memcpy(rid + 12, &si, 4);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, rid, sizeof rid);
    kvps__heartbeats(s, w->desc.heartbeat_ms, w->desc.peer_timeout_ms);
    return s;
}

/* Server i's DEALER (CURVE when skey), its monitor and its connection to the current replica. */
static kvps_result kvps__worker_sock(kvps_worker *w, int i, const uint8_t *skey, const uint8_t *cpub, const uint8_t *csec) {
    void *s = w->socks[i] = kvps__worker_dealer(w, i, 's');
    if (!s) return KVPS_ERR_ZMQ;
    if (skey) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, skey, 32);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, cpub, 32);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, csec, 32);
    }
    if (kvps__monitor(w->ctx, s, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                          ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                          ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, &w->mons[i]) != 0)
        return KVPS_ERR_ZMQ;
    char why[400];
    if (!kvps__endpoint_resolves(kvps__ep(w, i), why, sizeof why))
        kvps__log(KVPS_LOG_WARN, "worker %d: server %d's endpoint '%s': %s; trying on (a name that appears later is used)",
                  w->desc.rank, i, kvps__ep(w, i), why);
    if (zmq_connect(s, kvps__ep(w, i)) != 0) {
        kvps__log(KVPS_LOG_ERROR, "worker %d: cannot connect to server %d at '%s': %s", w->desc.rank, i, kvps__ep(w, i),
                  zmq_strerror(zmq_errno()));
        return KVPS_ERR_CONNECT;
    }
    w->up_once[i] = strncmp(kvps__ep(w, i), "inproc://", 9) == 0; /* no handshake events there */
    return KVPS_OK;
}

/* ---- REPLICAS, .read_local: READs from a replica on this host ----
   A pushpull under BSP with replicas is sent as its push, to the primary, and a READ of the same
   keys (kvps__serve_read), to the shard's replica on this host when there is one other than the
   replica this worker speaks to: the result then does not cross the link, which the round's sum
   already crossed on its way down the chain. A READ pending when that replica's connection
   drops, every READ while it is gone, and every READ while the worker speaks to that replica
   itself go to the shard's server (the one the push goes to) as they are, READs: any replica
   answers one only once the round holding this worker's push is applied there, in whatever
   order the two arrive. A READ refused (the replica or the server cannot tell: the first step,
   just after a snapshot) goes to the shard's server as a pull, but only once the push has been
   answered there (kvps__read_send). Never before: a pull is served with the rounds of the
   pushes that server has received, and a push re-sent after a dropped connection can arrive
   after a pull sent later; ZeroMQ sends what was queued for a connection that is down before
   the re-sends, and the server reads an old connection's messages and a new one's in either
   order. A pull sent behind the push returned the round before it (issue 27). */

/* 1 when endpoint ep is on this host: ipc, inproc, or a TCP address this host can bind. */
static int kvps__ep_local(const char *ep) {
    if (strncmp(ep, "ipc://", 6) == 0 || strncmp(ep, "inproc://", 9) == 0) return 1;
    if (strncmp(ep, "tcp://", 6) != 0) return 0;
    const char *h = ep + 6, *e = *h == '[' ? strchr(++h, ']') : strrchr(h, ':');
    char host[256];
    if (!e || e == h || (size_t)(e - h) >= sizeof host) return 0;
    memcpy(host, h, (size_t)(e - h));
    host[e - h] = 0;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_DGRAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) return 0;
    int local = 0;
    for (struct addrinfo *a = res; a && !local; a = a->ai_next) { /* an address of this host binds (port 0) */
        int fd = socket(a->ai_family, SOCK_DGRAM, 0);
        if (fd < 0) continue;
        local = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
        close(fd);
    }
    freeaddrinfo(res);
    return local;
}

/* Shards from..n-1: the read replica (the first on this host past the primary's place) and its
   socket. A CURVE worker reads from the primaries (its replicas' keys are not known apart). */
static kvps_result kvps__reads_open(kvps_worker *w, int from) {
    if (w->curve) return KVPS_OK;
    if (!w->rj) {
        w->rj = (int *)malloc((size_t)w->n * sizeof *w->rj);
        w->rsocks = (void **)calloc((size_t)w->n, sizeof *w->rsocks);
        w->rmons = (void **)calloc((size_t)w->n, sizeof *w->rmons);
        w->rup = (uint8_t *)calloc((size_t)w->n, 1);
        w->rnever = (uint8_t *)calloc((size_t)w->n, 1);
        if (!w->rj || !w->rsocks || !w->rmons || !w->rup || !w->rnever) return KVPS_ERR_NOMEM;
        for (int i = 0; i < w->n; i++) w->rj[i] = -1;
    }
    for (int i = from; i < w->n; i++) {
        w->rj[i] = -1;
        for (int j = 1; j < w->nrep[i] && w->rj[i] < 0; j++)
            if (kvps__ep_local(w->reps[i][j])) w->rj[i] = j;
        if (w->rj[i] < 0) continue;
        void *d = w->rsocks[i] = kvps__worker_dealer(w, i, 'r');
        if (!d) return KVPS_ERR_ZMQ;
        if (kvps__monitor(w->ctx, d, ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED, &w->rmons[i]) != 0)
            return KVPS_ERR_ZMQ;
        if (zmq_connect(d, w->reps[i][w->rj[i]]) != 0) {
            kvps__log(KVPS_LOG_ERROR, "worker %d: cannot connect to '%s': %s", w->desc.rank, w->reps[i][w->rj[i]],
                      zmq_strerror(zmq_errno()));
            return KVPS_ERR_CONNECT;
        }
        w->rup[i] = strncmp(w->reps[i][w->rj[i]], "inproc://", 9) == 0; /* (no handshake events there) */
        kvps__log(KVPS_LOG_INFO, "worker %d: shard %d: pushpulls read from replica %d (%s), on this host", w->desc.rank, i,
                  w->rj[i], w->reps[i][w->rj[i]]);
    }
    return KVPS_OK;
}

/* Shard s's read replica's socket when a READ goes there now, else NULL (a pull to the primary). */
static void *kvps__read_via(const kvps_worker *w, int s) {
    if (!w->rsocks || !w->rsocks[s] || !w->rup[s] || w->rj[s] == w->cur[s]) return NULL;
    return w->rnever[s] ? NULL : w->rsocks[s];
}

/* Any shard's READs go to a read replica now: a pushpull is then sent as push + READ (not with
   credit_bytes: a pull to the primary could pass its push waiting in the queue). */
static int kvps__reads_on(const kvps_worker *w) {
    for (int s = 0; w->rsocks && !w->desc.credit_bytes && s < w->n; s++)
        if (kvps__read_via(w, s)) return 1;
    return 0;
}

/* Sends the frames kept of q's message to server srv on sock (references, not copies). */
static int kvps__send_copies(void *sock, kvps__req *q, int srv) {
    zmq_msg_t f[2];
    int nf = q->nkept[srv];
    for (int j = 0; j < nf; j++) {
        zmq_msg_init(&f[j]);
        zmq_msg_copy(&f[j], &q->kept[srv][j]);
    }
    return kvps__send_frames(sock, f, nf);
}

static kvps__req *kvps__req_get(kvps_worker *w, kvps_req h);
/* 1 when every round of the push READ q reads after has its answer from server srv (or sent
   it nothing): the push has reached srv, so a pull there waits for the push's round. */
static int kvps__read_pushed(kvps_worker *w, const kvps__req *q, int srv) {
    for (kvps__req *c = kvps__req_get(w, q->push); c && !c->read; c = c->next ? kvps__req_get(w, c->next) : NULL)
        if (c->state[srv] == KVPS__RS_SENT) return 0;
    return 1;
}

/* Sends READ request q's kept message for server srv: to the read replica (not with primary
   set), else to the shard's server: as a pull (the same keys, no values frame) once the push is
   answered there, as the READ it is before that, and nothing while a refused READ waits for
   that answer (kvps__reads_release sends its pull). 0, or -1 when the send failed. */
static int kvps__read_send(kvps_worker *w, kvps__req *q, int srv, int primary) {
    void *via = primary ? NULL : kvps__read_via(w, srv);
    if (via) return kvps__send_copies(via, q, srv);
    if (!kvps__read_pushed(w, q, srv)) return q->rwait[srv] ? 0 : kvps__send_copies(w->socks[srv], q, srv);
    q->rwait[srv] = 0;
    zmq_msg_t f[1];
    size_t n = zmq_msg_size(&q->kept[srv][0]);
    if (kvps__msg_from_buf(&f[0], zmq_msg_data(&q->kept[srv][0]), n) != 0) return -1;
    kvps__hdr h;
    memcpy(&h, zmq_msg_data(&f[0]), sizeof h);
    h.op = KVPS__OP_PULL;
    memcpy(zmq_msg_data(&f[0]), &h, sizeof h);
    return kvps__send_frames(w->socks[srv], f, 1);
}

/* Shard s's read replica went away: the READs waiting there go to the shard's server (a late
   answer from the replica is dropped as a second one). */
static void kvps__reads_reroute(kvps_worker *w, int s) {
    for (uint32_t i = 0; i < w->nslots; i++) {
        kvps__req *q = w->slots[i];
        if (q && q->read && q->state[s] == KVPS__RS_SENT && q->nkept[s] && kvps__read_send(w, q, s, 0) != 0)
            kvps__log(KVPS_LOG_WARN, "worker %d: re-send to server %d: %s", w->desc.rank, s, zmq_strerror(zmq_errno()));
    }
}

/* Round q of a push has its answer from server srv: the READs behind it that were refused and
   wait for that (rwait) go to srv as pulls once every round of the push has it. */
static void kvps__reads_release(kvps_worker *w, kvps__req *q, int srv) {
    for (kvps__req *c = q->next ? kvps__req_get(w, q->next) : NULL; c; c = c->next ? kvps__req_get(w, c->next) : NULL)
        if (c->read && c->rwait[srv] && c->state[srv] == KVPS__RS_SENT && kvps__read_pushed(w, c, srv) && kvps__read_send(w, c, srv, 1) != 0)
            kvps__log(KVPS_LOG_WARN, "worker %d: read from server %d: %s", w->desc.rank, srv, zmq_strerror(zmq_errno()));
}

/* The poll items: every server's socket, then every monitor. */
static void kvps__worker_items(kvps_worker *w) {
    for (int i = 0; i < w->n; i++) {
        w->items[i].socket = w->socks[i];
        w->items[i].fd = 0;
        w->items[i].events = ZMQ_POLLIN;
        w->items[w->n + i].socket = w->mons[i];
        w->items[w->n + i].fd = 0;
        w->items[w->n + i].events = ZMQ_POLLIN;
    }
    w->nitems = 2 * w->n;
    for (int i = 0; w->rsocks && i < w->n; i++) /* then each read socket and its monitor */
        if (w->rsocks[i]) {
            zmq_pollitem_t a = {w->rsocks[i], 0, ZMQ_POLLIN, 0}, b = {w->rmons[i], 0, ZMQ_POLLIN, 0};
            w->items[w->nitems++] = a;
            w->items[w->nitems++] = b;
        }
}

/* The worker's servers (desc->servers: shards, '|' between a shard's replicas), its first
   placement (v mod n over 256 n virtual shards) and its per-server arrays. KVPS_OK or the result
   (logged); the caller destroys w either way on failure. */
static kvps_result kvps__worker_servers(kvps_worker *w, const kvps_worker_desc *desc) {
    w->n = kvps__split(desc->servers, &w->endpoints);
    if (w->n < 1) {
        kvps__log(KVPS_LOG_ERROR, "worker: malformed server list '%s'", desc->servers);
        w->n = 0;
        return KVPS_ERR_CONFIG;
    }
    w->desc.servers = NULL;
    w->reps = (char ***)calloc((size_t)w->n, sizeof *w->reps);
    w->nrep = (int *)calloc((size_t)w->n, sizeof *w->nrep);
    w->cur = (int *)calloc((size_t)w->n, sizeof *w->cur);
    for (int i = 0; w->reps && w->nrep && w->cur && i < w->n; i++)
        if ((w->nrep[i] = kvps__split_by(w->endpoints[i], '|', &w->reps[i])) < 1) {
            kvps__log(KVPS_LOG_ERROR, "worker: malformed replica list '%s' of server %d", w->endpoints[i], i);
            w->nrep[i] = 0;
            return KVPS_ERR_CONFIG;
        }
    if (!w->reps || !w->nrep || !w->cur) return KVPS_ERR_NOMEM;
    w->desc.failover_ms = kvps__def(desc->failover_ms, 1000);
    zmq_msg_init(&w->ctl_reply);
    w->V = (uint32_t)w->n * 256;
    w->place.V = w->V;
    w->place.count = 1;
    w->place.n[0] = (uint32_t)w->n;
    w->vmap = (uint32_t *)malloc((size_t)w->V * sizeof *w->vmap);
    w->rstamp = (uint64_t *)calloc((size_t)w->n, sizeof *w->rstamp);
    w->inflight = (uint64_t *)calloc((size_t)w->n, sizeof *w->inflight);
    w->rp = (kvps__replay *)calloc((size_t)w->n, sizeof *w->rp);
    if (!w->vmap || !w->rstamp || !w->inflight || !w->rp) return KVPS_ERR_NOMEM;
    for (uint32_t v = 0; v < w->V; v++) w->vmap[v] = v % (uint32_t)w->n;
    w->socks = (void **)calloc((size_t)w->n, sizeof *w->socks);
    w->items = (zmq_pollitem_t *)calloc(4 * (size_t)w->n, sizeof *w->items); /* sockets, monitors, read sockets' */
    w->count = (uint32_t *)calloc((size_t)w->n + 1, sizeof *w->count);
    w->mons = (void **)calloc((size_t)w->n, sizeof *w->mons);
    w->down = (uint8_t *)calloc((size_t)w->n, 1);
    w->refused = (uint8_t *)calloc((size_t)w->n, 1);
    w->hs_cuts = (uint16_t *)calloc((size_t)w->n, sizeof *w->hs_cuts);
    w->hs_val = (int32_t *)calloc((size_t)w->n, sizeof *w->hs_val);
    w->down_since = (int64_t *)calloc((size_t)w->n, sizeof *w->down_since);
    w->up_once = (uint8_t *)calloc((size_t)w->n, 1);
    w->status_text = (char(*)[400])calloc((size_t)w->n, sizeof *w->status_text);
    w->status_got = (uint8_t *)calloc((size_t)w->n, 1);
    if (!w->socks || !w->items || !w->count || !w->mons || !w->down || !w->refused || !w->hs_cuts || !w->hs_val ||
        !w->down_since || !w->up_once || !w->status_text || !w->status_got)
        return KVPS_ERR_NOMEM;
    return KVPS_OK;
}

/* CURVE's keys from the desc, checked: the servers' (*skeys, one or one per server of n), this
   worker's pair (cpub, csec). KVPS_OK (no CURVE: *nskeys 0) or KVPS_ERR_CONFIG, logged. */
static kvps_result kvps__worker_curve_keys(const kvps_worker_desc *desc, int n, char ***skeys, int *nskeys, uint8_t cpub[32],
                                           uint8_t csec[32]) {
    if (desc->curve_server_keys || desc->curve_public_key || desc->curve_secret_key) {
        *nskeys = desc->curve_server_keys ? kvps__split(desc->curve_server_keys, skeys) : 0;
        uint8_t tmp[32];
        int bad = !zmq_has("curve") || kvps__z85_key(desc->curve_public_key, cpub) != 0 ||
                  kvps__z85_key(desc->curve_secret_key, csec) != 0 || (*nskeys != 1 && *nskeys != n);
        for (int i = 0; i < *nskeys && !bad; i++) bad = kvps__z85_key((*skeys)[i], tmp) != 0;
        if (bad) {
            kvps__log(KVPS_LOG_ERROR, "worker: CURVE needs curve_server_keys (one, or one per server), "
                                      "curve_public_key and curve_secret_key, 40 Z85 characters each");
            kvps__free_strv(*skeys, *nskeys);
            *skeys = NULL;
            *nskeys = 0;
            return KVPS_ERR_CONFIG;
        }
    }
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_create(const kvps_worker_desc *desc, kvps_worker **out) {
    if (!desc || !out) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    if (!kvps__io_cpus_ok(desc->zmq_ctx, desc->io_cpus, "worker")) return KVPS_ERR_CONFIG;
    if (!kvps__heartbeat_ok(desc->heartbeat_ms, desc->peer_timeout_ms, "worker")) return KVPS_ERR_CONFIG;
    if (!desc->servers || desc->rank < 0 || desc->num_workers < 0 || desc->timeout_ms < 0 ||
        desc->io_threads < 0 || (desc->num_workers && desc->rank >= desc->num_workers)) {
        kvps__log(KVPS_LOG_ERROR, "worker desc: need servers, 0 <= rank < num_workers");
        return KVPS_ERR_CONFIG;
    }
    if (desc->stall_ms < -1) {
        kvps__log(KVPS_LOG_ERROR, "worker desc: stall_ms %d: > 0, 0 (default 60000) or -1 (off)", desc->stall_ms);
        return KVPS_ERR_CONFIG;
    }
    kvps__tune_malloc(desc->no_malloc_tuning);
    kvps_worker *w = (kvps_worker *)calloc(1, sizeof *w);
    if (!w) return KVPS_ERR_NOMEM;
    w->desc = *desc;
    w->token = kvps__token_digest(desc->job_token);
    w->desc.job_token = NULL; /* (not kept: its digest is) */
    w->desc.timeout_ms = desc->timeout_ms; /* 0: waits on live servers have no deadline (kvps_worker_wait) */
    w->desc.stall_ms = kvps__def(desc->stall_ms, 60000);
    w->desc.min_slice = kvps__def(desc->min_slice, (size_t)1024);
    w->desc.max_slice = kvps__def(desc->max_slice, (size_t)1 << 18);
    w->desc.zerocopy_min = kvps__def(desc->zerocopy_min, (size_t)65536);
    w->desc.fusion_bytes = kvps__def(desc->fusion_bytes, (size_t)256 << 10);
    kvps_result r = kvps__worker_servers(w, desc);
    if (r != KVPS_OK) { kvps_worker_destroy(&w); return r; }
    w->incarnation = kvps__random32();
    char **skeys = NULL;
    int nskeys = 0;
    uint8_t cpub[32], csec[32];
    r = kvps__worker_curve_keys(desc, w->n, &skeys, &nskeys, cpub, csec);
    if (r != KVPS_OK) { kvps_worker_destroy(&w); return r; }
    w->desc.heartbeat_ms = kvps__def(desc->heartbeat_ms, KVPS_DEFAULT_HEARTBEAT_MS);
    w->desc.peer_timeout_ms = kvps__def(desc->peer_timeout_ms, KVPS_DEFAULT_PEER_TIMEOUT_MS);
    kvps_result crc = kvps__ctx_take(desc->zmq_ctx, desc->io_threads, &w->desc.io_cpus, &w->ctx, &w->own_ctx);
    if (crc != KVPS_OK) { kvps_worker_destroy(&w); return crc; }
    for (int i = 0; i < w->n && r == KVPS_OK; i++) {
        uint8_t sk[32];
        if (nskeys) kvps__z85_key(skeys[nskeys == 1 ? 0 : i], sk);
        r = kvps__worker_sock(w, i, nskeys ? sk : NULL, cpub, csec);
    }
    w->curve = w->desc.curve_server_keys != NULL;
    if (w->curve && r == KVPS_OK) { /* kept for the servers a reshard adds */
        if (!(w->curve_skeys = (uint8_t *)malloc((size_t)nskeys * 32))) r = KVPS_ERR_NOMEM;
        for (int i = 0; r == KVPS_OK && i < nskeys; i++) kvps__z85_key(skeys[i], w->curve_skeys + 32 * i);
        w->ncurve_skeys = nskeys;
        memcpy(w->curve_pub, cpub, 32);
        memcpy(w->curve_sec, csec, 32);
    }
    kvps__free_strv(skeys, nskeys);
    w->desc.read_local = desc->read_local ? desc->read_local : getenv("KVPS_READ_LOCAL") && atoi(getenv("KVPS_READ_LOCAL")) > 0;
    if (r == KVPS_OK && w->desc.read_local > 0) r = kvps__reads_open(w, 0);
    if (r == KVPS_OK) kvps__worker_items(w);
    w->desc.curve_server_keys = w->desc.curve_public_key = w->desc.curve_secret_key = NULL; /* (the strings are not kept) */
    memset(csec, 0, sizeof csec);
    if (r == KVPS_OK) r = kvps__hello_all(w);
    if (r == KVPS_OK) r = kvps__tl_open(&w->tl, desc->timeline, "worker", "worker", desc->rank, 1000 + desc->rank);
    if (r != KVPS_OK) { kvps_worker_destroy(&w); return r; }
    w->ready = 1;
    *out = w;
    return KVPS_OK;
}

static kvps_result kvps__finish(kvps_worker *w, int timeout_ms, int unreached);
KVPS_API void kvps_worker_destroy(kvps_worker **wp) {
    if (!wp || !*wp) return;
    kvps_worker *w = *wp;
    *wp = NULL;
    if (w->ready && !w->finished) kvps__finish(w, 1000, 0); /* a clean finish, unless the caller did it */
    kvps__tl_close(&w->tl);
    for (int i = 0; i < w->n; i++) {
        if (w->socks && w->socks[i]) zmq_close(w->socks[i]);
        if (w->mons && w->mons[i]) zmq_close(w->mons[i]);
        if (w->rsocks && w->rsocks[i]) zmq_close(w->rsocks[i]);
        if (w->rmons && w->rmons[i]) zmq_close(w->rmons[i]);
    }
    free(w->rj); free(w->rsocks); free(w->rmons); free(w->rup); free(w->rnever);
    /* Requests that ZeroMQ still references are freed by the last free callback. */
    for (uint32_t i = 0; i < w->nslots; i++)
        if (w->slots[i]) {
            for (int s = 0; s < w->n; s++) kvps__req_drop_kept(w->slots[i], s);
            kvps__req_unref(w->slots[i]);
        }
    if (w->own_ctx && w->ctx) zmq_ctx_term(w->ctx);
    for (size_t i = 0; i < sizeof w->curve_sec; i++) ((volatile uint8_t *)w->curve_sec)[i] = 0;
    free(w->curve_skeys);
    kvps__place_free(&w->place);
    for (int i = 0; i < w->ntensors; i++) {
        kvps__tensor_info *t = &w->tensors[i];
        free(t->name); free(t->keys); free(t->off); free(t->slen); free(t->server);
        for (uint32_t j = 0; t->resid && j < t->nslices; j++) free(t->resid[j]);
        free(t->resid);
        free(t->bad_text);
    }
    for (int i = 0; w->reps && i < w->n; i++) kvps__free_strv(w->reps[i], w->nrep[i]);
    for (int i = 0; w->rp && i < w->n; i++) kvps__replay_clear(&w->rp[i]);
    free(w->rp);
    free(w->reps); free(w->nrep); free(w->cur); free(w->vmap); free(w->rstamp); free(w->inflight); free(w->cq);
    zmq_msg_close(&w->ctl_reply);
    w->reps = NULL;
    kvps__free_strv(w->endpoints, w->n);
    free(w->tensors); free(w->socks); free(w->items); free(w->slots); free(w->mons); free(w->down); free(w->refused); free(w->hs_cuts); free(w->hs_val);
    free(w->down_since); free(w->up_once); free(w->status_text); free(w->status_got);
    free(w->free_slots); free(w->order); free(w->bucket); free(w->count); free(w->tables);
    free(w);
}

KVPS_API int kvps_worker_num_servers(const kvps_worker *w) { return w ? w->n : 0; }
KVPS_API const char *kvps_worker_last_error(const kvps_worker *w) { return w ? w->errmsg : ""; }

/* Every non-OK return of a worker call says why in last_error, naming the argument or thing at
   fault: this sets it (w may be NULL: then only the result) and returns rc. */
static kvps_result kvps__wfail(const kvps_worker *cw, kvps_result rc, const char *fmt, ...) {
    kvps_worker *w = (kvps_worker *)(uintptr_t)cw; /* last_error is not part of what const promises */
    if (!w) return rc;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->errmsg, sizeof w->errmsg, fmt, ap);
    va_end(ap);
    return rc;
}
/* The first NULL of a call's pointer arguments, named ("keys is NULL"). */
#define KVPS__NEED(w, call, p) do { if (!(p)) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: %s is NULL", call, #p); } while (0)
/* An optim the servers would refuse (o as given, resolved as kvps__optim_read left it): an
   unknown rule is KVPS_ERR_INVALID_ARG, a value out of range r; the message names the field. */
static kvps_result kvps__optim_fail(kvps_worker *w, const char *what, const char *name, const kvps_optim *o,
                                    const kvps_optim *resolved, kvps_result r) {
    char where[200];
    snprintf(where, sizeof where, what, name);
    if ((unsigned)o->rule >= KVPS_RULE_COUNT && !kvps__rule_is_user((uint32_t)o->rule))
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: rule %d is not a kvps_rule (nor KVPS_RULE_USER + i)", where, (int)o->rule);
    return kvps__wfail(w, r, "%s: %s out of range (lr %g momentum %g beta1 %g beta2 %g eps %g weight_decay %g)", where,
                       kvps__optim_bad_field(resolved), (double)o->lr, (double)o->momentum, (double)o->beta1,
                       (double)o->beta2, (double)o->eps, (double)o->weight_decay);
}
#define KVPS__TENSOR_OK(w, call, t)                                                                            \
    do {                                                                                                       \
        if ((t) < 0 || (t) >= (w)->ntensors)                                                                   \
            return kvps__wfail(w, KVPS_ERR_TENSOR, "%s: tensor %d is not registered (this worker has %d)", call, \
                               (int)(t), (w)->ntensors);                                                       \
    } while (0)

#define KVPS__SLOT_BITS 24
static kvps__req *kvps__req_get(kvps_worker *w, kvps_req h) {
    uint32_t slot = (uint32_t)(h & ((1u << KVPS__SLOT_BITS) - 1));
    if (slot == 0 || slot > w->nslots) return NULL;
    kvps__req *q = w->slots[slot - 1];
    if (!q || q->id != h) return NULL;
    return q;
}

static kvps__req *kvps__req_new(kvps_worker *w, uint64_t ndest) {
    if (w->nfree == 0) {
        uint32_t nc = w->nslots ? w->nslots * 2 : 64;
        if (nc >= (1u << KVPS__SLOT_BITS)) return NULL;
        kvps__req **ns = (kvps__req **)realloc(w->slots, nc * sizeof *ns);
        if (!ns) return NULL;
        w->slots = ns;
        uint32_t *nf = (uint32_t *)realloc(w->free_slots, nc * sizeof *nf);
        if (!nf) return NULL;
        w->free_slots = nf;
        for (uint32_t i = w->nslots; i < nc; i++) {
            ns[i] = NULL;
            nf[w->nfree++] = nc - 1 - (i - w->nslots);
        }
        w->nslots = nc;
    }
    kvps__req *q = (kvps__req *)calloc(1, sizeof *q);
    if (!q) return NULL;
    q->dbegin = (uint32_t *)calloc((size_t)w->n + 1, sizeof *q->dbegin);
    q->state = (uint8_t *)calloc((size_t)w->n, 1);
    q->kept = (zmq_msg_t(*)[2])malloc((size_t)w->n * sizeof *q->kept);
    q->nkept = (uint8_t *)calloc((size_t)w->n, 1);
    if (ndest) q->dest = (kvps__dest *)malloc(ndest * sizeof *q->dest);
    if (w->desc.credit_bytes) {
        q->sbytes = (uint64_t *)calloc((size_t)w->n, sizeof *q->sbytes);
        q->queued = (uint8_t *)calloc((size_t)w->n, 1);
    }
    if (!q->dbegin || !q->state || !q->kept || !q->nkept || (ndest && !q->dest) || (w->desc.credit_bytes && (!q->sbytes || !q->queued))) {
        free(q->dbegin); free(q->dest); free(q->state); free(q->kept); free(q->nkept); free(q->sbytes); free(q->queued); free(q);
        return NULL;
    }
    uint32_t slot = w->free_slots[--w->nfree];
    q->id = (++w->seq << KVPS__SLOT_BITS) | (slot + 1);
    q->refs = 1;
    w->slots[slot] = q;
    if (w->tl) q->tl_t0 = kvps__tl_now();
    return q;
}

static void kvps__credit_back(kvps_worker *w, kvps__req *q, int srv);
static void kvps__req_end(kvps_worker *w, kvps__req *q) {
    uint32_t slot = (uint32_t)(q->id & ((1u << KVPS__SLOT_BITS) - 1)) - 1;
    for (int s = 0; s < w->n; s++) kvps__req_drop_kept(q, s);
    w->slots[slot] = NULL; /* (gone before any credit it frees lets another message go) */
    for (int s = 0; q->sbytes && s < w->n; s++) kvps__credit_back(w, q, s);
    w->free_slots[w->nfree++] = slot;
    kvps__req_unref(q);
}

/* The header of a worker's request: op, nkeys and the request's id, from this worker's rank. */
static kvps__hdr kvps__req_hdr(const kvps_worker *w, const kvps__req *q, int op, uint32_t nkeys) {
    kvps__hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVPS__MAGIC;
    h.version = KVPS__VERSION;
    h.op = (uint8_t)op;
    h.rank = (uint32_t)w->desc.rank;
    h.nkeys = nkeys;
    h.req_id = q->id;
    return h;
}

/* Sends request q's message f[0..nf) to server srv, keeping a reference to its frames (no copy
   of the bytes) to re-send after a reconnect; the part is then owed a reply. */

/* ---- FUSION: credit (credit_bytes) ----
   With credit_bytes set, at most that many bytes of requests are in flight to one server (one
   message always is); the others wait in the worker's queue and go, highest priority first
   (first come among equals), as replies come back. A message that jumps the queue (an early
   layer's pull) then overtakes the bulk queued before it, as BytePS schedules by layer. */
typedef struct kvps__qent { uint64_t id, seq, bytes; int srv, prio; } kvps__qent;

static uint64_t kvps__frames_bytes(zmq_msg_t *f, int nf) {
    uint64_t b = 0;
    for (int j = 0; j < nf; j++) b += zmq_msg_size(&f[j]);
    return b;
}

/* Queues q's message to srv when it does not fit the credit left (its frames f are then closed;
   the kept copies go later): 1 when queued. */
static int kvps__credit_wait(kvps_worker *w, kvps__req *q, int srv, zmq_msg_t *f, int nf) {
    uint64_t bytes = kvps__frames_bytes(f, nf);
    if (!w->desc.credit_bytes || !w->inflight[srv] || w->inflight[srv] + bytes <= w->desc.credit_bytes) return 0;
    if (w->ncq == w->cap_cq) {
        size_t nc = w->cap_cq ? 2 * w->cap_cq : 64;
        kvps__qent *ne = (kvps__qent *)realloc(w->cq, nc * sizeof *ne);
        if (!ne) return 0; /* out of memory: it goes now */
        w->cq = ne;
        w->cap_cq = nc;
    }
    kvps__qent e = {q->id, ++w->cq_seq, bytes, srv, q->prio};
    w->cq[w->ncq++] = e;
    q->queued[srv] = 1;
    for (int j = 0; j < nf; j++) zmq_msg_close(&f[j]);
    return 1;
}

static int kvps__send_kept(kvps_worker *w, kvps__req *q, int srv);
/* Sends what waits for srv while the credit lasts, highest priority first. */
static void kvps__credit_drain(kvps_worker *w, int srv) {
    for (;;) {
        size_t best = w->ncq;
        for (size_t i = 0; i < w->ncq; i++)
            if (w->cq[i].srv == srv && (best == w->ncq || w->cq[i].prio > w->cq[best].prio ||
                                        (w->cq[i].prio == w->cq[best].prio && w->cq[i].seq < w->cq[best].seq)))
                best = i;
        if (best == w->ncq) return;
        kvps__qent e = w->cq[best];
        if (w->inflight[srv] && w->inflight[srv] + e.bytes > w->desc.credit_bytes) return;
        w->cq[best] = w->cq[--w->ncq];
        kvps__req *q = kvps__req_get(w, e.id);
        if (!q || !q->queued || !q->queued[srv] || !q->nkept[srv]) continue; /* ended, or answered meanwhile */
        q->queued[srv] = 0;
        if (kvps__send_kept(w, q, srv) != 0) continue; /* (re-sent when the connection comes back) */
        q->sbytes[srv] = e.bytes;
        w->inflight[srv] += e.bytes;
    }
}

/* q's message to srv is answered (or q ended): its credit comes back. */
static void kvps__credit_back(kvps_worker *w, kvps__req *q, int srv) {
    if (!q->sbytes || !q->sbytes[srv]) return;
    w->inflight[srv] -= q->sbytes[srv];
    q->sbytes[srv] = 0;
    kvps__credit_drain(w, srv);
}

static kvps_result kvps__keep_send(kvps_worker *w, kvps__req *q, int srv, int op, zmq_msg_t *f, int nf) {
    kvps__req_drop_kept(q, srv);
    for (int j = 0; j < nf; j++) {
        zmq_msg_init(&q->kept[srv][j]);
        zmq_msg_copy(&q->kept[srv][j], &f[j]);
    }
    q->nkept[srv] = (uint8_t)nf;
    if (op == KVPS__OP_READ) { /* to the read replica, or to the shard's server (kvps__read_send) */
        q->read = 1;
        q->push = w->read_push;
        for (int j = 0; j < nf; j++) zmq_msg_close(&f[j]);
        if (!q->rwait && !(q->rwait = (uint8_t *)calloc((size_t)w->n, 1))) {
            kvps__req_drop_kept(q, srv);
            return kvps__wfail(w, KVPS_ERR_NOMEM, "read from server %d: out of memory", srv);
        }
        if (kvps__read_send(w, q, srv, 0) != 0) {
            kvps__req_drop_kept(q, srv);
            return kvps__wfail(w, KVPS_ERR_ZMQ, "read from server %d (%s): send failed: %s", srv, kvps__ep(w, srv),
                               zmq_strerror(zmq_errno()));
        }
        q->pending++;
        q->sent++;
        q->state[srv] = KVPS__RS_SENT;
        return KVPS_OK;
    }
    if (q->sbytes && !q->ctl && kvps__credit_wait(w, q, srv, f, nf)) { /* waits for credit, in the queue */
        q->pending++;
        q->sent++;
        q->state[srv] = KVPS__RS_SENT;
        return KVPS_OK;
    }
    if (kvps__send_frames(w->socks[srv], f, nf) != 0) {
        kvps__req_drop_kept(q, srv);
        kvps__log(KVPS_LOG_ERROR, "worker %d: send to server %d: %s", w->desc.rank, srv, zmq_strerror(zmq_errno()));
        return kvps__wfail(w, KVPS_ERR_ZMQ, "%s to server %d (%s): send failed: %s", kvps__ops[op].name, srv, kvps__ep(w, srv),
                           zmq_strerror(zmq_errno()));
    }
    if (q->sbytes && !q->ctl) {
        q->sbytes[srv] = kvps__frames_bytes(&q->kept[srv][0], nf);
        w->inflight[srv] += q->sbytes[srv];
    }
    q->pending++;
    q->sent++;
    q->state[srv] = KVPS__RS_SENT;
    return KVPS_OK;
}

/* What one keyed message to one server carries: keys ents[0..nk) and their values, zero-copy
   (one contiguous run, nruns 1) or gathered from one pointer per key (nruns = nk); push: encode
   the (single) key's values with it, keeping error feedback in resid; pull: the codec to ask the
   answer in; wire: += the payload bytes sent. The last four NULL: plain floats. */
typedef struct kvps__msg_spec {
    const kvps__kent *ents;
    uint32_t nk;
    const float *const *vptr;
    uint32_t nruns;
    const kvps_codec *push;
    float *resid;
    const kvps_codec *pull;
    uint64_t *wire;
} kvps__msg_spec;

/* One keyed message m of op to server srv, part of request q. */
static kvps_result kvps__send_req(kvps_worker *w, kvps__req *q, int srv, int op, const kvps__msg_spec *m) {
    const kvps__kent *ents = m->ents;
    const float *const *vptr = m->vptr;
    const kvps_codec *pc = m->push, *pull = m->pull;
    uint32_t nk = m->nk, nruns = m->nruns;
    kvps__hdr h = kvps__req_hdr(w, q, op, nk);
    h.status = (int32_t)w->incarnation; /* requests carry the sender's incarnation here */
    if (pc && kvps__op_has_values(op)) h.flags |= KVPS__FLAG_CODED;
    else pc = NULL;
    if (pull && kvps__op_pulls(op)) { h.flags |= KVPS__FLAG_CODED_REPLY; h.aux = (uint32_t)pull->id; }
    zmq_msg_t f[2];
    int nf = 1;
    if (zmq_msg_init_size(&f[0], KVPS__HDR + (size_t)nk * KVPS__KENT) != 0)
        return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory for %u keys", kvps__ops[op].name, srv, nk);
    memcpy(zmq_msg_data(&f[0]), &h, sizeof h);
    if (nk) memcpy((char *)zmq_msg_data(&f[0]) + KVPS__HDR, ents, (size_t)nk * KVPS__KENT);
    uint64_t after = w->read_push >> KVPS__SLOT_BITS; /* a READ: the push's sequence */
    if (op == KVPS__OP_READ && kvps__msg_from_buf(&f[nf++], &after, 8) != 0) {
        zmq_msg_close(&f[0]);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "read from server %d: out of memory", srv);
    }
    if (kvps__op_has_values(op)) {
        uint64_t total = 0;
        for (uint32_t i = 0; i < nk; i++) total += ents[i].len;
        size_t bytes = (size_t)total * sizeof(float);
        nf = 2;
        if (pc) { /* [u32 bytes][blob], encoded straight into the frame */
            size_t cap = kvps_codec_max_bytes(pc, (size_t)total), nb = 0;
            if (zmq_msg_init_size(&f[1], 4 + cap) != 0) {
                zmq_msg_close(&f[0]);
                return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory for %zu coded bytes", kvps__ops[op].name, srv, cap);
            }
            unsigned char *d = (unsigned char *)zmq_msg_data(&f[1]);
            kvps_result er = kvps_codec_encode(pc, vptr[0], (size_t)total, m->resid, d + 4, cap, &nb);
            kvps__put32(d, (uint32_t)nb);
            if (er == KVPS_OK && nb < cap) { /* a user codec that used less than its bound */
                zmq_msg_t exact;
                if (kvps__msg_from_buf(&exact, d, 4 + nb) != 0) er = KVPS_ERR_NOMEM;
                else { zmq_msg_close(&f[1]); f[1] = exact; }
            }
            if (er != KVPS_OK) {
                zmq_msg_close(&f[0]);
                zmq_msg_close(&f[1]);
                return kvps__wfail(w, er, "%s to server %d: codec '%s' could not encode: %s", kvps__ops[op].name, srv,
                                   pc->name ? pc->name : "?", kvps_result_str(er));
            }
            if (m->wire) *m->wire += 4 + nb;
        } else if (nruns == 1 && bytes >= w->desc.zerocopy_min) {
            __atomic_add_fetch(&q->refs, 1, __ATOMIC_ACQ_REL);
            if (zmq_msg_init_data(&f[1], (void *)(uintptr_t)vptr[0], bytes, kvps__zc_free, q) != 0) {
                __atomic_sub_fetch(&q->refs, 1, __ATOMIC_ACQ_REL);
                zmq_msg_close(&f[0]);
                return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory", kvps__ops[op].name, srv);
            }
            q->zc = 1;
        } else {
            if (zmq_msg_init_size(&f[1], bytes) != 0) {
                zmq_msg_close(&f[0]);
                return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory for %zu bytes", kvps__ops[op].name, srv, bytes);
            }
            char *dst = (char *)zmq_msg_data(&f[1]);
            if (nruns == 1) {
                memcpy(dst, vptr[0], bytes);
            } else if (nk) {
                for (uint32_t i = 0; i < nk; i++) {
                    memcpy(dst, vptr[i], (size_t)ents[i].len * sizeof(float));
                    dst += ents[i].len * sizeof(float);
                }
            }
        }
    }
    return kvps__keep_send(w, q, srv, op, f, nf);
}

static void kvps__watch(kvps_worker *w);
static kvps_result kvps__progress(kvps_worker *w, long wait_ms);

/* A request of the worker's own to server srv: a header (nkeys 0) and, when bytes > 0, one
   values frame; kept, like every request, to be re-sent after a reconnect. */
static kvps_result kvps__send_ctl(kvps_worker *w, kvps__req *q, int srv, int op, const void *payload, size_t bytes) {
    kvps__hdr h = kvps__req_hdr(w, q, op, 0);
    h.status = (int32_t)w->incarnation;
    zmq_msg_t f[2];
    int nf = bytes ? 2 : 1;
    if (kvps__msg_from_buf(&f[0], &h, sizeof h) != 0) return kvps__wfail(w, KVPS_ERR_NOMEM, "%s: out of memory", kvps__ops[op].name);
    if (nf == 2 && kvps__msg_from_buf(&f[1], payload, bytes) != 0) {
        zmq_msg_close(&f[0]);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "%s: out of memory", kvps__ops[op].name);
    }
    return kvps__keep_send(w, q, srv, op, f, nf);
}

/* The hello to servers from..to-1 (queued until each connection is made): what must agree; again:
   sent after a reconnect, with the last checkpoint stamp heard from each (FAULTS, checkpoints). */
static kvps_result kvps__hello_to(kvps_worker *w, int from, int to, int again) {
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "create: out of memory");
    q->ctl = KVPS__OP_HELLO;
    uint64_t hash = KVPS__FNV_BASIS; /* FNV-1a over the list, a comma after each entry */
    for (int i = 0; i < w->n; i++) hash = kvps__fnv(kvps__fnv(hash, w->endpoints[i], strlen(w->endpoints[i])), ",", 1);
    unsigned char v[KVPS__HELLO_BYTES] = {0};
    uint64_t mins = w->desc.min_slice, maxs = w->desc.max_slice;
    kvps__put32(v, KVPS__PROTO);
    kvps__put32(v + 4, (uint32_t)w->desc.num_workers);
    kvps__put32(v + 8, (uint32_t)w->n);
    memcpy(v + 16, &hash, 8);
    memcpy(v + 24, &mins, 8);
    memcpy(v + 32, &maxs, 8);
    memcpy(v + 48, &w->token, 8);
    kvps__put32(v + 56, (uint32_t)again);
    for (int i = from; i < to; i++) {
        kvps__put32(v + 12, (uint32_t)i);
        uint64_t ph = kvps__place_hash(&w->place);
        memcpy(v + 40, &ph, 8);
        kvps__put32(v + 60, w->rp[i].heard);
        kvps_result r = kvps__send_ctl(w, q, i, KVPS__OP_HELLO, v, sizeof v);
        if (r != KVPS_OK) return r;
    }
    return KVPS_OK;
}
static kvps_result kvps__hello_from(kvps_worker *w, int from) { return kvps__hello_to(w, from, w->n, 0); }
static kvps_result kvps__hello_all(kvps_worker *w) { return kvps__hello_from(w, 0); }

/* Goodbye (BYE) to servers from..n-1, waiting up to timeout_ms for their acknowledgements;
   servers down or refusing are not waited for, nor, unless unreached, those never reached (a
   server that starts late must still hear every worker's goodbye, or it waits for it forever:
   kvps_worker_finish waits for it, up to its timeout). Returns the request, the caller's to end
   (NULL: out of memory); *r: how sending went. */
static kvps__req *kvps__bye(kvps_worker *w, int from, int timeout_ms, int unreached, kvps_result *r) {
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return NULL;
    q->ctl = KVPS__OP_BYE;
    for (int i = from; i < w->n && *r == KVPS_OK; i++)
        if ((w->up_once[i] || unreached) && !w->down[i] && !w->refused[i]) *r = kvps__send_ctl(w, q, i, KVPS__OP_BYE, NULL, 0);
    int64_t deadline = kvps__now_ms() + timeout_ms;
    for (int64_t now = kvps__now_ms(); *r == KVPS_OK && q->pending > 0 && now < deadline; now = kvps__now_ms())
        kvps__progress(w, (long)(deadline - now)); /* (a refused hello is no reason to stop here) */
    return q;
}

/* unreached: wait for servers never connected too (an explicit finish); destroy's does not. */
static kvps_result kvps__finish(kvps_worker *w, int timeout_ms, int unreached) {
    if (w->finished) return KVPS_OK;
    w->finished = 1;
    kvps__watch(w);
    kvps_result r = KVPS_OK;
    timeout_ms = timeout_ms >= 0 ? timeout_ms : kvps__def(w->desc.timeout_ms, KVPS__SHORT_MS);
    kvps__req *q = kvps__bye(w, 0, timeout_ms, unreached, &r);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "finish: out of memory");
    if (r == KVPS_OK && q->pending > 0) {
        int s = 0;
        while (q->state[s] != KVPS__RS_SENT) s++;
        r = kvps__wfail(w, KVPS_ERR_TIMEOUT, "finish: server %d (%s) did not acknowledge within %d ms (%d of %d missing)%s",
                        s, kvps__ep(w, s), timeout_ms, q->pending, q->sent,
                        w->up_once[s] ? "" : ": it never connected, so it will wait for this worker until it is stopped");
    }
    kvps__req_end(w, q);
    return r;
}
KVPS_API kvps_result kvps_worker_finish(kvps_worker *w, int timeout_ms) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    return kvps__finish(w, timeout_ms, 1);
}

static void kvps__name_all(kvps_worker *w, kvps_tensor ti);
static kvps_result kvps__hello_from(kvps_worker *w, int from);
static void kvps__tensor_place(kvps_worker *w, kvps__tensor_info *t);

/* ---- RESHARD: the worker's side (kvps_worker_reshard) ----
   Placement goes through V virtual shards (vmap, kvps__place). Worker 0 plans each change by
   the bytes the shards hold (kvps__vmap_plan), moves the keys and table rows of the shards
   that change server, and records the change's moves in the placement; the other workers read
   the placement back from server 0. */
/* A request of the worker's own to server srv, waited for: KEYS, EXPORT, IMPORT, DROP. */
static kvps_result kvps__ctl_call(kvps_worker *w, int srv, int op, const void *p, size_t nb, int timeout_ms) {
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory");
    q->ctl = (uint8_t)op;
    kvps_result r = kvps__send_ctl(w, q, srv, op, p, nb);
    if (r != KVPS_OK) {
        if (!q->pending) kvps__req_end(w, q);
        return r;
    }
    return kvps_worker_wait(w, q->id, timeout_ms);
}

/* The virtual shard of a key a server holds: a raw key's, or its tensor slice's (NULL when the
   key is a slice of a tensor this worker has not registered). */
static int kvps__vshard_of(const kvps_worker *w, uint64_t key, uint32_t *v) {
    if (!(key >> 63)) { *v = (uint32_t)(kvps__mix64(key) % w->V); return 1; }
    for (int i = 0; i < w->ntensors; i++)
        if ((w->tensors[i].keys[0] & ~0xffffull) == (key & ~0xffffull)) {
            *v = (uint32_t)((w->tensors[i].hv + (key & 0xffff)) % w->V);
            return 1;
        }
    return 0;
}

/* A key a server holds and its virtual shard (what rank 0's reshard learns from op KEYS). */
typedef struct kvps__heldkey { uint64_t key; uint32_t v; } kvps__heldkey;

/* Moves, from server s, every key of held (its nk keys) whose server under vmap2 is another:
   records out (EXPORT), in at their new servers (IMPORT), then forgotten at s (DROP). */
static kvps_result kvps__move_from(kvps_worker *w, int s, const kvps__heldkey *held, size_t nk, const uint32_t *vmap2, int n2,
                                   int timeout_ms) {
    kvps_result r = KVPS_OK;
    uint64_t *mv = (uint64_t *)malloc(nk * sizeof *mv + 1);
    if (!mv) return kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory for %zu keys", nk);
    for (int to = 0; to < n2 && r == KVPS_OK; to++) {
        if (to == s) continue;
        size_t nm = 0;
        for (size_t i = 0; i < nk; i++)
            if ((int)vmap2[held[i].v] == to) mv[nm++] = held[i].key;
        if (nm == 0) continue;
        r = kvps__ctl_call(w, s, KVPS__OP_EXPORT, mv, nm * 8, timeout_ms);
        if (r == KVPS_OK) {
            zmq_msg_t rec;
            zmq_msg_init(&rec);
            zmq_msg_move(&rec, &w->ctl_reply);
            r = kvps__ctl_call(w, to, KVPS__OP_IMPORT, zmq_msg_data(&rec), zmq_msg_size(&rec), timeout_ms);
            zmq_msg_close(&rec);
        }
        if (r == KVPS_OK) r = kvps__ctl_call(w, s, KVPS__OP_DROP, mv, nm * 8, timeout_ms);
        if (r == KVPS_OK)
            kvps__log(KVPS_LOG_INFO, "worker %d: reshard: %zu keys moved from server %d to server %d", w->desc.rank, nm, s, to);
    }
    free(mv);
    return r;
}

/* Moves, from server s, the sparse tables' rows of every virtual shard whose server under vmap2
   is another: their records out (EXPORT_ROWS), in at the new server (IMPORT_ROWS; every table's
   record goes, with no rows if none move, so a new server learns the tables), then forgotten at
   s (DROP_ROWS). A server without tables answers with nothing, and nothing more is sent. */
static kvps_result kvps__move_rows_from(kvps_worker *w, int s, const uint32_t *vmap2, int n2, int timeout_ms) {
    uint32_t *sel = (uint32_t *)malloc(((size_t)w->V + 1) * sizeof *sel);
    if (!sel) return kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory for %u shards", w->V);
    kvps_result r = KVPS_OK;
    sel[0] = w->V;
    for (int to = 0; to < n2 && r == KVPS_OK; to++) {
        if (to == s) continue;
        uint32_t n = 0;
        for (uint32_t v = 0; v < w->V; v++)
            if (w->vmap[v] == (uint32_t)s && vmap2[v] == (uint32_t)to) sel[1 + n++] = v;
        if (n == 0) continue;
        r = kvps__ctl_call(w, s, KVPS__OP_EXPORT_ROWS, sel, ((size_t)n + 1) * 4, timeout_ms);
        if (r != KVPS_OK || zmq_msg_size(&w->ctl_reply) == 0) continue; /* (no tables there) */
        zmq_msg_t rec;
        zmq_msg_init(&rec);
        zmq_msg_move(&rec, &w->ctl_reply);
        r = kvps__ctl_call(w, to, KVPS__OP_IMPORT_ROWS, zmq_msg_data(&rec), zmq_msg_size(&rec), timeout_ms);
        zmq_msg_close(&rec);
        if (r == KVPS_OK) r = kvps__ctl_call(w, s, KVPS__OP_DROP_ROWS, sel, ((size_t)n + 1) * 4, timeout_ms);
        if (r == KVPS_OK)
            kvps__log(KVPS_LOG_INFO, "worker %d: reshard: the table rows of %u virtual shards moved from server %d to "
                      "server %d", w->desc.rank, n, s, to);
    }
    free(sel);
    return r;
}

/* Every per-server array to n2 entries (new ones zeroed); 0, or -1 out of memory. */
/* Request q, made for w->n servers, for n2 > w->n of them (a grow while it is in flight). */
static int kvps__req_resize(kvps_worker *w, kvps__req *q, int n2) {
    size_t n = (size_t)w->n, m = (size_t)n2;
    uint32_t *db = (uint32_t *)realloc(q->dbegin, (m + 1) * sizeof *db);
    if (db) { q->dbegin = db; memset(db + n + 1, 0, (m - n) * sizeof *db); }
    uint8_t *st = (uint8_t *)realloc(q->state, m);
    if (st) { q->state = st; memset(st + n, 0, m - n); }
    uint8_t *nk = (uint8_t *)realloc(q->nkept, m);
    if (nk) { q->nkept = nk; memset(nk + n, 0, m - n); }
    zmq_msg_t(*kp)[2] = (zmq_msg_t(*)[2])malloc(m * sizeof *kp);
    if (kp && nk) { /* (messages move, never copied as bytes) */
        for (size_t s = 0; s < n; s++)
            for (int j = 0; j < q->nkept[s]; j++) {
                zmq_msg_init(&kp[s][j]);
                zmq_msg_move(&kp[s][j], &q->kept[s][j]);
                zmq_msg_close(&q->kept[s][j]);
            }
        free(q->kept);
        q->kept = kp;
    } else {
        free(kp);
        kp = NULL;
    }
    int ok = db && st && nk && kp;
    if (ok && q->sbytes) {
        uint64_t *sb = (uint64_t *)realloc(q->sbytes, m * sizeof *sb);
        uint8_t *qu = sb ? (uint8_t *)realloc(q->queued, m) : NULL;
        if (sb) { q->sbytes = sb; memset(sb + n, 0, (m - n) * sizeof *sb); }
        if (qu) { q->queued = qu; memset(qu + n, 0, m - n); }
        ok = sb && qu;
    }
    return ok ? 0 : -1;
}
static int kvps__worker_resize(kvps_worker *w, int n2) {
#define KVPS__GROW(field, count)                                                                              \
    do {                                                                                                       \
        void *np_ = realloc(w->field, (size_t)(count) * sizeof *w->field);                                    \
        if (!np_) return -1;                                                                                   \
        memcpy(&w->field, &np_, sizeof np_); /* (C and C++ alike: no cast to name the type) */                \
        if ((size_t)(count) > (size_t)w->n)                                                                    \
            memset(w->field + w->n, 0, ((size_t)(count) - (size_t)w->n) * sizeof *w->field);                   \
    } while (0)
    KVPS__GROW(socks, n2); KVPS__GROW(mons, n2); KVPS__GROW(down, n2); KVPS__GROW(refused, n2); KVPS__GROW(hs_cuts, n2);
    KVPS__GROW(hs_val, n2); KVPS__GROW(down_since, n2); KVPS__GROW(up_once, n2); KVPS__GROW(status_text, n2);
    KVPS__GROW(status_got, n2); KVPS__GROW(endpoints, n2); KVPS__GROW(reps, n2); KVPS__GROW(nrep, n2); KVPS__GROW(cur, n2);
    KVPS__GROW(rstamp, n2); KVPS__GROW(inflight, n2); KVPS__GROW(rp, n2);
    if (w->rj) { KVPS__GROW(rj, n2); KVPS__GROW(rsocks, n2); KVPS__GROW(rmons, n2); KVPS__GROW(rup, n2); KVPS__GROW(rnever, n2); }
#undef KVPS__GROW
    for (int i = w->n; w->rj && i < n2; i++) w->rj[i] = -1;
    uint32_t *nc = (uint32_t *)realloc(w->count, ((size_t)n2 + 1) * sizeof *nc);
    zmq_pollitem_t *ni = (zmq_pollitem_t *)realloc(w->items, 4 * (size_t)n2 * sizeof *ni);
    if (nc) w->count = nc;
    if (ni) w->items = ni;
    for (uint32_t i = 0; nc && ni && i < w->nslots; i++) /* requests in flight (hellos, tensor names) */
        if (w->slots[i] && kvps__req_resize(w, w->slots[i], n2) != 0) return -1;
    return nc && ni ? 0 : -1;
}

/* The worker can no longer go on: every later call fails with this. */
static void kvps__wfatal(kvps_worker *w, kvps_result rc, const char *fmt, ...) {
    if (w->fatal) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fatal_text, sizeof w->fatal_text, fmt, ap);
    va_end(ap);
    w->fatal = rc;
    kvps__log(KVPS_LOG_ERROR, "worker %d: %s", w->desc.rank, w->fatal_text);
}

/* A hello's answer named server srv's placement (its checkpoint's, or a reshard's). A worker
   that has not resharded and has sent no keyed request takes it (then says hello again, naming
   it); one that has must already have the same. */
static void kvps__place_heard(kvps_worker *w, int srv, const zmq_msg_t *m) {
    kvps__place p;
    char a[200], b[200];
    const char *why = kvps__place_dec(&p, (const unsigned char *)zmq_msg_data((zmq_msg_t *)m), zmq_msg_size((zmq_msg_t *)m));
    if (why) {
        kvps__wfatal(w, KVPS_ERR_MALFORMED, "server %d (%s) answered hello with a placement that is not one: %s", srv,
                     kvps__ep(w, srv), why);
        return;
    }
    if (p.n[p.count - 1] != (uint32_t)w->n) {
        kvps__wfatal(w, KVPS_ERR_CONFIG, "server %d (%s) placed its keys by %s, but this worker lists %d servers", srv,
                     kvps__ep(w, srv), kvps__place_text(&p, a, sizeof a), w->n);
        kvps__place_free(&p);
        return;
    }
    uint64_t hp = kvps__place_hash(&p), hw = kvps__place_hash(&w->place);
    if (hp == hw) { kvps__place_free(&p); return; }
    if (hw || w->place_fixed) {
        kvps__wfatal(w, KVPS_ERR_MISMATCH, "server %d (%s) placed its keys by %s, this worker by %s%s: every server must "
                     "have seen the same reshards (were they restored from checkpoints of different times?)", srv,
                     kvps__ep(w, srv), kvps__place_text(&p, a, sizeof a), kvps__place_text(&w->place, b, sizeof b),
                     hw ? "" : " (it had sent keyed requests before)");
        kvps__place_free(&p);
        return;
    }
    uint32_t *vm = kvps__vmap_of(&p, &why);
    if (!vm) {
        kvps__wfatal(w, strcmp(why, "out of memory") ? KVPS_ERR_MALFORMED : KVPS_ERR_NOMEM, "server %d (%s) answered hello "
                     "with the placement %s of %u virtual shards: %s", srv, kvps__ep(w, srv), kvps__place_text(&p, a, sizeof a),
                     p.V, why);
        kvps__place_free(&p);
        return;
    }
    free(w->vmap);
    w->vmap = vm;
    w->V = p.V;
    kvps__place_free(&w->place);
    w->place = p;
    for (int t = 0; t < w->ntensors; t++) {
        w->tensors[t].hv = (uint32_t)(kvps__fnv1a(w->tensors[t].name) % w->V);
        kvps__tensor_place(w, &w->tensors[t]);
    }
    kvps__log(KVPS_LOG_INFO, "worker %d: keys placed as server %d's records say: %s", w->desc.rank, srv,
              kvps__place_text(&p, a, sizeof a));
    kvps_result r = kvps__hello_all(w);
    if (r != KVPS_OK) kvps__wfatal(w, r, "saying hello again after taking the servers' placement: %s", w->errmsg);
}

static void kvps__hs_text(const kvps_worker *w, int s, char *buf, size_t n);
/* Before the first keyed request: the first hello's answer, which may carry the placement the
   servers' checkpoints record (waited for up to timeout_ms; then the list's placement is used,
   and a server that answers later with another is an error, not a misplaced key). */
static kvps_result kvps__place_ready(kvps_worker *w) {
    if (w->place_fixed) return KVPS_OK;
    int64_t deadline = kvps__now_ms() + kvps__def(w->desc.timeout_ms, KVPS__SHORT_MS);
    for (int64_t now = kvps__now_ms(); !w->hellos_heard && !w->fatal && now < deadline; now = kvps__now_ms()) {
        kvps_result r = kvps__progress(w, (long)(deadline - now < 100 ? deadline - now : 100));
        if (r != KVPS_OK && !w->fatal) return r;
        kvps__watch(w);
        for (int s = 0; s < w->n; s++)
            if (w->refused[s]) { /* a server refuses our handshakes: no hello gets through, say why now */
                kvps__hs_text(w, s, w->errmsg, sizeof w->errmsg);
                return KVPS_ERR_AUTH;
            }
    }
    w->place_fixed = 1;
    if (w->fatal) return kvps__wfail(w, w->fatal, "%s", w->fatal_text);
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_reshard(kvps_worker *w, const char *servers, int timeout_ms) {
    return kvps_worker_reshard_keys(w, servers, NULL, timeout_ms);
}

/* Rank 0: every old server's keys and their virtual shards (op KEYS) into held[s] / nheld[s]
   (the caller frees them), the bytes each shard holds, the new map planned by them
   (kvps__vmap_plan) into vmap2, and the placement after the change into *p2. */
static kvps_result kvps__reshard_plan(kvps_worker *w, int n, int n2, uint32_t *vmap2, kvps__place *p2, kvps__heldkey **held,
                                      size_t *nheld, int timeout_ms) {
    uint64_t *bytes = (uint64_t *)calloc((size_t)w->V + 1, sizeof *bytes);
    if (!bytes || kvps__place_copy(p2, &w->place) != 0) {
        free(bytes);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory for %u virtual shards", w->V);
    }
    kvps_result r = KVPS_OK;
    for (int s = 0; s < n && r == KVPS_OK; s++) {
        r = kvps__ctl_call(w, s, KVPS__OP_KEYS, NULL, 0, timeout_ms);
        size_t nk = r == KVPS_OK ? zmq_msg_size(&w->ctl_reply) / sizeof(kvps__kent) : 0;
        const unsigned char *e = (const unsigned char *)zmq_msg_data(&w->ctl_reply);
        if (r == KVPS_OK && !(held[s] = (kvps__heldkey *)malloc(nk * sizeof **held + 1)))
            r = kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory for %zu keys", nk);
        for (size_t i = 0; i < nk && r == KVPS_OK; i++) {
            kvps__kent ent;
            memcpy(&ent, e + i * sizeof ent, sizeof ent);
            held[s][i].key = ent.key;
            if (!kvps__vshard_of(w, ent.key, &held[s][i].v))
                r = kvps__wfail(w, KVPS_ERR_TENSOR, "reshard: server %d holds key %016llx, a slice of a tensor this worker "
                                "has not registered (every tensor must be registered before a reshard)", s,
                                (unsigned long long)ent.key);
            else bytes[held[s][i].v] += ent.len * sizeof(float);
        }
        nheld[s] = nk;
    }
    uint64_t before = p2->nmv;
    if (r == KVPS_OK && kvps__vmap_plan(vmap2, w->V, n, n2, bytes, &p2->mv, &p2->nmv) != 0)
        r = kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory for %u virtual shards", w->V);
    if (r == KVPS_OK) {
        p2->n[p2->count] = (uint32_t)n2;
        p2->m[p2->count++] = (uint32_t)(p2->nmv - before);
    }
    free(bytes);
    return r;
}

/* Ranks but 0: the placement rank 0 planned, from server 0 (PLACE_GET): it must be this
   worker's with one more change, to n2 servers, whose moves make vmap2 from the map now. */
static kvps_result kvps__reshard_learn(kvps_worker *w, int n2, uint32_t *vmap2, kvps__place *p2, int timeout_ms) {
    kvps_result r = kvps__ctl_call(w, 0, KVPS__OP_PLACE_GET, NULL, 0, timeout_ms);
    if (r != KVPS_OK) return r;
    const char *why = kvps__place_dec(p2, (const unsigned char *)zmq_msg_data(&w->ctl_reply), zmq_msg_size(&w->ctl_reply));
    const kvps__place *p = &w->place;
    if (!why && (p2->count != p->count + 1 || p2->n[p->count] != (uint32_t)n2 || p2->V != p->V ||
                 memcmp(p2->n, p->n, 4 * (size_t)p->count) != 0 || memcmp(p2->m, p->m, 4 * (size_t)p->count) != 0 ||
                 (p->nmv && memcmp(p2->mv, p->mv, p->nmv * 8) != 0)))
        why = "it is not this worker's with one more change";
    for (uint64_t j = p->nmv; !why && j < p2->nmv; j++) vmap2[p2->mv[2 * j]] = p2->mv[2 * j + 1];
    for (uint32_t v = 0; !why && v < w->V; v++)
        if (vmap2[v] >= (uint32_t)n2) why = "a virtual shard left on a server that leaves";
    if (why) {
        char a[200];
        return kvps__wfail(w, KVPS_ERR_MISMATCH, "reshard: server 0 (%s) holds the placement %s, which does not follow "
                           "this worker's: %s (did every worker call kvps_worker_reshard with the same list?)",
                           kvps__ep(w, 0), kvps__place_text(p2, a, sizeof a), why);
    }
    return KVPS_OK;
}

/* A CURVE worker's public keys of the servers n..n2-1 of a new list (keys: the caller's, or
   NULL: the one it was given for all), into out (32 bytes each). */
static kvps_result kvps__reshard_keys(kvps_worker *w, const char *keys, char **list, int n, int n2, uint8_t *out) {
    if (!keys) {
        if (w->ncurve_skeys != 1)
            return kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: this CURVE worker was given one public key per server: "
                               "give the new list's keys (kvps_worker_reshard_keys) to connect to server %d (%s)", n,
                               list[n]);
        for (int i = n; i < n2; i++) memcpy(out + 32 * (i - n), w->curve_skeys, 32);
        return KVPS_OK;
    }
    char **kl = NULL;
    int nk = kvps__split(keys, &kl), bad = nk != 1 && nk != n2 ? n : -1;
    for (int i = n; i < n2 && bad < 0; i++)
        if (kvps__z85_key(kl[nk == 1 ? 0 : i], out + 32 * (i - n)) != 0) bad = i;
    kvps__free_strv(kl, nk);
    if (bad >= 0)
        return kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: curve_server_keys must hold one key, or one per server of the "
                           "new list (%d; it holds %d), 40 Z85 characters each: none for server %d (%s)", n2,
                           nk < 0 ? 0 : nk, bad, list[bad]);
    return KVPS_OK;
}

/* Waits up to timeout_ms until no hello of this worker waits for its answer (a refused one is
   the worker's fatal error, named by the server). */
static kvps_result kvps__hellos_answered(kvps_worker *w, int timeout_ms) {
    int64_t deadline = kvps__now_ms() + timeout_ms;
    for (;;) {
        if (w->fatal) return kvps__wfail(w, w->fatal, "%s", w->fatal_text);
        int srv = -1;
        for (uint32_t i = 0; i < w->nslots && srv < 0; i++)
            if (w->slots[i] && w->slots[i]->ctl == KVPS__OP_HELLO)
                for (int s = 0; s < w->n && srv < 0; s++)
                    if (w->slots[i]->state[s] == KVPS__RS_SENT) srv = s;
        if (srv < 0) return KVPS_OK;
        int64_t now = kvps__now_ms();
        if (now >= deadline)
            return kvps__wfail(w, KVPS_ERR_TIMEOUT, "reshard: server %d (%s) did not answer this worker's hello within %d ms",
                               srv, kvps__ep(w, srv), timeout_ms);
        kvps_result pr = kvps__progress(w, (long)(deadline - now < 100 ? deadline - now : 100));
        if (pr != KVPS_OK && !w->fatal) return pr;
        kvps__watch(w);
    }
}

/* What a reshard to the list (n2 servers, this worker has n) must hold to begin: the old
   servers kept in order, nothing in flight, CURVE keys only for a CURVE worker. */
static kvps_result kvps__reshard_check(kvps_worker *w, char **list, int n, int n2, const char *curve_server_keys) {
    kvps_result r = KVPS_OK;
    for (int i = 0; i < n && i < n2 && r == KVPS_OK; i++)
        if (strcmp(list[i], w->endpoints[i]) != 0)
            r = kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: the new list must keep the servers in order and add or remove at "
                            "its end: server %d was '%s', the new list has '%s'", i, w->endpoints[i], list[i]);
    for (uint32_t i = 0; i < w->nslots && r == KVPS_OK; i++)
        if (w->slots[i] && !w->slots[i]->ctl)
            r = kvps__wfail(w, KVPS_ERR_STATE, "reshard: wait for every request first (request %llu is in flight)",
                            (unsigned long long)w->slots[i]->id);
    if (r == KVPS_OK && curve_server_keys && !w->curve)
        r = kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: curve_server_keys given, but this worker does not speak CURVE");
    return r;
}

/* A grow, step 1: connect to the new servers n..n2-1 (list's entries move into the worker; skeys:
   their CURVE keys), open their read replicas, say hello and name every tensor to them. */
static kvps_result kvps__reshard_connect(kvps_worker *w, char **list, int n, int n2, const uint8_t *skeys) {
    kvps_result r = KVPS_OK;
    for (int i = n; i < n2 && r == KVPS_OK; i++) {
        w->endpoints[i] = list[i];
        list[i] = NULL;
        if ((w->nrep[i] = kvps__split_by(w->endpoints[i], '|', &w->reps[i])) < 1) {
            w->nrep[i] = 0;
            r = kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: malformed replica list '%s'", w->endpoints[i]);
        }
        if (r == KVPS_OK &&
            (r = kvps__worker_sock(w, i, skeys ? skeys + 32 * (i - n) : NULL, w->curve_pub, w->curve_sec)) != KVPS_OK)
            kvps__wfail(w, r, "reshard: cannot connect to server %d (%s)", i, kvps__ep(w, i));
        w->n = i + 1;
    }
    if (r == KVPS_OK && w->rj && (r = kvps__reads_open(w, n)) != KVPS_OK)
        kvps__wfail(w, r, "reshard: cannot open the new shards' read replicas");
    kvps__worker_items(w);
    if (r == KVPS_OK) r = kvps__hello_from(w, n);
    for (int t = 0; t < w->ntensors && r == KVPS_OK; t++) kvps__name_all(w, t);
    return r;
}

/* Step 3, worker 0 only: plan the new map (vmap2, placement *p2) by the bytes each virtual shard
   holds, move the keys and rows, and tell every server the new placement. */
static kvps_result kvps__reshard_lead(kvps_worker *w, int n, int n2, uint32_t *vmap2, kvps__place *p2, int timeout_ms) {
    kvps_result r = KVPS_OK;
    kvps__heldkey **held = (kvps__heldkey **)calloc((size_t)n, sizeof *held);
    size_t *nheld = (size_t *)calloc((size_t)n, sizeof *nheld);
    if (!held || !nheld) r = kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory");
    if (r == KVPS_OK) r = kvps__reshard_plan(w, n, n2, vmap2, p2, held, nheld, timeout_ms);
    for (int s = 0; r == KVPS_OK && s < n; s++) {
        r = kvps__move_from(w, s, held[s], nheld[s], vmap2, n2, timeout_ms);
        if (r == KVPS_OK) r = kvps__move_rows_from(w, s, vmap2, n2, timeout_ms);
    }
    for (int s = 0; held && s < n; s++) free(held[s]);
    free(held);
    free(nheld);
    if (r == KVPS_OK) { /* the servers record it: checkpoints say how their keys were placed */
        unsigned char *pb = (unsigned char *)malloc(kvps__place_size(p2));
        if (!pb) r = kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory");
        size_t pn = pb ? kvps__place_enc(p2, pb) : 0;
        for (int s = 0; s < n2 && r == KVPS_OK; s++) r = kvps__ctl_call(w, s, KVPS__OP_PLACE, pb, pn, timeout_ms);
        free(pb);
    }
    return r;
}

/* A shrink, done: goodbye to the servers n2..n-1 that leave (they stop by themselves), their
   sockets closed and their entries freed. */
static void kvps__reshard_leave(kvps_worker *w, int n, int n2) {
    kvps_result br = KVPS_OK;
    kvps__req *q = kvps__bye(w, n2, 1000, 0, &br);
    if (q) kvps__req_end(w, q);
    for (int i = n2; i < n; i++) {
        zmq_close(w->socks[i]);
        zmq_close(w->mons[i]);
        w->socks[i] = w->mons[i] = NULL;
        if (w->rsocks && w->rsocks[i]) {
            zmq_close(w->rsocks[i]);
            zmq_close(w->rmons[i]);
            w->rsocks[i] = w->rmons[i] = NULL;
            w->rj[i] = -1;
        }
        kvps__free_strv(w->reps[i], w->nrep[i]);
        free(w->endpoints[i]);
        w->reps[i] = NULL;
        w->endpoints[i] = NULL;
        kvps__replay_clear(&w->rp[i]);
    }
    w->n = n2;
    kvps__worker_items(w);
}

KVPS_API kvps_result kvps_worker_reshard_keys(kvps_worker *w, const char *servers, const char *curve_server_keys,
                                              int timeout_ms) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "reshard", servers);
    kvps_result r = kvps__place_ready(w);
    if (r != KVPS_OK) return r;
    if (w->place.count == KVPS__PLACE_MAX)
        return kvps__wfail(w, KVPS_ERR_STATE, "reshard: %d reshards are recorded, the most a placement holds", KVPS__PLACE_MAX - 1);
    char **list = NULL;
    int n = w->n, n2 = kvps__split(servers, &list);
    if (n2 < 1) return kvps__wfail(w, KVPS_ERR_CONFIG, "reshard: malformed server list '%s'", servers);
    r = kvps__reshard_check(w, list, n, n2, curve_server_keys);
    if (r != KVPS_OK || n2 == n) { kvps__free_strv(list, n2); return r; }
    uint8_t *skeys = NULL; /* a CURVE worker's keys of the new servers */
    if (w->curve && n2 > n) {
        if (!(skeys = (uint8_t *)malloc(32 * (size_t)(n2 - n)))) r = kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory");
        else r = kvps__reshard_keys(w, curve_server_keys, list, n, n2, skeys);
        if (r != KVPS_OK) { free(skeys); kvps__free_strv(list, n2); return r; }
    }
    uint32_t *vmap2 = (uint32_t *)malloc((size_t)w->V * sizeof *vmap2);
    if (!vmap2 || (n2 > n && kvps__worker_resize(w, n2) != 0)) {
        free(vmap2);
        free(skeys);
        kvps__free_strv(list, n2);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "reshard: out of memory");
    }
    memcpy(vmap2, w->vmap, (size_t)w->V * sizeof *vmap2);
    kvps__place p2; /* the placement after this change (rank 0 plans it, the others read it) */
    memset(&p2, 0, sizeof p2);
    /* 1. a grow: connect to the new servers and say hello (the new list); then wait for the
          answers to every hello this worker has sent, so that each is served before worker 0,
          past the barrier, tells the servers the new placement (a hello served after that is
          answered with a placement this worker does not hold yet; one still unanswered would be
          re-sent after a failover, naming the old placement, and the server would refuse this
          worker's keyed requests) */
    kvps_req b;
    if (n2 > n) r = kvps__reshard_connect(w, list, n, n2, skeys);
    if (r == KVPS_OK) r = kvps__hellos_answered(w, timeout_ms);
    /* 2. every worker is here, nothing is in flight anywhere */
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &b);
    if (r == KVPS_OK) r = kvps_worker_wait(w, b, timeout_ms);
    /* 3. rank 0 plans, moves and records; the others wait at a second barrier, then read it */
    if (r == KVPS_OK && w->desc.rank == 0) r = kvps__reshard_lead(w, n, n2, vmap2, &p2, timeout_ms);
    if (r == KVPS_OK) r = kvps_worker_barrier(w, &b);
    if (r == KVPS_OK) r = kvps_worker_wait(w, b, timeout_ms);
    if (r == KVPS_OK && w->desc.rank != 0) r = kvps__reshard_learn(w, n2, vmap2, &p2, timeout_ms);
    if (r == KVPS_OK) {
        memcpy(w->vmap, vmap2, (size_t)w->V * sizeof *vmap2);
        kvps__place_free(&w->place);
        w->place = p2;
        memset(&p2, 0, sizeof p2);
        for (int t = 0; t < w->ntensors; t++) kvps__tensor_place(w, &w->tensors[t]);
        if (n2 < n) kvps__reshard_leave(w, n, n2);
        kvps__log(KVPS_LOG_INFO, "worker %d: resharded from %d to %d servers", w->desc.rank, n, n2);
    }
    kvps__place_free(&p2);
    free(vmap2);
    free(skeys);
    kvps__free_strv(list, n2);
    return r;
}

static int kvps__server_of(const kvps_worker *w, uint64_t key) {
    return (int)w->vmap[kvps__mix64(key) % w->V];
}

/* A stable counting sort by bucket: item i (of n) is in bucket bucket[i] (< nb). start (nb + 1
   entries) gets where each bucket's items begin, order the items bucket by bucket, each bucket's
   in their own order. (Raw keys by server, kvps__keys_op; fused slices by server,
   kvps__fused_slices.) */
static void kvps__sort_by_bucket(const uint32_t *bucket, uint32_t n, int nb, uint32_t *start, uint32_t *order) {
    memset(start, 0, ((size_t)nb + 1) * sizeof *start);
    for (uint32_t i = 0; i < n; i++) start[bucket[i] + 1]++;
    for (int b = 0; b < nb; b++) start[b + 1] += start[b];
    for (uint32_t i = 0; i < n; i++) order[start[bucket[i]]++] = i;
    for (int b = nb; b > 0; b--) start[b] = start[b - 1]; /* (each start moved to its bucket's end) */
    start[0] = 0;
}

/* Raw keys: group by server, one message each. */
static kvps_result kvps__keys_op(kvps_worker *w, int op, const uint64_t *keys, const float *vals,
                                 float *dst, const size_t *lens, size_t nkeys, kvps_req *out) {
    const char *call = kvps__ops[op].name;
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, call, keys);
    KVPS__NEED(w, call, lens);
    KVPS__NEED(w, call, out);
    if (nkeys == 0 || nkeys > UINT32_MAX)
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: nkeys is %zu (1 to 2^32 - 1)", call, nkeys);
    if (kvps__op_has_values(op) && !vals) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: vals is NULL", call);
    if (kvps__op_pulls(op) && !dst) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: vals (the destination) is NULL", call);
    *out = 0;
    kvps_result pr = kvps__place_ready(w);
    if (pr != KVPS_OK) return pr;
    if (w->order_cap < nkeys) {
        uint32_t *no = (uint32_t *)realloc(w->order, nkeys * sizeof *no);
        if (no) w->order = no;
        uint32_t *nb = no ? (uint32_t *)realloc(w->bucket, nkeys * sizeof *nb) : NULL;
        if (nb) w->bucket = nb;
        if (!no || !nb) return kvps__wfail(w, KVPS_ERR_NOMEM, "%s: out of memory for %zu keys", call, nkeys);
        w->order_cap = nkeys;
    }
    for (size_t i = 0; i < nkeys; i++) {
        if (keys[i] >> 63)
            return kvps__wfail(w, KVPS_ERR_KEY_RESERVED, "%s: keys[%zu] = %llu is 2^63 or more (those are tensor slices)", call, i,
                               (unsigned long long)keys[i]);
        if (lens[i] == 0) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: lens[%zu] is 0 (key %llu)", call, i, (unsigned long long)keys[i]);
        w->bucket[i] = (uint32_t)kvps__server_of(w, keys[i]);
    }
    /* the keys by server, each server's in the caller's order */
    kvps__sort_by_bucket(w->bucket, (uint32_t)nkeys, w->n, w->count, w->order);
    kvps__req *q = kvps__req_new(w, kvps__op_pulls(op) ? nkeys : 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    memcpy(q->dbegin, w->count, ((size_t)w->n + 1) * sizeof *q->dbegin);
    uint64_t *offs = (uint64_t *)malloc(nkeys * sizeof *offs);
    kvps__kent *ents = (kvps__kent *)malloc(nkeys * sizeof *ents);
    const float **vp = (const float **)malloc(nkeys * sizeof *vp);
    kvps_result r = (offs && ents && vp) ? KVPS_OK : KVPS_ERR_NOMEM;
    if (r == KVPS_OK) {
        uint64_t off = 0;
        for (size_t i = 0; i < nkeys; i++) {
            offs[i] = off;
            off += lens[i];
        }
        for (int s = 0; s < w->n && r == KVPS_OK; s++) {
            uint32_t b = q->dbegin[s], e = q->dbegin[s + 1];
            if (b == e) continue;
            int contiguous = 1;
            for (uint32_t j = b; j < e; j++) {
                uint32_t i = w->order[j];
                ents[j].key = keys[i];
                ents[j].len = lens[i];
                vp[j] = vals ? vals + offs[i] : NULL;
                if (q->dest) { q->dest[j].ptr = dst + offs[i]; q->dest[j].len = lens[i]; }
                if (j > b && offs[i] != offs[w->order[j - 1]] + lens[w->order[j - 1]]) contiguous = 0;
            }
            kvps__msg_spec m = {ents + b, e - b, vp + b, contiguous ? 1 : e - b, NULL, NULL, NULL, NULL};
            r = kvps__send_req(w, q, s, op, &m);
        }
    }
    free(offs); free(ents); free(vp);
    if (r != KVPS_OK && q->pending == 0) { kvps__req_end(w, q); return r; }
    if (r != KVPS_OK) q->status = r; /* some messages went out: the caller still waits */
    if (w->tl) kvps__tl_post(q, op, kvps__tl_floats(lens, nkeys) * sizeof(float), nkeys);
    *out = q->id;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_push(kvps_worker *w, const uint64_t *keys, const float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out) {
    return kvps__keys_op(w, KVPS__OP_PUSH, keys, vals, NULL, lens, nkeys, out);
}
KVPS_API kvps_result kvps_worker_pull(kvps_worker *w, const uint64_t *keys, float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out) {
    return kvps__keys_op(w, KVPS__OP_PULL, keys, NULL, vals, lens, nkeys, out);
}
/* REPLICAS, .read_local: a pushpull is its push, request a, then a READ of the same keys made
   with w->read_push = a (which this clears): b, or r, the READ call's error. One handle, a's,
   for both: the READ is chained behind the push. */
static kvps_result kvps__read_behind(kvps_worker *w, kvps_req a, kvps_result r, kvps_req b, kvps_req *out) {
    w->read_push = 0;
    kvps__req *qa = kvps__req_get(w, a), *last = qa;
    while (last->next) last = kvps__req_get(w, last->next);
    if (r == KVPS_OK) last->next = b;
    else if (qa->status == KVPS_OK) qa->status = r; /* (the push is out: its handle reports it) */
    if (qa->tl_op) qa->tl_op = KVPS__OP_PUSHPULL; /* (the timeline draws the two as the caller's pushpull) */
    *out = a;
    return KVPS_OK;
}
KVPS_API kvps_result kvps_worker_pushpull(kvps_worker *w, const uint64_t *keys, const float *grads,
                                          float *vals, const size_t *lens, size_t nkeys, kvps_req *out) {
    if (w && grads && vals && kvps__reads_on(w)) {
        kvps_req a = 0, b = 0;
        kvps_result r = kvps__keys_op(w, KVPS__OP_PUSH, keys, grads, NULL, lens, nkeys, &a);
        if (r != KVPS_OK) return r;
        w->read_push = a;
        r = kvps__keys_op(w, KVPS__OP_READ, keys, NULL, vals, lens, nkeys, &b);
        return kvps__read_behind(w, a, r, b, out);
    }
    return kvps__keys_op(w, KVPS__OP_PUSHPULL, keys, grads, vals, lens, nkeys, out);
}
KVPS_API kvps_result kvps_worker_init(kvps_worker *w, const uint64_t *keys, const float *vals,
                                      const size_t *lens, size_t nkeys, kvps_req *out) {
    return kvps__keys_op(w, KVPS__OP_INIT, keys, vals, NULL, lens, nkeys, out);
}

// >>tensor
/* Tells every server tensor t's name and layout (NAME): their messages then name it, and a
   worker that registers it with another length or layout is told at once. Nothing waits for
   the answers (a refusal marks the tensor: its calls then fail with the server's words). */
static void kvps__name_all(kvps_worker *w, kvps_tensor ti) {
    const kvps__tensor_info *t = &w->tensors[ti];
    size_t nb = strlen(t->name);
    if (nb > KVPS__NAME_MAX) nb = KVPS__NAME_MAX; /* (the first 255 bytes name it in messages) */
    unsigned char v[KVPS__NAME_REC + KVPS__NAME_MAX];
    uint64_t base = t->keys[0] & ~(uint64_t)0xffff, len = t->len;
    memcpy(v, &base, 8);
    memcpy(v + 8, &len, 8);
    kvps__put32(v + 16, t->nslices);
    kvps__put32(v + 20, (uint32_t)nb);
    memcpy(v + KVPS__NAME_REC, t->name, nb);
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return;
    q->ctl = KVPS__OP_NAME;
    q->tensor = ti + 1;
    for (int i = 0; i < w->n; i++)
        if (kvps__send_ctl(w, q, i, KVPS__OP_NAME, v, KVPS__NAME_REC + nb) != KVPS_OK) break;
    if (!q->pending) kvps__req_end(w, q);
}

/* Each slice's server: its virtual shard's (vmap). */
static void kvps__tensor_place(kvps_worker *w, kvps__tensor_info *t) {
    for (uint32_t i = 0; i < t->nslices; i++) t->server[i] = (int)w->vmap[(t->hv + (uint64_t)i) % w->V];
}

KVPS_API kvps_result kvps_worker_tensor(kvps_worker *w, const char *name, size_t len, kvps_tensor *out) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "tensor", name);
    KVPS__NEED(w, "tensor", out);
    if (!*name) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "tensor: the name is empty");
    if (len == 0) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "tensor '%s': len is 0", name);
    kvps_result pr = kvps__place_ready(w); /* (slices are cut for the first list, placed by vmap) */
    if (pr != KVPS_OK) return pr;
    uint64_t h = kvps__fnv1a(name);
    uint64_t base = (1ull << 63) | ((h & 0x7fffffffffffull) << 16);
    for (int i = 0; i < w->ntensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0 || (w->tensors[i].keys[0] & ~0xffffull) == base) {
            kvps__log(KVPS_LOG_ERROR, "tensor '%s': %s", name,
                      strcmp(w->tensors[i].name, name) == 0 ? "already registered" : "hash collides");
            return kvps__wfail(w, KVPS_ERR_TENSOR, "tensor '%s': %s", name,
                               strcmp(w->tensors[i].name, name) == 0 ? "already registered"
                                                                      : "its name's hash collides with another tensor's");
        }
    }
    if (w->ntensors == w->cap_tensors) {
        int nc = w->cap_tensors ? w->cap_tensors * 2 : 16;
        kvps__tensor_info *nt = (kvps__tensor_info *)realloc(w->tensors, (size_t)nc * sizeof *nt);
        if (!nt) return kvps__wfail(w, KVPS_ERR_NOMEM, "tensor '%s': out of memory", name);
        w->tensors = nt;
        w->cap_tensors = nc;
    }
    uint64_t ns = (len + w->desc.min_slice - 1) / w->desc.min_slice, n = (uint64_t)w->place.n[0];
    if (ns > n) ns = n;
    if (ns < 1) ns = 1;
    uint64_t pieces = (len + w->desc.max_slice - 1) / w->desc.max_slice;
    if (pieces > ns) ns = (pieces + n - 1) / n * n; /* a multiple of n: the servers stay even */
    if (ns > 65536) ns = 65536 - 65536 % n;           /* the slice index has 16 bits in the key */
    if (ns > len) ns = len;
    kvps__tensor_info *t = &w->tensors[w->ntensors];
    memset(t, 0, sizeof *t);
    t->name = (char *)malloc(strlen(name) + 1);
    if (t->name) memcpy(t->name, name, strlen(name) + 1);
    t->len = len;
    t->nslices = (uint32_t)ns;
    t->keys = (uint64_t *)malloc(ns * sizeof *t->keys);
    t->off = (uint64_t *)malloc(ns * sizeof *t->off);
    t->slen = (uint64_t *)malloc(ns * sizeof *t->slen);
    t->server = (int *)malloc(ns * sizeof *t->server);
    if (!t->name || !t->keys || !t->off || !t->slen || !t->server) {
        free(t->name); free(t->keys); free(t->off); free(t->slen); free(t->server);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "tensor '%s': out of memory for %llu slices", name, (unsigned long long)ns);
    }
    t->hv = (uint32_t)(h % w->V); /* slice i: virtual shard (hv + i) mod V; at first (h + i) mod n */
    for (uint64_t i = 0; i < ns; i++) {
        uint64_t b = (uint64_t)len * i / ns, e = (uint64_t)len * (i + 1) / ns;
        t->keys[i] = base | i;
        t->off[i] = b;
        t->slen[i] = e - b;
    }
    kvps__tensor_place(w, t);
    *out = w->ntensors++;
    kvps__name_all(w, *out);
    return KVPS_OK;
}

KVPS_API size_t kvps_worker_tensor_slices(const kvps_worker *w, kvps_tensor t) {
    return (w && t >= 0 && t < w->ntensors) ? w->tensors[t].nslices : 0;
}

/* A tensor op's round starting at slice i0 ends here: consecutive slices sit on consecutive
   servers, so n of them are on distinct servers. */
static uint32_t kvps__round_end(const kvps_worker *w, const kvps__tensor_info *t, uint32_t i0) {
    uint32_t i = i0; /* the longest run of slices on distinct servers (n of them until a reshard) */
    uint64_t stamp = ++((kvps_worker *)w)->round_stamp;
    for (; i < t->nslices; i++) {
        if (w->rstamp[t->server[i]] == stamp) break;
        w->rstamp[t->server[i]] = stamp;
    }
    return i;
}

/* Links round q of a chained request after *last (the first becomes *head); a round with nothing
   in flight is dropped. r: how sending q went. */
static kvps_result kvps__chain_link(kvps_worker *w, kvps__req **head, kvps__req **last, kvps__req *q, kvps_result r) {
    if (r != KVPS_OK && q->pending == 0) { kvps__req_end(w, q); return r; }
    if (r != KVPS_OK) q->status = r;
    if (*last) (*last)->next = q->id;
    else *head = q;
    *last = q;
    return r;
}

/* The caller's handle for a chain: its first round, which carries the error of a round that
   could not go out. Nothing in flight: the error itself. */
static kvps_result kvps__chain_out(kvps__req *head, kvps_result r, kvps_req *out) {
    if (!head) return r;
    if (r != KVPS_OK && head->status == KVPS_OK) head->status = r;
    *out = head->id;
    return KVPS_OK;
}

/* One round of a tensor op: slices [i0, i1), on distinct servers, one message each. */
static kvps_result kvps__tensor_round(kvps_worker *w, int op, kvps__tensor_info *t, uint32_t i0, uint32_t i1,
                                      const float *vals, float *dst, kvps_view *view, kvps__req **out) {
    kvps__req *q = *out = kvps__req_new(w, kvps__op_pulls(op) ? i1 - i0 : 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    q->view = view;
    q->vbase = i0;
    /* dest index of slice i is i - i0; dbegin[s] points at the slice on server s */
    memset(q->dbegin, 0, ((size_t)w->n + 1) * sizeof *q->dbegin);
    kvps_result r = KVPS_OK;
    int coded = t->has_push && op != KVPS__OP_INIT; /* initial values go exact */
    q->tensor = (int)(t - w->tensors) + 1;
    q->prio = t->prio;
    q->coded_pull = t->has_pull && kvps__op_pulls(op);
    if (q->coded_pull) q->pull_c = t->pull_c;
    for (uint32_t i = i0; i < i1 && r == KVPS_OK; i++) {
        int s = t->server[i];
        q->dbegin[s] = i - i0;
        if (q->dest) { q->dest[i - i0].ptr = view ? view->part[i].own : dst + t->off[i]; q->dest[i - i0].len = t->slen[i]; }
        if (view) { view->part[i].off = t->off[i]; view->part[i].len = t->slen[i]; view->part[i].data = view->part[i].own; }
        kvps__kent e = {t->keys[i], t->slen[i]};
        const float *vp = vals ? vals + t->off[i] : NULL;
        uint64_t wire = coded ? 0 : (kvps__op_has_values(op) ? t->slen[i] * sizeof(float) : 0);
        kvps__msg_spec m = {&e, 1, &vp, 1, coded ? &t->push_c : NULL, coded && t->resid ? t->resid[i] : NULL,
                            q->coded_pull ? &t->pull_c : NULL, &wire};
        r = kvps__send_req(w, q, s, op, &m);
        if (r == KVPS_OK && kvps__op_has_values(op) && op != KVPS__OP_INIT) {
            t->st.push_raw_bytes += t->slen[i] * sizeof(float);
            t->st.push_wire_bytes += wire;
        }
    }
    q->dbegin[w->n] = UINT32_MAX; /* marks a tensor request: one dest per server */
    return r;
}

/* A tensor op goes out in rounds of at most one slice per server (one round unless the tensor
   has more slices than servers, see max_slice); every round's messages are in flight at once. */
static kvps_result kvps__tensor_op(kvps_worker *w, int op, kvps_tensor ti, const float *vals, float *dst,
                                   kvps_view *view, kvps_req *out) {
    const char *call = kvps__ops[op].name;
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, call, out);
    KVPS__TENSOR_OK(w, call, ti);
    if (kvps__op_has_values(op) && !vals)
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s of tensor '%s': the values are NULL", call, w->tensors[ti].name);
    if (kvps__op_pulls(op) && !dst && !view)
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s of tensor '%s': the destination is NULL", call, w->tensors[ti].name);
    *out = 0;
    kvps__tensor_info *t = &w->tensors[ti];
    if (t->bad) /* a server refused its name: another worker registered it otherwise */
        return kvps__wfail(w, t->bad, "%s of tensor '%s': %s", call, t->name, t->bad_text ? t->bad_text : "refused");
    if (view && t->has_pull) { /* coded replies are decoded into buffers the view owns */
        for (uint32_t i = 0; i < t->nslices; i++)
            if (!(view->part[i].own = (float *)kvps__alloc_floats(t->slen[i])))
                return kvps__wfail(w, KVPS_ERR_NOMEM, "pull of tensor '%s': out of memory for its view", t->name);
    }
    kvps__req *head = NULL, *last = NULL;
    kvps_result r = KVPS_OK;
    for (uint32_t i0 = 0, i1; i0 < t->nslices && r == KVPS_OK; i0 = i1) {
        i1 = kvps__round_end(w, t, i0);
        kvps__req *q;
        r = kvps__tensor_round(w, op, t, i0, i1, vals, dst, view, &q);
        if (q) r = kvps__chain_link(w, &head, &last, q, r);
    }
    if (kvps__op_has_values(op) && op != KVPS__OP_INIT) t->st.pushes++;
    if (kvps__op_pulls(op)) t->st.pulls++;
    if (w->tl) kvps__tl_post(head, op, t->len * sizeof(float), 0);
    return kvps__chain_out(head, r, out);
}

KVPS_API kvps_result kvps_worker_push_tensor(kvps_worker *w, kvps_tensor t, const float *grad, kvps_req *out) {
    return kvps__tensor_op(w, KVPS__OP_PUSH, t, grad, NULL, NULL, out);
}

/* ---- FUSION: several tensors in one request ----
   The plain slices of all the tensors, ordered by (priority, place in the list, slice), are
   dealt to their servers; a round is one message per server, carrying that server's next
   slices up to fusion_bytes (at least one), and the rounds are chained as a long tensor's are.
   Tensors with a codec for this op go out as their own rounds (kvps__tensor_round), first. */
typedef struct kvps__fslice { uint32_t t, i; } kvps__fslice; /* list position, slice */

static int kvps__fused_coded(const kvps__tensor_info *t, int op) {
    return (t->has_push && kvps__op_has_values(op) && op != KVPS__OP_INIT) || (t->has_pull && kvps__op_pulls(op));
}

/* The list's tensors, each checked (known, not refused, once in the list, its buffers given);
   *nplain: the slices that go out fused (those of tensors without a codec for op). */
static kvps_result kvps__tensors_check(kvps_worker *w, const char *call, int op, const kvps_tensor *ts, size_t n,
                                       const float *const *vals, float *const *dst, uint64_t *nplain) {
    uint64_t stamp = ++w->round_stamp;
    *nplain = 0;
    for (size_t k = 0; k < n; k++) {
        KVPS__TENSOR_OK(w, call, ts[k]);
        kvps__tensor_info *t = &w->tensors[ts[k]];
        if ((kvps__op_has_values(op) && !vals[k]) || (kvps__op_pulls(op) && !dst[k]))
            return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: tensor '%s' (list entry %zu): its %s is NULL", call, t->name, k,
                               kvps__op_has_values(op) && !vals[k] ? "values" : "destination");
        if (t->bad) return kvps__wfail(w, t->bad, "%s of tensor '%s': %s", call, t->name, t->bad_text ? t->bad_text : "refused");
        if (t->fstamp == stamp) return kvps__wfail(w, KVPS_ERR_DUP_KEY, "%s: tensor '%s' is in the list twice", call, t->name);
        t->fstamp = stamp;
        if (!kvps__fused_coded(t, op)) *nplain += t->nslices;
    }
    if (*nplain > UINT32_MAX) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: %llu slices in one call", call, (unsigned long long)*nplain);
    return KVPS_OK;
}

/* The plain slices of the list by server, each server's in (priority, list, slice) order: sl
   (nplain entries) and at (each server's first, w->n + 1 entries). 0, or -1 out of memory. */
static int kvps__fused_slices(kvps_worker *w, int op, const kvps_tensor *ts, size_t n, uint32_t nplain, kvps__fslice *sl,
                              uint32_t *at) {
    uint32_t *ord = (uint32_t *)malloc((n + 1) * sizeof *ord), *bucket = (uint32_t *)malloc(((size_t)nplain + 1) * sizeof *bucket),
             *perm = (uint32_t *)malloc(((size_t)nplain + 1) * sizeof *perm);
    kvps__fslice *items = (kvps__fslice *)malloc(((size_t)nplain + 1) * sizeof *items);
    int rc = ord && bucket && perm && items ? 0 : -1;
    if (rc == 0) {
        for (uint32_t k = 0; k < (uint32_t)n; k++) ord[k] = k;
        for (uint32_t k = 1; k < (uint32_t)n; k++) /* a stable insertion sort by priority, highest first */
            for (uint32_t j = k; j > 0 && w->tensors[ts[ord[j - 1]]].prio < w->tensors[ts[ord[j]]].prio; j--) {
                uint32_t x = ord[j];
                ord[j] = ord[j - 1];
                ord[j - 1] = x;
            }
        uint32_t m = 0;
        for (size_t k = 0; k < n; k++) {
            const kvps__tensor_info *t = &w->tensors[ts[ord[k]]];
            if (kvps__fused_coded(t, op)) continue;
            for (uint32_t i = 0; i < t->nslices; i++, m++) {
                items[m].t = ord[k];
                items[m].i = i;
                bucket[m] = (uint32_t)t->server[i];
            }
        }
        kvps__sort_by_bucket(bucket, nplain, w->n, at, perm);
        for (uint32_t j = 0; j < nplain; j++) sl[j] = items[perm[j]];
    }
    free(ord); free(bucket); free(perm); free(items);
    return rc;
}

/* One fused round, request q: each server's next slices from cur up to fusion_bytes (at least
   one), one message each. */
static kvps_result kvps__fused_round(kvps_worker *w, int op, const kvps_tensor *ts, const float *const *vals, float *const *dst,
                                     const kvps__fslice *sl, const uint32_t *at, uint32_t *cur, kvps__kent *ents,
                                     const float **vp, kvps__req *q) {
    kvps_result r = KVPS_OK;
    uint32_t d = 0;
    q->prio = INT_MIN; /* the round's highest: a server's first slice is its highest */
    for (int s = 0; s < w->n; s++)
        if (cur[s] < at[s + 1] && w->tensors[ts[sl[cur[s]].t]].prio > q->prio) q->prio = w->tensors[ts[sl[cur[s]].t]].prio;
    for (int s = 0; s < w->n && r == KVPS_OK; s++) {
        q->dbegin[s] = d;
        uint32_t b = d;
        uint64_t mb = 0;
        int contiguous = 1;
        for (; cur[s] < at[s + 1]; cur[s]++) {
            kvps__fslice f = sl[cur[s]];
            const kvps__tensor_info *t = &w->tensors[ts[f.t]];
            uint64_t sb = t->slen[f.i] * sizeof(float);
            if (d > b && mb + sb > w->desc.fusion_bytes) break;
            mb += sb;
            ents[d].key = t->keys[f.i];
            ents[d].len = t->slen[f.i];
            vp[d] = vals ? vals[f.t] + t->off[f.i] : NULL;
            if (d > b && vp[d] != vp[d - 1] + ents[d - 1].len) contiguous = 0;
            if (q->dest) { q->dest[d].ptr = dst[f.t] + t->off[f.i]; q->dest[d].len = t->slen[f.i]; }
            d++;
        }
        kvps__msg_spec m = {ents + b, d - b, vp + b, contiguous ? 1 : d - b, NULL, NULL, NULL, NULL};
        if (d > b) r = kvps__send_req(w, q, s, op, &m);
    }
    q->dbegin[w->n] = d;
    return r;
}

static kvps_result kvps__tensors_op(kvps_worker *w, int op, const kvps_tensor *ts, size_t n, const float *const *vals,
                                    float *const *dst, kvps_req *out) {
    const char *call = op == KVPS__OP_PUSH ? "push_tensors" : op == KVPS__OP_PULL ? "pull_tensors" : "pushpull_tensors";
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, call, out);
    *out = 0;
    if (n == 0 || n > UINT32_MAX) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: %zu tensors (1 to 2^32 - 1)", call, n);
    KVPS__NEED(w, call, ts);
    if (kvps__op_has_values(op)) KVPS__NEED(w, call, vals);
    if (kvps__op_pulls(op)) KVPS__NEED(w, call, dst);
    uint64_t nplain = 0;
    kvps_result r = kvps__tensors_check(w, call, op, ts, n, vals, dst, &nplain);
    if (r != KVPS_OK) return r;
    kvps__req *head = NULL, *last = NULL;
    uint64_t bytes = 0;
    for (size_t k = 0; k < n && r == KVPS_OK; k++) { /* coded tensors: their own rounds */
        kvps__tensor_info *t = &w->tensors[ts[k]];
        bytes += t->len * sizeof(float);
        if (!kvps__fused_coded(t, op)) continue;
        for (uint32_t i0 = 0, i1; i0 < t->nslices && r == KVPS_OK; i0 = i1) {
            i1 = kvps__round_end(w, t, i0);
            kvps__req *q;
            r = kvps__tensor_round(w, op, t, i0, i1, vals ? vals[k] : NULL, dst ? dst[k] : NULL, NULL, &q);
            if (q) r = kvps__chain_link(w, &head, &last, q, r);
        }
    }
    /* the plain slices by server, then rounds of each server's next slices */
    kvps__fslice *sl = (kvps__fslice *)malloc((nplain + 1) * sizeof *sl);
    uint32_t *at = (uint32_t *)calloc((size_t)w->n + 1, sizeof *at), *cur = (uint32_t *)calloc((size_t)w->n + 1, sizeof *cur);
    kvps__kent *ents = (kvps__kent *)malloc((nplain + 1) * sizeof *ents);
    const float **vp = (const float **)malloc((nplain + 1) * sizeof *vp);
    if (r == KVPS_OK && (!sl || !at || !cur || !ents || !vp || kvps__fused_slices(w, op, ts, n, (uint32_t)nplain, sl, at) != 0))
        r = kvps__wfail(w, KVPS_ERR_NOMEM, "%s: out of memory for %llu slices", call, (unsigned long long)nplain);
    if (r == KVPS_OK) memcpy(cur, at, ((size_t)w->n + 1) * sizeof *cur); /* from here: each server's next slice */
    while (r == KVPS_OK) {
        size_t left = 0;
        for (int s = 0; s < w->n; s++) left += at[s + 1] - cur[s];
        if (!left) break;
        kvps__req *q = kvps__req_new(w, kvps__op_pulls(op) ? left : 0);
        if (!q) { r = kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)"); break; }
        r = kvps__fused_round(w, op, ts, vals, dst, sl, at, cur, ents, vp, q);
        r = kvps__chain_link(w, &head, &last, q, r);
    }
    free(sl); free(at); free(cur); free(ents); free(vp);
    for (size_t k = 0; k < n; k++) {
        kvps__tensor_info *t = &w->tensors[ts[k]];
        if (kvps__op_has_values(op)) {
            t->st.pushes++;
            if (!kvps__fused_coded(t, op)) {
                t->st.push_raw_bytes += t->len * sizeof(float);
                t->st.push_wire_bytes += t->len * sizeof(float);
            }
        }
        if (kvps__op_pulls(op)) t->st.pulls++;
    }
    if (w->tl) kvps__tl_post(head, op, bytes, n);
    return kvps__chain_out(head, r, out);
}

KVPS_API kvps_result kvps_worker_push_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, const float *const *grads,
                                              kvps_req *out) {
    return kvps__tensors_op(w, KVPS__OP_PUSH, ts, n, grads, NULL, out);
}
KVPS_API kvps_result kvps_worker_pull_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, float *const *vals,
                                              kvps_req *out) {
    return kvps__tensors_op(w, KVPS__OP_PULL, ts, n, NULL, vals, out);
}
KVPS_API kvps_result kvps_worker_pushpull_tensors(kvps_worker *w, const kvps_tensor *ts, size_t n, const float *const *grads,
                                                  float *const *vals, kvps_req *out) {
    if (w && grads && vals && kvps__reads_on(w)) {
        kvps_req a = 0, b = 0;
        kvps_result r = kvps__tensors_op(w, KVPS__OP_PUSH, ts, n, grads, NULL, &a);
        if (r != KVPS_OK) return r;
        w->read_push = a;
        r = kvps__tensors_op(w, KVPS__OP_READ, ts, n, NULL, vals, &b);
        return kvps__read_behind(w, a, r, b, out);
    }
    return kvps__tensors_op(w, KVPS__OP_PUSHPULL, ts, n, grads, vals, out);
}
KVPS_API kvps_result kvps_worker_tensor_priority(kvps_worker *w, kvps_tensor t, int priority) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__TENSOR_OK(w, "tensor_priority", t);
    w->tensors[t].prio = priority;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_pull_tensor(kvps_worker *w, kvps_tensor t, float *vals, kvps_req *out) {
    return kvps__tensor_op(w, KVPS__OP_PULL, t, NULL, vals, NULL, out);
}
KVPS_API kvps_result kvps_worker_pushpull_tensor(kvps_worker *w, kvps_tensor t, const float *grad,
                                                 float *vals, kvps_req *out) {
    if (w && grad && vals && kvps__reads_on(w)) {
        kvps_req a = 0, b = 0;
        kvps_result r = kvps__tensor_op(w, KVPS__OP_PUSH, t, grad, NULL, NULL, &a);
        if (r != KVPS_OK) return r;
        w->read_push = a;
        r = kvps__tensor_op(w, KVPS__OP_READ, t, NULL, vals, NULL, &b);
        return kvps__read_behind(w, a, r, b, out);
    }
    return kvps__tensor_op(w, KVPS__OP_PUSHPULL, t, grad, vals, NULL, out);
}
KVPS_API kvps_result kvps_worker_init_tensor(kvps_worker *w, kvps_tensor t, const float *vals, kvps_req *out) {
    return kvps__tensor_op(w, KVPS__OP_INIT, t, vals, NULL, NULL, out);
}

KVPS_API void kvps_view_release(kvps_view **pv) {
    kvps_view *v = pv ? *pv : NULL;
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        zmq_msg_close(&v->part[i].msg);
        free(v->part[i].own);
    }
    free(v->part);
    free(v);
    *pv = NULL;
}

KVPS_API kvps_result kvps_worker_pull_tensor_view(kvps_worker *w, kvps_tensor t, kvps_view **view, kvps_req *out) {
    if (view) *view = NULL; /* NULL on any immediate error */
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "pull_tensor_view", view);
    KVPS__NEED(w, "pull_tensor_view", out);
    KVPS__TENSOR_OK(w, "pull_tensor_view", t);
    kvps_view *v = (kvps_view *)calloc(1, sizeof *v);
    size_t n = w->tensors[t].nslices;
    if (!v || !(v->part = (kvps__vpart *)calloc(n, sizeof *v->part))) {
        free(v);
        return kvps__wfail(w, KVPS_ERR_NOMEM, "pull of tensor '%s': out of memory for its view", w->tensors[t].name);
    }
    v->n = n;
    for (size_t i = 0; i < n; i++) zmq_msg_init(&v->part[i].msg);
    kvps_result r = kvps__tensor_op(w, KVPS__OP_PULL, t, NULL, NULL, v, out);
    if (r != KVPS_OK) kvps_view_release(&v);
    *view = v;
    return r;
}

KVPS_API size_t kvps_view_parts(const kvps_view *v) { return v ? v->n : 0; }

KVPS_API const float *kvps_view_part(const kvps_view *v, size_t i, size_t *offset, size_t *len) {
    if (!v || i >= v->n) { if (offset) *offset = 0; if (len) *len = 0; return NULL; }
    if (offset) *offset = (size_t)v->part[i].off;
    if (len) *len = (size_t)v->part[i].len;
    return v->part[i].data;
}

KVPS_API kvps_result kvps_worker_tensor_codec(kvps_worker *w, kvps_tensor ti, const kvps_codec *push,
                                              const kvps_codec *pull, int error_feedback) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__TENSOR_OK(w, "tensor_codec", ti);
    kvps__tensor_info *t = &w->tensors[ti];
    const char *bad = push && (!push->encode || !push->max_bytes)     ? "push codec has no encode or max_bytes function"
                      : pull && !pull->decode                          ? "pull codec has no decode function"
                      : pull && kvps__codec_info(pull->id) && !kvps__codec_info(pull->id)->dense
                          ? "pull codec is sparse (top-k): a pull needs every value"
                      : push && (push->id < 0 || push->id > 255)       ? "push codec id is not 0-255"
                      : pull && (pull->id < 0 || pull->id > 255)       ? "pull codec id is not 0-255"
                      : (unsigned)error_feedback > 1                   ? "error_feedback is not 0 or 1"
                                                                       : NULL;
    if (bad) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "tensor_codec of tensor '%s': %s", t->name, bad);
    float **resid = NULL;
    if (push && error_feedback) {
        resid = (float **)calloc(t->nslices, sizeof *resid);
        for (uint32_t i = 0; resid && i < t->nslices; i++) {
            resid[i] = (float *)calloc((size_t)t->slen[i], sizeof(float));
            if (!resid[i]) { for (uint32_t j = 0; j < i; j++) free(resid[j]); free(resid); resid = NULL; }
        }
        if (!resid) return kvps__wfail(w, KVPS_ERR_NOMEM, "tensor_codec of tensor '%s': out of memory for residuals", t->name);
    }
    for (uint32_t i = 0; t->resid && i < t->nslices; i++) free(t->resid[i]);
    free(t->resid);
    t->resid = resid;
    t->has_push = push != NULL;
    t->has_pull = pull != NULL;
    if (push) t->push_c = *push;
    if (pull) t->pull_c = *pull;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_tensor_optim(kvps_worker *w, kvps_tensor ti, const kvps_optim *o, kvps_req *out) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "tensor_optim", o);
    KVPS__NEED(w, "tensor_optim", out);
    *out = 0;
    KVPS__TENSOR_OK(w, "tensor_optim", ti);
    unsigned char rec[KVPS__OPTREC];
    kvps__optim_rec(o, rec);
    kvps_optim chk;
    kvps_result r = kvps__optim_read(rec, &chk); /* the servers check too (and that they have a user rule); fail early here */
    if (r != KVPS_OK)
        return kvps__optim_fail(w, "tensor_optim of tensor '%s'", w->tensors[ti].name, o, &chk, r);
    kvps__tensor_info *t = &w->tensors[ti];
    kvps__req *head = NULL, *last = NULL;
    for (uint32_t i0 = 0, i1; i0 < t->nslices && r == KVPS_OK; i0 = i1) {
        i1 = kvps__round_end(w, t, i0);
        kvps__req *q = kvps__req_new(w, 0);
        if (!q) { r = KVPS_ERR_NOMEM; break; }
        for (uint32_t i = i0; i < i1 && r == KVPS_OK; i++) {
            kvps__hdr h = kvps__req_hdr(w, q, KVPS__OP_CONFIG, 1);
            h.status = (int32_t)w->incarnation; /* exactly once, and kept to be re-sent (FAULTS) */
            kvps__kent e = {t->keys[i], t->slen[i]};
            zmq_msg_t f2[2];
            unsigned char meta[KVPS__HDR + KVPS__KENT];
            memcpy(meta, &h, sizeof h);
            memcpy(meta + KVPS__HDR, &e, sizeof e);
            if (kvps__msg_from_buf(&f2[0], meta, sizeof meta) != 0) { r = KVPS_ERR_NOMEM; break; }
            if (kvps__msg_from_buf(&f2[1], rec, sizeof rec) != 0) { zmq_msg_close(&f2[0]); r = KVPS_ERR_NOMEM; break; }
            r = kvps__keep_send(w, q, t->server[i], KVPS__OP_CONFIG, f2, 2);
        }
        r = kvps__chain_link(w, &head, &last, q, r);
    }
    return kvps__chain_out(head, r, out);
}

KVPS_API kvps_result kvps_worker_easgd(kvps_worker *w, kvps_tensor t, float *local, float alpha, int timeout_ms) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "easgd", local);
    if (!(alpha > 0.0f && alpha < 1.0f)) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "easgd: alpha %g is not in (0, 1)", (double)alpha);
    KVPS__TENSOR_OK(w, "easgd", t);
    size_t n = (size_t)w->tensors[t].len;
    float *c = (float *)malloc(n * sizeof *c);
    if (!c) return kvps__wfail(w, KVPS_ERR_NOMEM, "easgd of tensor '%s': out of memory", w->tensors[t].name);
    kvps_req q;
    kvps_result r = kvps_worker_pull_tensor(w, t, c, &q);
    if (r == KVPS_OK) r = kvps_worker_wait(w, q, timeout_ms);
    if (r == KVPS_OK) {
        for (size_t i = 0; i < n; i++) c[i] = alpha * (local[i] - c[i]); /* the elastic difference */
        r = kvps_worker_push_tensor(w, t, c, &q);
        if (r == KVPS_OK) r = kvps_worker_wait(w, q, timeout_ms);
        if (r == KVPS_OK)
            for (size_t i = 0; i < n; i++) local[i] -= c[i];
    }
    free(c);
    return r;
}

KVPS_API kvps_result kvps_worker_tensor_stats(const kvps_worker *w, kvps_tensor t, kvps_tensor_stats *out) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "tensor_stats", out);
    KVPS__TENSOR_OK(w, "tensor_stats", t);
    *out = w->tensors[t].st;
    return KVPS_OK;
}

// >>rows
static int kvps__row_server(const kvps_worker *w, uint64_t table, uint64_t id) {
    return (int)w->vmap[kvps__row_vshard(table, id, w->V)];
}

/* One table message to server srv: meta (+ ids) and optional values. */
static kvps_result kvps__send_table(kvps_worker *w, kvps__req *q, int srv, int op, uint64_t table, uint32_t dim,
                                    const uint64_t *ids, uint32_t nrows, const void *vals, size_t vbytes) {
    kvps__hdr h = kvps__req_hdr(w, q, op, nrows);
    h.status = (int32_t)w->incarnation; /* exactly once, and kept to be re-sent (FAULTS) */
    zmq_msg_t f[2];
    if (zmq_msg_init_size(&f[0], KVPS__HDR + 16 + (size_t)nrows * 8) != 0)
        return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory for %u rows", kvps__ops[op].name, srv, nrows);
    unsigned char *m = (unsigned char *)zmq_msg_data(&f[0]);
    uint32_t zero = 0;
    memcpy(m, &h, sizeof h);
    memcpy(m + KVPS__HDR, &table, 8);
    memcpy(m + KVPS__HDR + 8, &dim, 4);
    memcpy(m + KVPS__HDR + 12, &zero, 4);
    if (nrows) memcpy(m + KVPS__HDR + 16, ids, (size_t)nrows * 8);
    int nf = 1;
    if (vals) {
        if (kvps__msg_from_buf(&f[1], vals, vbytes) != 0) {
            zmq_msg_close(&f[0]);
            return kvps__wfail(w, KVPS_ERR_NOMEM, "%s to server %d: out of memory for %zu bytes", kvps__ops[op].name, srv, vbytes);
        }
        nf = 2;
    }
    return kvps__keep_send(w, q, srv, op, f, nf);
}

KVPS_API kvps_result kvps_worker_table(kvps_worker *w, const kvps_table_desc *d, kvps_table *out, kvps_req *req) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "table", d);
    KVPS__NEED(w, "table", out);
    KVPS__NEED(w, "table", req);
    if (!d->name || !*d->name) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "table: the desc has no name");
    if (d->dim == 0 || d->dim > (1u << 20))
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "table '%s': dim %u is not 1 to 2^20", d->name, d->dim);
    if (!(d->init_scale >= 0.0f && d->init_scale < 1e30f))
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "table '%s': init_scale %g is not >= 0 and finite", d->name, (double)d->init_scale);
    *req = 0;
    kvps_result pr = kvps__place_ready(w); /* (rows are placed by vmap) */
    if (pr != KVPS_OK) return pr;
    unsigned char rec[KVPS__TREC];
    kvps__optim_rec(&d->opt, rec);
    memcpy(rec + KVPS__OPTREC, &d->init_scale, 4);
    memcpy(rec + KVPS__OPTREC + 4, &d->seed, 8);
    kvps_optim chk;
    kvps_result r = kvps__optim_read(rec, &chk);
    if (r != KVPS_OK) return kvps__optim_fail(w, "table '%s'", d->name, &d->opt, &chk, r);
    if (kvps__rule_row_of(chk.rule)->steps)
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "table '%s': rule %d counts a key's steps (AdamW, user rules), which sparse "
                           "rows do not keep", d->name, (int)chk.rule);
    uint64_t id = kvps__fnv1a(d->name);
    for (int i = 0; i < w->ntables; i++)
        if (w->tables[i].id == id) return kvps__wfail(w, KVPS_ERR_TABLE, "table '%s': registered twice on this worker", d->name);
    void *nt = realloc(w->tables, (size_t)(w->ntables + 1) * sizeof *w->tables);
    if (!nt) return kvps__wfail(w, KVPS_ERR_NOMEM, "table '%s': out of memory", d->name);
    memcpy(&w->tables, &nt, sizeof nt);
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    for (int s = 0; s < w->n && r == KVPS_OK; s++)
        r = kvps__send_table(w, q, s, KVPS__OP_TABLE, id, d->dim, NULL, 0, rec, sizeof rec);
    if (r != KVPS_OK && q->pending == 0) { kvps__req_end(w, q); return r; }
    if (r != KVPS_OK) q->status = r;
    w->tables[w->ntables].id = id;
    w->tables[w->ntables].dim = d->dim;
    *out = w->ntables++;
    *req = q->id;
    return KVPS_OK;
}

typedef struct kvps__rowref { uint64_t id; uint32_t pos, srv; } kvps__rowref;
static int kvps__cmp_rowref(const void *a, const void *b) {
    const kvps__rowref *x = (const kvps__rowref *)a, *y = (const kvps__rowref *)b;
    if (x->srv != y->srv) return x->srv < y->srv ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Rows grouped by server, then id, then position: duplicates side by side, first one first. */
static kvps__rowref *kvps__rows_sorted(const kvps_worker *w, uint64_t table, const uint64_t *ids, size_t n) {
    kvps__rowref *v = (kvps__rowref *)malloc(n * sizeof *v);
    if (!v) return NULL;
    for (size_t i = 0; i < n; i++) { v[i].id = ids[i]; v[i].pos = (uint32_t)i; v[i].srv = (uint32_t)kvps__row_server(w, table, ids[i]); }
    qsort(v, n, sizeof *v, kvps__cmp_rowref);
    return v;
}

static kvps_result kvps__rows_op(kvps_worker *w, int op, kvps_table ti, const uint64_t *ids, const float *grads, float *rows,
                                 size_t nrows, kvps_req *out) {
    const char *call = kvps__ops[op].name;
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, call, ids);
    KVPS__NEED(w, call, out);
    if (op == KVPS__OP_PUSH_ROWS) KVPS__NEED(w, call, grads);
    else KVPS__NEED(w, call, rows);
    if (nrows == 0 || nrows >= UINT32_MAX) return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "%s: nrows is %zu (1 to 2^32 - 2)", call, nrows);
    *out = 0;
    if (ti < 0 || ti >= w->ntables)
        return kvps__wfail(w, KVPS_ERR_TABLE, "%s: table %d is not registered (this worker has %d)", call, (int)ti, w->ntables);
    uint64_t table = w->tables[ti].id;
    uint32_t dim = w->tables[ti].dim;
    kvps__rowref *v = kvps__rows_sorted(w, table, ids, nrows);
    uint64_t *uid = (uint64_t *)malloc(nrows * sizeof *uid);
    float *vals = op == KVPS__OP_PUSH_ROWS ? (float *)malloc(nrows * dim * sizeof(float)) : NULL;
    kvps__req *q = v && uid && (vals || op != KVPS__OP_PUSH_ROWS) ? kvps__req_new(w, op == KVPS__OP_PULL_ROWS ? nrows : 0) : NULL;
    kvps_result r = q ? KVPS_OK : KVPS_ERR_NOMEM;
    if (q && op == KVPS__OP_PULL_ROWS) {
        q->dups = (uint32_t *)malloc(nrows * 2 * sizeof *q->dups);
        if (!q->dups) r = KVPS_ERR_NOMEM;
        q->dup_base = rows;
        q->dup_dim = dim;
    }
    size_t i = 0, nu = 0;
    while (r == KVPS_OK && i < nrows) {
        uint32_t srv = v[i].srv;
        size_t first = nu;
        q->dbegin[srv] = (uint32_t)nu;
        while (i < nrows && v[i].srv == srv) {
            size_t j = i; /* the run of one id */
            uid[nu] = v[i].id;
            if (vals) memcpy(vals + nu * dim, grads + (size_t)v[i].pos * dim, dim * sizeof(float));
            if (q->dest) { q->dest[nu].ptr = rows + (size_t)v[i].pos * dim; q->dest[nu].len = dim; }
            for (j = i + 1; j < nrows && v[j].id == v[i].id && v[j].srv == srv; j++) {
                if (vals) kvps__add(vals + nu * dim, grads + (size_t)v[j].pos * dim, dim);
                if (q->dups) { q->dups[2 * q->ndups] = v[i].pos; q->dups[2 * q->ndups + 1] = v[j].pos; q->ndups++; }
            }
            nu++;
            i = j;
        }
        r = kvps__send_table(w, q, (int)srv, op, table, dim, uid + first, (uint32_t)(nu - first), vals ? vals + first * dim : NULL,
                             (nu - first) * dim * sizeof(float));
    }
    /* dbegin[s + 1] must bound server s's rows for the reply scatter: fill the gaps */
    if (q) {
        q->dbegin[w->n] = (uint32_t)nu;
        for (int s2 = w->n - 1; s2 >= 0; s2--)
            if (q->state[s2] == KVPS__RS_NONE) q->dbegin[s2] = q->dbegin[s2 + 1];
    }
    free(v);
    free(uid);
    free(vals);
    if (!q) return r;
    if (r != KVPS_OK && q->pending == 0) { kvps__req_end(w, q); return r; }
    if (r != KVPS_OK) q->status = r;
    if (w->tl) kvps__tl_post(q, op, (uint64_t)nrows * dim * sizeof(float), nrows);
    *out = q->id;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_worker_push_rows(kvps_worker *w, kvps_table t, const uint64_t *ids, const float *grads, size_t nrows,
                                           kvps_req *out) {
    return kvps__rows_op(w, KVPS__OP_PUSH_ROWS, t, ids, grads, NULL, nrows, out);
}
KVPS_API kvps_result kvps_worker_pull_rows(kvps_worker *w, kvps_table t, const uint64_t *ids, float *rows, size_t nrows,
                                           kvps_req *out) {
    return kvps__rows_op(w, KVPS__OP_PULL_ROWS, t, ids, NULL, rows, nrows, out);
}

KVPS_API kvps_result kvps_worker_barrier(kvps_worker *w, kvps_req *out) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "barrier", out);
    *out = 0;
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    kvps_result r = kvps__send_ctl(w, q, 0, KVPS__OP_BARRIER, NULL, 0);
    if (r != KVPS_OK) { kvps__req_end(w, q); return r; }
    if (w->tl) kvps__tl_post(q, KVPS__OP_BARRIER, 0, 0);
    *out = q->id;
    return KVPS_OK;
}

static const char *const kvps__scalar_op_names[KVPS_SCALAR_OP_COUNT] = {"sum", "mean", "min", "max"};
KVPS_API const char *kvps_scalar_op_name(kvps_scalar_op op) {
    return (unsigned)op < KVPS_SCALAR_OP_COUNT ? kvps__scalar_op_names[op] : "?";
}

KVPS_API kvps_result kvps_worker_allreduce_scalar(kvps_worker *w, double *x, kvps_scalar_op op) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "allreduce_scalar", x);
    if ((unsigned)op >= KVPS_SCALAR_OP_COUNT)
        return kvps__wfail(w, KVPS_ERR_INVALID_ARG, "allreduce_scalar: op %d is not a kvps_scalar_op", (int)op);
    kvps__req *q = kvps__req_new(w, 1);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    q->dest[0].ptr = (float *)(void *)x; /* (8 bytes: the reply's f64, copied as they are) */
    q->dest[0].len = sizeof *x / sizeof(float);
    for (int i = 1; i <= w->n; i++) q->dbegin[i] = 1; /* server 0 answers dest[0] */
    unsigned char v[16] = {0};
    memcpy(v, x, 8);
    kvps__put32(v + 8, (uint32_t)op);
    kvps_result r = kvps__send_ctl(w, q, 0, KVPS__OP_ALLREDUCE, v, sizeof v);
    if (r != KVPS_OK) { kvps__req_end(w, q); return r; }
    return kvps_worker_wait(w, q->id, -1);
}

KVPS_API kvps_result kvps_worker_join(kvps_worker *w) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    kvps__req *q = kvps__req_new(w, 0);
    if (!q) return kvps__wfail(w, KVPS_ERR_NOMEM, "out of memory for a new request (or too many in flight)");
    kvps_result r = KVPS_OK;
    for (int i = 0; i < w->n && r == KVPS_OK; i++) r = kvps__send_ctl(w, q, i, KVPS__OP_JOIN, NULL, 0);
    if (r != KVPS_OK) { kvps__req_end(w, q); return r; }
    return kvps_worker_wait(w, q->id, -1);
}

// >>progress
/* Handles one reply from server srv. Replies are checked: a broken server cannot crash us. */
/* An error reply's text, as the worker's last error: "server i: text". */

/* A server's error text into last_error; for a tensor request it names the tensor too (the
   server knows only slice keys). */
static void kvps__reply_text(kvps_worker *w, const kvps__req *q, int srv, zmq_msg_t *fr, int nfr) {
    char text[256];
    kvps__frame_text(fr, nfr, text, sizeof text);
    if (q->tensor)
        snprintf(w->errmsg, sizeof w->errmsg, "tensor '%s': server %d: %s", w->tensors[q->tensor - 1].name, srv, text);
    else
        snprintf(w->errmsg, sizeof w->errmsg, "server %d: %s", srv, text);
}

/* The answer to one of the worker's own requests. A refused hello makes every later wait fail
   with the server's words (both values named); a refused tensor name, that tensor's calls. */
static void kvps__on_ctl_reply(kvps_worker *w, kvps__req *q, int srv, const kvps__hdr *h, zmq_msg_t *fr, int nfr) {
    q->state[srv] = KVPS__RS_DONE;
    kvps__req_drop_kept(q, srv);
    if (q->ctl == KVPS__OP_HELLO) {
        w->hellos_heard++;
        if (h->status == KVPS_OK) w->rp[srv].hello_ok = 1;
        if (h->status == KVPS_OK && nfr > 1) kvps__place_heard(w, srv, &fr[1]);
    }
    if (h->status < 0) {
        char text[256];
        kvps__frame_text(fr, nfr, text, sizeof text);
        if (q->ctl == KVPS__OP_HELLO && !w->fatal) {
            kvps__wfatal(w, (kvps_result)h->status, "server %d (%s) refused this worker: %s", srv, kvps__ep(w, srv), text);
        } else if (q->ctl == KVPS__OP_NAME && q->tensor && !w->tensors[q->tensor - 1].bad) {
            kvps__tensor_info *t = &w->tensors[q->tensor - 1];
            t->bad = (kvps_result)h->status;
            size_t tn = strlen(text) + 64;
            if ((t->bad_text = (char *)malloc(tn)) != NULL) snprintf(t->bad_text, tn, "server %d: %s", srv, text);
            kvps__log(KVPS_LOG_ERROR, "worker %d: server %d: %s", w->desc.rank, srv, text);
        }
        if (q->status == KVPS_OK) q->status = (kvps_result)h->status;
    }
    if (h->status == KVPS_OK && q->ctl >= KVPS__OP_KEYS) { /* a reshard's: its answer is read after the wait */
        zmq_msg_close(&w->ctl_reply);
        zmq_msg_init(&w->ctl_reply);
        if (nfr > 1) zmq_msg_move(&w->ctl_reply, &fr[1]);
    } else if (h->status < 0 && q->ctl >= KVPS__OP_KEYS) {
        char text[256];
        kvps__frame_text(fr, nfr, text, sizeof text);
        snprintf(w->errmsg, sizeof w->errmsg, "reshard: server %d (%s): %s", srv, kvps__ep(w, srv), text);
    }
    if (q->pending == 0 && q->ctl != KVPS__OP_BYE && q->ctl < KVPS__OP_KEYS)
        kvps__req_end(w, q); /* (finish waits for its BYE itself, a reshard for its requests) */
}

static void kvps__failover(kvps_worker *w, int s, const char *why);
/* KVPS_ERR_NOT_PRIMARY from a replica (REPLICAS): a read replica that cannot answer a READ yet
   (or ever), or a backup whose primary is alive: the request goes elsewhere. 1 when it was that. */
static int kvps__on_not_primary(kvps_worker *w, kvps__req *q, int srv, const kvps__hdr *h, zmq_msg_t *fr, int nfr) {
    if (h->status == KVPS_ERR_NOT_PRIMARY && h->op == (KVPS__OP_READ | KVPS__OP_REPLY)) { /* the read replica cannot tell */
        if (h->aux == 1 && w->rnever && !w->rnever[srv]) { /* nor ever will: not BSP with replicas */
            w->rnever[srv] = 1;
            char text[256];
            kvps__frame_text(fr, nfr, text, sizeof text);
            kvps__log(KVPS_LOG_WARN, "worker %d: shard %d: pushpulls read from its primary: %s", w->desc.rank, srv, text);
        }
        if (q->read && !kvps__read_pushed(w, q, srv)) q->rwait[srv] = 1; /* a pull, once the push is answered */
        else if (q->read && kvps__read_send(w, q, srv, 1) != 0) /* a pull, to the shard's server */
            kvps__log(KVPS_LOG_WARN, "worker %d: re-send to server %d: %s", w->desc.rank, srv, zmq_strerror(zmq_errno()));
        return 1;
    }
    if (h->status == KVPS_ERR_NOT_PRIMARY && w->nrep[srv] > 1) { /* a backup: this request goes to the next replica */
        if (h->aux == (uint32_t)w->cur[srv])
            kvps__failover(w, srv, "is a backup whose primary is alive, or does not hold the shard yet");
        return 1;
    }
    return 0;
}

/* A coded pull's answer (per key [u32 bytes][blob]) decoded into q's destinations b..e-1. */
static void kvps__reply_coded(kvps_worker *w, kvps__req *q, int srv, zmq_msg_t *fr, int nfr, kvps__tensor_info *tn, uint32_t b,
                              uint32_t e) {
    kvps__blobs it = {NULL, 0, 0};
    if (nfr > 1) it = kvps__blobs_of(&fr[1]);
    kvps_result dr = KVPS_OK;
    for (uint32_t j = b; j < e && dr == KVPS_OK; j++) {
        const unsigned char *blob;
        uint32_t nb;
        if (kvps__blob_next(&it, &blob, &nb) != 1) { dr = KVPS_ERR_TRUNCATED; break; }
        dr = kvps_codec_decode(&q->pull_c, blob, nb, q->dest[j].ptr, (size_t)q->dest[j].len, 0);
        if (tn) tn->st.pull_raw_bytes += q->dest[j].len * sizeof(float);
    }
    if (dr == KVPS_OK && it.off != it.size) dr = KVPS_ERR_MALFORMED;
    if (tn) tn->st.pull_wire_bytes += it.size;
    if (dr != KVPS_OK) {
        snprintf(w->errmsg, sizeof w->errmsg, "server %d: bad coded pull reply: %s", srv, kvps_result_str(dr));
        if (q->status == KVPS_OK) q->status = dr == KVPS_ERR_TRUNCATED ? KVPS_ERR_TRUNCATED : KVPS_ERR_MALFORMED;
    }
}

/* A successful answer's values into q's destinations (or its view) for server srv's keys. */
static void kvps__reply_values(kvps_worker *w, kvps__req *q, int srv, zmq_msg_t *fr, int nfr, kvps__tensor_info *tn) {
    if (!q->dest) return;
    uint32_t b, e;
    if (q->dbegin[w->n] == UINT32_MAX) { b = q->dbegin[srv]; e = b + 1; }
    else { b = q->dbegin[srv]; e = q->dbegin[srv + 1]; }
    if (q->coded_pull) {
        kvps__reply_coded(w, q, srv, fr, nfr, tn, b, e);
        return;
    }
    uint64_t total = 0;
    for (uint32_t j = b; j < e; j++) total += q->dest[j].len;
    if (nfr < 2 || zmq_msg_size(&fr[1]) != total * sizeof(float)) {
        snprintf(w->errmsg, sizeof w->errmsg, "server %d: pull reply of %zu bytes, expected %llu", srv,
                 nfr < 2 ? (size_t)0 : zmq_msg_size(&fr[1]), (unsigned long long)(total * sizeof(float)));
        if (q->status == KVPS_OK) q->status = KVPS_ERR_MALFORMED;
        return;
    }
    const char *src = (const char *)zmq_msg_data(&fr[1]);
    if (q->view) { /* one slice per reply: keep the message; realign in the rare case it needs it */
        kvps__vpart *p = &q->view->part[q->vbase + b];
        if (((uintptr_t)src & (sizeof(float) - 1)) == 0 || total == 0) {
            zmq_msg_move(&p->msg, &fr[1]);
            p->data = (const float *)zmq_msg_data(&p->msg);
        } else if ((p->own = (float *)kvps__alloc_floats(total)) != NULL) {
            memcpy(p->own, src, (size_t)total * sizeof(float));
            p->data = p->own;
        } else if (q->status == KVPS_OK) {
            q->status = KVPS_ERR_NOMEM;
        }
    }
    for (uint32_t j = b; j < e && !q->view; j++) {
        memcpy(q->dest[j].ptr, src, (size_t)q->dest[j].len * sizeof(float));
        src += q->dest[j].len * sizeof(float);
    }
    if (tn) {
        tn->st.pull_raw_bytes += total * sizeof(float);
        tn->st.pull_wire_bytes += total * sizeof(float);
    }
}

static void kvps__on_reply(kvps_worker *w, int srv, zmq_msg_t *fr, int nfr) {
    kvps__hdr h;
    if (zmq_msg_size(&fr[0]) < sizeof h) {
        kvps__log(KVPS_LOG_WARN, "worker %d: short reply from server %d dropped", w->desc.rank, srv);
        return;
    }
    memcpy(&h, zmq_msg_data(&fr[0]), sizeof h);
    if (h.magic == KVPS__MAGIC && h.op == (KVPS__OP_STATUS | KVPS__OP_REPLY)) { /* what a request waits for */
        kvps__frame_text(fr, nfr, w->status_text[srv], sizeof w->status_text[srv]);
        w->status_got[srv] = 1;
        return;
    }
    if (h.magic == KVPS__MAGIC && h.status == KVPS_OK && h.op != (KVPS__OP_READ | KVPS__OP_REPLY))
        kvps__stamp_heard(w, srv, h.aux); /* (any reply of the server's: one to a request sent again too) */
    kvps__req *q = h.magic == KVPS__MAGIC ? kvps__req_get(w, h.req_id) : NULL;
    if (!q || q->state[srv] != KVPS__RS_SENT) { /* stale, unknown, or a second reply from the same server */
        kvps__log(KVPS_LOG_DEBUG, "worker %d: reply for unknown request %llu dropped", w->desc.rank,
                  (unsigned long long)h.req_id);
        return;
    }
    if (h.status == KVPS_ERR_NOT_PRIMARY && kvps__on_not_primary(w, q, srv, &h, fr, nfr)) return;
    q->pending--;
    kvps__credit_back(w, q, srv);
    if (q->ctl) {
        kvps__on_ctl_reply(w, q, srv, &h, fr, nfr);
        return;
    }
    kvps__tensor_info *tn = q->tensor ? &w->tensors[q->tensor - 1] : NULL;
    if (h.status == KVPS_ERR_PEER_LOST && q->nkept[srv]) {
        /* the server is fine but cannot complete the pull or barrier yet: a worker it waits for
           is lost. What the request pushed is applied and stays so (the server keeps it in its
           re-send window): keep the frames, so that waiting again re-sends the same request
           and gets the rest, with no push applied twice */
        q->state[srv] = KVPS__RS_LOST;
        q->lost++;
        q->lost_at = kvps__now_ms();
        kvps__reply_text(w, q, srv, fr, nfr);
        if (w->rsocks && !q->read) kvps__reads_release(w, q, srv); /* (the push is applied) */
        return;
    }
    q->state[srv] = KVPS__RS_DONE;
    if (h.status == KVPS_OK) kvps__req_answered(w, q, srv, h.aux); /* kept for a restore, or let go */
    else kvps__req_drop_kept(q, srv);
    if (w->rsocks && !q->read) kvps__reads_release(w, q, srv); /* READs refused before this answer */
    if (h.status > 0) { /* not a kvps_result: a broken server */
        snprintf(w->errmsg, sizeof w->errmsg, "server %d: reply with invalid status %d", srv, h.status);
        if (q->status == KVPS_OK) q->status = KVPS_ERR_MALFORMED;
        return;
    }
    if (h.status != KVPS_OK) {
        kvps__reply_text(w, q, srv, fr, nfr);
        if (q->status == KVPS_OK) q->status = (kvps_result)h.status;
        return;
    }
    kvps__reply_values(w, q, srv, fr, nfr, tn);
}


/* Sends the kept frames of q's message to server srv again (references, not copies). */
static int kvps__send_kept(kvps_worker *w, kvps__req *q, int srv) {
    return q->read ? kvps__read_send(w, q, srv, 0) : kvps__send_copies(w->socks[srv], q, srv);
}

/* Re-sends, in the order first sent, every request still waiting for server srv (after its
   connection came back: what was in flight is lost; the server drops what it already has).
   A server that had accepted this worker's hello first gets the hello again, and, behind it and
   in the same order, every request it answered that its checkpoints may not hold yet (kvps__replay)
   and the parts answered KVPS_ERR_PEER_LOST, whose pushes were applied: a server restored from its
   checkpoint serves this worker only from its hello on, so it takes the worker's requests in the
   order they were made, and applies each once (FAULTS, checkpoints). */
typedef struct kvps__resent { uint64_t id; kvps__req *q; kvps__rent *e; } kvps__resent;
static int kvps__cmp_resent(const void *a, const void *b) {
    uint64_t x = ((const kvps__resent *)a)->id >> KVPS__SLOT_BITS, y = ((const kvps__resent *)b)->id >> KVPS__SLOT_BITS;
    return (x > y) - (x < y);
}
static void kvps__resend(kvps_worker *w, int srv) {
    kvps__replay *p = &w->rp[srv];
    int again = p->hello_ok && !w->finished, ck = again && p->heard;
    size_t n = ck ? p->n : 0;
    for (uint32_t i = 0; i < w->nslots; i++) {
        kvps__req *q = w->slots[i];
        if (q && q->nkept[srv] && (q->state[srv] == KVPS__RS_SENT || (ck && q->state[srv] == KVPS__RS_LOST)) && !(q->queued && q->queued[srv]))
            n++; /* (a queued one goes when credit allows) */
    }
    kvps__resent *v = n ? (kvps__resent *)malloc(n * sizeof *v) : NULL;
    if (n && !v) return; /* those requests time out instead */
    n = 0;
    for (uint32_t i = 0; i < w->nslots; i++) {
        kvps__req *q = w->slots[i];
        if (q && q->nkept[srv] && (q->state[srv] == KVPS__RS_SENT || (ck && q->state[srv] == KVPS__RS_LOST)) && !(q->queued && q->queued[srv])) {
            kvps__resent r = {q->id, q, NULL};
            v[n++] = r;
        }
    }
    size_t nl = 0;
    for (size_t i = 0; ck && i < p->n; i++, nl++) {
        kvps__resent r = {p->e[i].id, NULL, &p->e[i]};
        v[n++] = r;
    }
    if (again && kvps__hello_to(w, srv, srv + 1, 1) != KVPS_OK)
        kvps__log(KVPS_LOG_WARN, "worker %d: hello to server %d: %s", w->desc.rank, srv, w->errmsg);
    if (n) qsort(v, n, sizeof *v, kvps__cmp_resent);
    for (size_t i = 0; i < n; i++) {
        int rc;
        if (v[i].q) rc = kvps__send_kept(w, v[i].q, srv);
        else {
            zmq_msg_t f[2];
            for (int j = 0; j < v[i].e->nf; j++) {
                zmq_msg_init(&f[j]);
                zmq_msg_copy(&f[j], &v[i].e->f[j]);
            }
            rc = kvps__send_frames(w->socks[srv], f, v[i].e->nf);
        }
        if (rc != 0) break;
    }
    if (n)
        kvps__log(KVPS_LOG_INFO, "worker %d: server %d is back; %zu requests re-sent (%zu of them answered before, which its "
                  "checkpoint may not hold)", w->desc.rank, srv, n, nl);
    free(v);
}

/* Why a server's handshakes fail: it refused our CURVE key (ZAP), the two sides speak other
   security mechanisms or break the protocol, or the connection was cut during the handshake
   KVPS__HS_CUTS times in a row (once is a network or restart event: ZeroMQ reconnects; again
   and again, with CURVE, is what a wrong server key looks like: the server drops us). */
enum { KVPS__HS_NONE, KVPS__HS_AUTH, KVPS__HS_PROTOCOL, KVPS__HS_CUT };
enum { KVPS__HS_CUTS = 3 };

/* What the failing handshakes with server s mean, in words. */
static void kvps__hs_text(const kvps_worker *w, int s, char *buf, size_t n) {
    int32_t v = w->hs_val[s];
    const char *ep = kvps__ep(w, s);
    if (w->refused[s] == KVPS__HS_AUTH)
        snprintf(buf, n, "server %d (%s) refused our CURVE key (ZAP status %d): our public key must be in its curve_clients", s,
                 ep, (int)v);
    else if (w->refused[s] == KVPS__HS_PROTOCOL && v == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        snprintf(buf, n, "server %d (%s) and this worker use different security: one of them has CURVE keys "
                 "(curve_server_keys here, curve_secret_key there) and the other not", s, ep);
    else if (w->refused[s] == KVPS__HS_PROTOCOL)
        snprintf(buf, n, "the handshake with server %d (%s) failed: ZMTP protocol error 0x%x (is it a kvps server, of "
                 "this version?)", s, ep, (unsigned)v);
    else
        snprintf(buf, n, "server %d (%s) closed the connection during the handshake %u times in a row (%s)%s", s, ep,
                 (unsigned)w->hs_cuts[s], zmq_strerror((int)v),
                 w->curve ? ": check curve_server_keys (with a wrong server key it drops us)"
                          : ": if it has CURVE keys, the two sides use different security (a CURVE server drops a "
                            "plaintext worker before it can say why, when the machine is busy): give this worker "
                            "curve_server_keys and a key pair");
}

/* REPLICAS: shard s's current replica is unreachable or a backup: this worker moves to the next
   one (round the chain); what is in flight there goes again once it connects. */
static void kvps__failover(kvps_worker *w, int s, const char *why) {
    int from = w->cur[s];
    zmq_disconnect(w->socks[s], kvps__ep(w, s));
    w->cur[s] = (from + 1) % w->nrep[s];
    w->rp[s].reset = 1; /* the next replica's checkpoint stamps count apart (kvps__stamp_heard) */
    w->rp[s].heard = 0;
    kvps__log(KVPS_LOG_WARN, "worker %d: shard %d replica %d (%s) %s; moving to replica %d (%s)", w->desc.rank, s, from,
              w->reps[s][from], why, w->cur[s], kvps__ep(w, s));
    w->down[s] = 1;
    w->down_since[s] = kvps__now_ms();
    w->hs_cuts[s] = 0;
    w->refused[s] = KVPS__HS_NONE;
    if (zmq_connect(w->socks[s], kvps__ep(w, s)) != 0)
        kvps__log(KVPS_LOG_ERROR, "worker %d: cannot connect to '%s': %s", w->desc.rank, kvps__ep(w, s), zmq_strerror(zmq_errno()));
    else if (strncmp(kvps__ep(w, s), "inproc://", 9) == 0) { /* no handshake events there */
        w->down[s] = 0;
        kvps__resend(w, s);
    }
}

/* Connection events: a drop marks the server down; its return re-sends what was in flight. */
static void kvps__watch(kvps_worker *w) {
    for (int s = 0; w->rmons && s < w->n; s++) { /* read replicas: up, or gone (their READs go to the primary) */
        uint16_t ev = 0;
        int32_t val = 0;
        while (w->rmons[s] && kvps__monitor_event(w->rmons[s], &ev, &val)) {
            if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) w->rup[s] = 1;
            else if (ev == ZMQ_EVENT_DISCONNECTED && w->rup[s]) {
                w->rup[s] = 0;
                if (!w->finished)
                    kvps__log(KVPS_LOG_WARN, "worker %d: shard %d's read replica %d (%s) is gone; reading from its primary",
                              w->desc.rank, s, w->rj[s], w->reps[s][w->rj[s]]);
                kvps__reads_reroute(w, s);
            }
        }
    }
    for (int s = 0; s < w->n; s++) {
        uint16_t ev = 0;
        int32_t val = 0;
        while (w->mons[s] && kvps__monitor_event(w->mons[s], &ev, &val)) {
            if (ev == ZMQ_EVENT_DISCONNECTED) {
                if (!w->down[s]) {
                    w->down[s] = 1;
                    w->down_since[s] = kvps__now_ms();
                    /* after this worker's goodbye a server leaving is the clean finish, not a loss (its
                       kvps_server_run returns once the last worker has finished) */
                    if (w->finished)
                        kvps__log(KVPS_LOG_INFO, "worker %d: server %d (%s) closed the connection after this worker "
                                  "finished", w->desc.rank, s, kvps__ep(w, s));
                    else
                        kvps__log(KVPS_LOG_WARN, "worker %d: lost the connection to server %d (%s)", w->desc.rank, s,
                                  kvps__ep(w, s));
                }
            } else if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
                w->up_once[s] = 1;
                w->refused[s] = KVPS__HS_NONE;
                w->hs_cuts[s] = 0;
                if (w->down[s]) {
                    w->down[s] = 0;
                    kvps__resend(w, s);
                }
            } else if (ev & (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
                int why = KVPS__HS_NONE;
                w->hs_val[s] = val;
                if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) why = KVPS__HS_AUTH;
                else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) why = KVPS__HS_PROTOCOL;
                else if (w->hs_cuts[s] < UINT16_MAX && ++w->hs_cuts[s] >= KVPS__HS_CUTS) why = KVPS__HS_CUT;
                else if (w->hs_cuts[s] == 1)
                    kvps__log(KVPS_LOG_WARN, "worker %d: the connection to server %d (%s) was cut during the handshake "
                              "(%s); reconnecting", w->desc.rank, s, kvps__ep(w, s), zmq_strerror((int)val));
                if (why != KVPS__HS_NONE && w->refused[s] != why) {
                    w->refused[s] = (uint8_t)why;
                    char text[300];
                    kvps__hs_text(w, s, text, sizeof text);
                    kvps__log(KVPS_LOG_ERROR, "worker %d: %s", w->desc.rank, text);
                }
                if (!w->down[s]) { w->down[s] = 1; w->down_since[s] = kvps__now_ms(); }
            }
        }
        if (w->nrep[s] > 1 && w->down[s] && !w->finished && kvps__now_ms() - w->down_since[s] >= w->desc.failover_ms) {
            char why[64];
            snprintf(why, sizeof why, "unreachable for %lld ms", (long long)(kvps__now_ms() - w->down_since[s]));
            kvps__failover(w, s, why);
        }
    }
}

/* Handles every reply that has arrived; with wait_ms > 0, first waits up to that long for one. */
static kvps_result kvps__progress(kvps_worker *w, long wait_ms) {
    for (int s = 0; wait_ms > 0 && s < w->n; s++) /* a shard's replica is down: wake up to move on from it in time */
        if (w->nrep[s] > 1 && w->down[s] && !w->finished) {
            int64_t due = w->down_since[s] + w->desc.failover_ms - kvps__now_ms();
            if (due < wait_ms) wait_ms = due < 10 ? 10 : (long)due;
            w->last_watch = 0;
        }
    if (wait_ms > 0) {
        int rc = zmq_poll(w->items, w->nitems, wait_ms);
        if (rc < 0 && zmq_errno() != EINTR) return kvps__wfail(w, KVPS_ERR_ZMQ, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        if (rc <= 0) return KVPS_OK;
        for (int s = 0; s < w->n; s++)
            if (w->items[w->n + s].revents & ZMQ_POLLIN) { w->last_watch = 0; break; }
        for (int i = 2 * w->n + 1; i < w->nitems; i += 2) /* read replicas' monitors */
            if (w->items[i].revents & ZMQ_POLLIN) w->last_watch = 0;
    }
    /* connection events change rarely; reading an empty monitor costs a syscall: every 10 ms */
    int64_t now = kvps__now_ms();
    if (now - w->last_watch >= 10) {
        kvps__watch(w);
        w->last_watch = now;
    }
    for (int s = 0; s < w->n; s++) /* each server's answers, and its read replica's (READs) */
        for (int k = 0; k < 2; k++) {
            void *sock = k ? (w->rsocks ? w->rsocks[s] : NULL) : w->socks[s];
            for (int n = 1; sock && n > 0;) {
                zmq_msg_t fr[2];
                int extra;
                n = kvps__recv_msg(sock, fr, 2, &extra);
                if (n < 0)
                    return kvps__wfail(w, KVPS_ERR_ZMQ, "receiving from server %d%s: %s", s, k ? "'s read replica" : "",
                                       zmq_strerror(zmq_errno()));
                if (n > 0) kvps__on_reply(w, s, fr, n);
                for (int j = 0; j < n; j++) zmq_msg_close(&fr[j]);
            }
        }
    if (w->fatal) return kvps__wfail(w, w->fatal, "%s", w->fatal_text);
    return KVPS_OK;
}

/* Work left for when every reply is in: rows asked for more than once get their copies. */
static void kvps__req_finish(kvps__req *q) {
    if (q->status != KVPS_OK) return;
    for (size_t i = 0; i < q->ndups; i++)
        memcpy(q->dup_base + (size_t)q->dups[2 * i + 1] * q->dup_dim, q->dup_base + (size_t)q->dups[2 * i] * q->dup_dim,
               q->dup_dim * sizeof(float));
}

/* Nothing in flight: every reply is in and ZeroMQ holds none of the pushed bytes (with parts
   answered KVPS_ERR_PEER_LOST the worker itself keeps references to re-send them). */
static int kvps__req_done(kvps__req *q) {
    return q->pending == 0 && (q->lost || __atomic_load_n(&q->refs, __ATOMIC_ACQUIRE) == 1);
}

/* The first round of a chained request that is still busy; NULL when all are done. */
static kvps__req *kvps__chain_busy(kvps_worker *w, kvps__req *q) {
    for (; q; q = q->next ? kvps__req_get(w, q->next) : NULL)
        if (!kvps__req_done(q)) return q;
    return NULL;
}

/* Ends every round of a finished request; its result is the first error among them. */
static kvps_result kvps__chain_end(kvps_worker *w, kvps__req *q) {
    if (w->tl) kvps__tl_req_end(w, q);
    kvps_result r = KVPS_OK;
    while (q) {
        kvps__req *nx = q->next ? kvps__req_get(w, q->next) : NULL;
        if (r == KVPS_OK) r = q->status;
        kvps__req_finish(q);
        kvps__req_end(w, q);
        q = nx;
    }
    return r;
}

/* The first round of a finished chain that has parts answered KVPS_ERR_PEER_LOST by their
   server (a lost worker); NULL when there is none, or when a round failed for good (the
   request then ends with that error). */
static kvps__req *kvps__chain_lost(kvps_worker *w, kvps__req *q) {
    kvps__req *first = NULL;
    for (; q; q = q->next ? kvps__req_get(w, q->next) : NULL) {
        if (q->status != KVPS_OK) return NULL;
        if (q->lost && !first) first = q;
    }
    return first;
}

/* Re-sends every part of the chain answered KVPS_ERR_PEER_LOST (the servers apply no push
   twice: the pushpull's re-send gets its pull, a barrier is entered again). */
static void kvps__chain_retry(kvps_worker *w, kvps__req *q) {
    for (; q; q = q->next ? kvps__req_get(w, q->next) : NULL)
        for (int s = 0; s < w->n && q->lost; s++) {
            if (q->state[s] != KVPS__RS_LOST) continue;
            q->state[s] = KVPS__RS_SENT; /* a send that fails is re-sent when the connection is back */
            q->lost--;
            q->pending++;
            if (kvps__send_kept(w, q, s) != 0)
                kvps__log(KVPS_LOG_WARN, "worker %d: re-send to server %d: %s", w->desc.rank, s, zmq_strerror(zmq_errno()));
        }
}

/* A timed-out or stalled request: asks each server still owing a reply what the request waits
   for (STATUS; at most KVPS__STATUS_MS more) and says it in buf after lead: "request timed out
   after 10000 ms with 1 of 2 replies missing; server 0 (tcp://...): pull of tensor 'w' waits for
   round 6, which workers 2 (never connected) have not pushed". */
enum { KVPS__STATUS_MS = 300 };
static void kvps__why_waiting(kvps_worker *w, kvps__req *c, const char *lead, char *buf, size_t cap) {
    int asked = 0;
    for (int s = 0; s < w->n; s++) {
        w->status_got[s] = 0;
        if (c->state[s] != KVPS__RS_SENT) continue;
        kvps__hdr h = kvps__req_hdr(w, c, KVPS__OP_STATUS, 0);
        h.status = (int32_t)w->incarnation;
        zmq_msg_t f;
        if (kvps__msg_from_buf(&f, &h, sizeof h) == 0 && kvps__send_frames(w->socks[s], &f, 1) == 0) asked++;
    }
    int64_t until = kvps__now_ms() + KVPS__STATUS_MS;
    for (int got = 0; got < asked;) {
        int64_t now = kvps__now_ms();
        if (now >= until || kvps__progress(w, (long)(until - now)) != KVPS_OK) break;
        got = 0;
        for (int s = 0; s < w->n; s++) got += w->status_got[s];
    }
    size_t used = (size_t)snprintf(buf, cap, "%s with %d of %d replies missing", lead, c->pending, c->sent);
    for (int s = 0; s < w->n && used < cap; s++) {
        if (c->state[s] != KVPS__RS_SENT) continue;
        int k = snprintf(buf + used, cap - used, "; server %d (%s): %s", s, kvps__ep(w, s),
                         w->status_got[s] ? w->status_text[s] : "no answer to 'what are you waiting for?'");
        if (k < 0) break;
        used += (size_t)k;
        if (c->read && w->rsocks[s] && w->rj[s] != w->cur[s] && !w->rnever[s] && used < cap) {
            /* (the primary knows nothing of a READ at the replica) */
            k = snprintf(buf + used, cap - used, " (this part is a pushpull's read, which may wait at its "
                         "replica %d, %s%s, until the round holding this worker's push is applied there)", w->rj[s],
                         w->reps[s][w->rj[s]], w->rup[s] ? "" : ", not connected now");
            if (k < 0) break;
            used += (size_t)k;
        }
    }
}

/* How often parts answered KVPS_ERR_PEER_LOST are re-sent while a wait rides the loss out. */
enum { KVPS__LOST_RETRY_MS = 100 };

KVPS_API kvps_result kvps_worker_test(kvps_worker *w, kvps_req req, int *done) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    KVPS__NEED(w, "test", done);
    *done = 0;
    kvps__req *q = kvps__req_get(w, req);
    if (!q) return kvps__wfail(w, KVPS_ERR_INVALID_REQ, "test: request %llu is unknown or already completed", (unsigned long long)req);
    kvps_result r = kvps__progress(w, 0);
    if (r != KVPS_OK) return r;
    if (kvps__chain_busy(w, q)) return KVPS_OK;
    kvps__req *l = kvps__chain_lost(w, q);
    if (l) { /* the request stays valid: re-sent now and then while test is called */
        if (kvps__now_ms() - l->lost_at >= KVPS__LOST_RETRY_MS) kvps__chain_retry(w, q);
        q->lost_told = 1;
        return KVPS_ERR_PEER_LOST;
    }
    *done = 1;
    return kvps__chain_end(w, q);
}

/* Why a wait on round c ends without its replies, by the servers it waits for; KVPS_OK when none
   ends it yet. Every time: a server that refuses our handshakes (AUTH). With a deadline (at it,
   timed_out): a server never connected, a shard none of whose replicas answers, a server
   unreachable (PEER_LOST). With none (waited: the ms so far), each once it is past its own
   bound: never connected for KVPS__CONNECT_MS, unreachable for peer_timeout_ms (a shard of
   replicas: after each was tried, failover_ms each), so a dead server ends a default wait. */
static kvps_result kvps__wait_verdict(kvps_worker *w, kvps__req *c, int timed_out, int64_t waited) {
    int64_t now = kvps__now_ms();
    for (int s = 0; s < w->n; s++) /* (handshakes cut: at once with a deadline, else once it is unreachable) */
        if (c->state[s] == KVPS__RS_SENT && w->refused[s] &&
            (timed_out || w->refused[s] != KVPS__HS_CUT || (w->down[s] && now - w->down_since[s] >= w->desc.peer_timeout_ms))) {
            kvps__hs_text(w, s, w->errmsg, sizeof w->errmsg);
            return KVPS_ERR_AUTH;
        }
    for (int s = 0; s < w->n; s++)
        if (c->state[s] == KVPS__RS_SENT && !w->up_once[s] && (timed_out || waited >= KVPS__CONNECT_MS)) {
            snprintf(w->errmsg, sizeof w->errmsg,
                     "server %d (%s) never connected: nothing accepted a connection there in %lld ms (is it started, "
                     "on that address?); the request stays valid and goes out when it does", s, kvps__ep(w, s),
                     (long long)waited);
            return KVPS_ERR_PEER_LOST;
        }
    for (int s = 0; s < w->n; s++) {
        if (c->state[s] != KVPS__RS_SENT || !w->down[s]) continue;
        int64_t dark = now - w->down_since[s];
        if (w->nrep[s] > 1 && (timed_out || waited >= (int64_t)w->nrep[s] * w->desc.failover_ms + w->desc.peer_timeout_ms)) {
            snprintf(w->errmsg, sizeof w->errmsg,
                     "shard %d: no replica answers (%s; each tried for %d ms in turn, the last, %s, for %lld ms); the "
                     "request stays valid and is re-sent when one takes over", s, w->endpoints[s], w->desc.failover_ms,
                     kvps__ep(w, s), (long long)dark);
            return KVPS_ERR_PEER_LOST;
        }
        if (w->nrep[s] <= 1 && (timed_out || dark >= w->desc.peer_timeout_ms)) {
            snprintf(w->errmsg, sizeof w->errmsg,
                     "server %d (%s) unreachable for %lld ms; the request stays valid and is re-sent when it is back",
                     s, kvps__ep(w, s), (long long)dark);
            return KVPS_ERR_PEER_LOST;
        }
    }
    return KVPS_OK;
}

/* The stall inspector of a wait (desc.stall_ms): a request waited for this long is logged with
   what each server it waits for waits for (STATUS), again every stall_ms. */
static void kvps__wait_stall(kvps_worker *w, kvps_req req, kvps__req *q, kvps__req *c, int64_t t0, int64_t *next) {
    int64_t now = kvps__now_ms();
    if (w->desc.stall_ms <= 0 || now < *next) return;
    *next = now + w->desc.stall_ms;
    char lead[128], text[sizeof w->errmsg];
    const kvps__tensor_info *t = q->tensor ? &w->tensors[q->tensor - 1] : NULL;
    snprintf(lead, sizeof lead, "worker %d: stalled for %lld s in a wait for request %llu%s%.40s%s", w->desc.rank,
             (long long)(now - t0) / 1000, (unsigned long long)req, t ? " (tensor '" : "", t ? t->name : "", t ? "')" : "");
    kvps__why_waiting(w, c, lead, text, sizeof text);
    kvps__log(KVPS_LOG_WARN, "%s", text);
}

KVPS_API kvps_result kvps_worker_wait(kvps_worker *w, kvps_req req, int timeout_ms) {
    if (!w) return KVPS_ERR_INVALID_ARG;
    kvps__req *q = kvps__req_get(w, req);
    if (!q) return kvps__wfail(w, KVPS_ERR_INVALID_REQ, "wait: request %llu is unknown or already completed", (unsigned long long)req);
    /* the limit: the call's, else the desc's, else none (-1): live servers are waited for as long
       as they take; dead ones end the wait (kvps__wait_verdict) */
    int limit = timeout_ms >= 0 ? timeout_ms : w->desc.timeout_ms > 0 ? w->desc.timeout_ms : -1;
    int64_t t0 = kvps__now_ms(), deadline = limit >= 0 ? t0 + limit : KVPS__NEVER;
    int64_t stall_next = t0 + w->desc.stall_ms;
    /* parts a server answered KVPS_ERR_PEER_LOST before: this wait re-sends them and, once the
       caller has been told of the loss, rides it out until its deadline (with none: for
       peer_timeout_ms, for the worker to come back; a first such answer is reported at once) */
    int64_t ride_end = limit >= 0 ? deadline : t0 + w->desc.peer_timeout_ms;
    kvps__chain_retry(w, q);
    for (;;) {
        kvps_result r = kvps__progress(w, 0);
        if (r != KVPS_OK) return r;
        kvps__req *c = kvps__chain_busy(w, q); /* the round to report on */
        if (!c) {
            kvps__req *l = kvps__chain_lost(w, q);
            if (!l) break;
            int64_t now = kvps__now_ms();
            if (!q->lost_told || now >= ride_end) {
                q->lost_told = 1;
                return KVPS_ERR_PEER_LOST; /* the request stays valid; last_error has the server's text */
            }
            int64_t pause = l->lost_at + KVPS__LOST_RETRY_MS - now;
            if (pause <= 0) { kvps__chain_retry(w, q); continue; }
            r = kvps__progress(w, (long)(pause < ride_end - now ? pause : ride_end - now)); /* a sleep */
            if (r != KVPS_OK) return r;
            continue;
        }
        int64_t now = kvps__now_ms(), left = deadline - now;
        if (left <= 0) {
            kvps__watch(w); /* the latest connection state decides which error this is */
            r = kvps__wait_verdict(w, c, 1, limit);
            if (r != KVPS_OK) return r;
            char lead[64];
            snprintf(lead, sizeof lead, "request timed out after %d ms", limit);
            if (limit > 0) kvps__why_waiting(w, c, lead, w->errmsg, sizeof w->errmsg); /* (a wait of 0 is a look: it asks nothing) */
            else snprintf(w->errmsg, sizeof w->errmsg, "request not done: %d of %d replies missing", c->pending, c->sent);
            return KVPS_ERR_TIMEOUT;
        }
        if (limit < 0 && (r = kvps__wait_verdict(w, c, 0, now - t0)) != KVPS_OK) return r;
        kvps__wait_stall(w, req, q, c, t0, &stall_next);
        if (c->pending > 0) {
            r = kvps__progress(w, left < 100 ? left : 100); /* (slices: the verdict and the stall inspector look between) */
            if (r != KVPS_OK) return r;
        } else {
            sched_yield(); /* replies are in; ZeroMQ is releasing a zero-copy frame */
        }
    }
    return kvps__chain_end(w, q);
}

// >>rendezvous
KVPS_API kvps_result kvps_ring_rendezvous(kvps_worker *w, int rank, int size, const char *endpoint, char *peers_out,
                                          size_t cap, int timeout_ms) {
    enum { SLOT = 64 }; /* floats per endpoint: 256 bytes, carried bit for bit by INIT and PULL */
    if (!w || !endpoint || !peers_out || rank < 0 || rank >= size || strlen(endpoint) >= SLOT * 4) return KVPS_ERR_INVALID_ARG;
    const uint64_t base = (1ull << 62) + 0x52494e47ull * 65536; /* "RING" */
    float mine[SLOT];
    memset(mine, 0, sizeof mine);
    memcpy(mine, endpoint, strlen(endpoint));
    uint64_t key = base + (uint64_t)rank;
    size_t len = SLOT;
    kvps_req q;
    kvps_result rc = kvps_worker_init(w, &key, mine, &len, 1, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, timeout_ms);
    if (rc == KVPS_OK) rc = kvps_worker_barrier(w, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, timeout_ms);
    if (rc != KVPS_OK) return rc;
    uint64_t *keys = (uint64_t *)calloc((size_t)size, sizeof *keys);
    size_t *lens = (size_t *)calloc((size_t)size, sizeof *lens);
    float *all = (float *)malloc((size_t)size * SLOT * sizeof *all);
    if (!keys || !lens || !all) rc = KVPS_ERR_NOMEM;
    for (int i = 0; rc == KVPS_OK && i < size; i++) { keys[i] = base + (uint64_t)i; lens[i] = SLOT; }
    if (rc == KVPS_OK) rc = kvps_worker_pull(w, keys, all, lens, (size_t)size, &q);
    if (rc == KVPS_OK) rc = kvps_worker_wait(w, q, timeout_ms);
    size_t used = 0;
    for (int i = 0; rc == KVPS_OK && i < size; i++) {
        char ep[SLOT * 4 + 1];
        memcpy(ep, all + (size_t)i * SLOT, SLOT * 4);
        ep[SLOT * 4] = 0;
        size_t l = strlen(ep);
        if (l == 0 || used + l + 2 > cap) { rc = l == 0 ? KVPS_ERR_MALFORMED : KVPS_ERR_INVALID_ARG; break; }
        if (i) peers_out[used++] = ',';
        memcpy(peers_out + used, ep, l + 1);
        used += l;
    }
    free(keys); free(lens); free(all);
    return rc;
}

// >>timeline-events
/* What servers and workers put in their timelines (the writer: >>timeline; the manual:
   TIMELINE). Each is called from a one-line hook `if (x->tl) kvps__tl_...(...)`.
   Server under BSP / SSP / adaptive: a "round" event per key per round applied, from the
   arrival of the round's first contribution to its application, with the time spent waiting
   for the last contributor (straggler_wait_us) and from then to the round's end (apply_us).
   Arrivals are kept for the round being summed and the next (a worker may push the next round
   before this one completes); a contribution further ahead is not noted, and its round's event
   starts at the first contribution that came while that round was at most one ahead.
   Async: pushes are applied one by one, up to millions a second, so they are counted instead:
   one "async applies" event per 100 ms that saw any (pushes, keys, bytes), on its own track.
   Worker: a request from post (kvps__req_new) to completion as the worker sees it (wait or
   test), with op, tensor (or keys / rows), bytes, servers and result. */
typedef struct kvps__tl_key {
    uint64_t first, last;           /* this round's first and last arrivals (0: none yet) */
    uint64_t next_first, next_last; /* the next round's */
    uint32_t win;                   /* async: the window it was last counted in, + 1 */
} kvps__tl_key;

static kvps__tl_key *kvps__tl_key_of(kvps__key *k) {
    if (!k->tl) k->tl = (kvps__tl_key *)calloc(1, sizeof *k->tl);
    return k->tl;
}

/* The name of the tensor key k is a slice of, as its workers named it (NAME), or NULL (a raw
   key, or a slice whose name has not arrived: kvps-timeline names those from the workers'
   files). */
static const char *kvps__tl_key_name(const kvps_server *s, const kvps__key *k) {
    const kvps__tname *t = (k->key >> 63) ? kvps__tname_find(s, k->key & ~(uint64_t)0xffff) : NULL;
    return t ? t->name : NULL;
}

static void kvps__tl_arrive(kvps_server *s, kvps__key *k, uint64_t c) {
    (void)s;
    kvps__tl_key *t = kvps__tl_key_of(k);
    if (!t) return;
    uint64_t now = kvps__tl_now();
    if (c == k->round) {
        if (!t->first) t->first = now;
        t->last = now;
    } else if (c == k->round + 1) {
        if (!t->next_first) t->next_first = now;
        t->next_last = now;
    }
}

/* The async window's event; the counts start again. */
static void kvps__tl_async_event(kvps__tl *tl) {
    int tid = kvps__tl_lane(tl, 1, "async applies", NULL, 0, tl->agg_t0, tl->agg_t1);
    char *p = kvps__tl_begin(tl, "async applies", NULL, "server", tl->agg_t0, tl->agg_t1, tid);
    p = kvps__tl_arg_u64(p, "pushes", tl->agg_n);
    p = kvps__tl_arg_u64(p, "keys", tl->agg_keys);
    p = kvps__tl_arg_u64(p, "bytes", tl->agg_bytes);
    kvps__tl_end(tl, p);
    tl->agg_n = tl->agg_keys = tl->agg_bytes = 0;
    tl->agg_win++;
}

/* Async: n pushes of key k applied. */
static void kvps__tl_async(kvps_server *s, kvps__key *k, uint64_t n) {
    kvps__tl *tl = s->tl;
    uint64_t now = kvps__tl_now();
    if (tl->agg_n && now - tl->agg_t0 >= KVPS__TL_WINDOW_NS) kvps__tl_async_event(tl);
    if (!tl->agg_n) tl->agg_t0 = now;
    tl->agg_t1 = now;
    tl->agg_n += n;
    tl->agg_bytes += n * k->len * sizeof(float);
    kvps__tl_key *t = kvps__tl_key_of(k);
    if (t && t->win != tl->agg_win + 1) {
        t->win = tl->agg_win + 1;
        tl->agg_keys++;
    }
}

/* A round of k was applied (k->round counts it already) from count contributions. */
static void kvps__tl_round(kvps_server *s, kvps__key *k, int count) {
    if (s->desc.consistency == KVPS_ASYNC) { kvps__tl_async(s, k, 1); return; }
    kvps__tl *tl = s->tl;
    uint64_t now = kvps__tl_now();
    kvps__tl_key *t = kvps__tl_key_of(k);
    uint64_t first = t && t->first ? t->first : now, last = t && t->last ? t->last : first;
    const char *name = kvps__tl_key_name(s, k);
    /* "w[3]" (the tensor's name escaped, as kvps-timeline names slices), "slice 3" or "key 42" */
    char label[6 * KVPS__TL_NAME + 32], tname[6 * KVPS__TL_NAME + 8], *e;
    if (name) *kvps__tl_text(tname, name) = 0;
    if (name) e = KVPS__TL_LIT(kvps__tl_u64(KVPS__TL_LIT(kvps__tl_text(label, name), "["), k->key & 0xffff), "]");
    else if (k->key >> 63) e = kvps__tl_u64(KVPS__TL_LIT(label, "slice "), k->key & 0xffff);
    else e = kvps__tl_u64(KVPS__TL_LIT(label, "key "), k->key);
    *e = 0;
    int tid = kvps__tl_lane(tl, 0, "rounds", NULL, 0, first, now);
    char *p = kvps__tl_begin(tl, "round", label, "server", first, now, tid);
    p = kvps__tl_arg_key(p, "key", k->key);
    if (k->key >> 63) p = kvps__tl_arg_u64(p, "slice", k->key & 0xffff);
    if (name) p = kvps__tl_arg_raw(p, "tensor", tname);
    p = kvps__tl_arg_u64(p, "round", k->round); /* (counted already: 1 the first, as in messages) */
    p = kvps__tl_arg_i64(p, "contributions", count);
    p = kvps__tl_arg_u64(p, "bytes", k->len * sizeof(float));
    p = kvps__tl_arg_us(p, "straggler_wait_us", last - first);
    p = kvps__tl_arg_us(p, "apply_us", now - last);
    kvps__tl_end(tl, p);
    if (t) {
        t->first = t->next_first;
        t->last = t->next_last;
        t->next_first = t->next_last = 0;
    }
}

/* kvps_server_destroy: the last async window, and the file closed whole. */
static void kvps__tl_server_end(kvps_server *s) {
    if (!s->tl) return;
    if (s->tl->agg_n) kvps__tl_async_event(s->tl);
    kvps__tl_close(&s->tl);
}

static uint64_t kvps__tl_floats(const size_t *lens, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += lens[i];
    return sum;
}

/* A request has gone out (q: its first round; NULL when nothing went out). */
static void kvps__tl_post(kvps__req *q, int op, uint64_t bytes, uint64_t n) {
    if (!q) return;
    q->tl_op = op;
    q->tl_bytes = bytes;
    q->tl_n = n;
}

/* The request whose first round is q ends (kvps__chain_end, before its rounds are freed). */
static void kvps__tl_req_end(kvps_worker *w, kvps__req *q) {
    if (!q->tl_op) return;
    kvps__tl *tl = w->tl;
    uint64_t now = kvps__tl_now();
    kvps_result r = KVPS_OK;
    for (kvps__req *c = q; c; c = c->next ? kvps__req_get(w, c->next) : NULL)
        if (r == KVPS_OK) r = c->status;
    const kvps__tensor_info *t = q->tensor ? &w->tensors[q->tensor - 1] : NULL;
    int op = q->tl_op, rows = op == KVPS__OP_PUSH_ROWS || op == KVPS__OP_PULL_ROWS;
    int track = t ? 3 + q->tensor - 1 : op == KVPS__OP_BARRIER ? 0 : rows ? 2 : 1; /* tracks: barrier, keys, rows, tensors */
    const char *label = track == 0 ? "barrier" : track == 1 ? "keys" : track == 2 ? "rows" : "tensor";
    int tid = kvps__tl_lane(tl, track, label, t ? t->name : NULL, t ? t->keys[0] & ~0xffffull : 0, q->tl_t0, now);
    const char *text = kvps__tl_track_text(tl, track); /* the tensor's name, escaped once */
    char *p = kvps__tl_begin(tl, kvps__ops[op].name, t ? text : track == 1 ? "keys" : NULL, "worker", q->tl_t0, now, tid);
    p = kvps__tl_arg_raw(p, "op", kvps__ops[op].name);
    if (t) {
        p = kvps__tl_arg_raw(p, "tensor", text);
        p = kvps__tl_arg_u64(p, "slices", t->nslices);
    } else if (track != 0) {
        p = kvps__tl_arg_u64(p, track == 1 ? "keys" : "rows", q->tl_n);
    }
    p = kvps__tl_arg_u64(p, "bytes", q->tl_bytes);
    p = KVPS__TL_LIT(p, "\"servers\":[");
    int listed = 0;
    for (int s = 0; s < w->n; s++) {
        int used = 0;
        for (kvps__req *c = q; c && !used; c = c->next ? kvps__req_get(w, c->next) : NULL) used = c->state[s] != KVPS__RS_NONE;
        if (!used) continue;
        if (listed == KVPS__TL_SERVERS) { p = KVPS__TL_LIT(p, "\"more\","); break; }
        p = kvps__tl_u64(p, (uint64_t)s);
        *p++ = ',';
        listed++;
    }
    if (p[-1] == ',') p--;
    p = KVPS__TL_LIT(p, "],");
    p = kvps__tl_arg_result(p, r);
    kvps__tl_end(tl, p);
}

#endif /* KVPS__IMPLEMENTED */
#endif /* KVPS_IMPLEMENTATION */
