/* kvps_ring.h - v0.1 - collectives and point-to-point among equal peers: shared memory on one host,
   its own TCP connections between hosts (ZeroMQ for the rest) - MIT licence

   Do this:
       #define KVPS_IMPLEMENTATION
   before you include this file in *one* C or C++ file. Link libzmq, -pthread, -lm.
   It includes kvps_core.h, kvps_codec.h and kvps_launch.h, not the parameter server: a program
   that also uses kvps.h (servers, workers, kvps_ring_rendezvous) includes it too. Its own
   switch, KVPS_RING_IMPLEMENTATION, implements it and those three (kvps_core.h: IMPLEMENTATION
   SWITCHES).

   CONTENTS
     1. Step by step
     2. Operations and counts
     3. Algorithms
     4. Wire format
     5. Ownership, threads, errors
     6. Timeline
     7. Point-to-point: send, recv, isend, irecv
     8. Uneven collectives: allgatherv, gatherv, scatterv, alltoallv
     9. Sub-rings: kvps_ring_split
    10. Transports: shared memory on one host, the ring's own TCP connections between hosts
    11. Join: ranks whose data ends first

   1. STEP BY STEP
       kvps_ring *r = NULL;
       kvps_result rc = kvps_ring_create(&(kvps_ring_desc){
           .rank = rank, .size = size,
           .peers = "tcp://10.0.0.1:6000,tcp://10.0.0.2:6000",  // one endpoint per rank, in order
       }, &r);
       if (rc != KVPS_OK) { fprintf(stderr, "%s\n", kvps_result_str(rc)); exit(1); }
       rc = kvps_ring_allreduce(r, grad, grad, n, KVPS_FLOAT32, KVPS_SUM);   // in place
       kvps_ring_destroy(&r);
   Ephemeral ports: create with .peers = NULL and .bind = "tcp://127.0.0.1:*", read
   kvps_ring_endpoint(r), exchange the endpoints (kvps.h's kvps_ring_rendezvous does it through a kvps
   server; or your own channel), then kvps_ring_connect(r, peers). From the environment:
   kvps_ring_env_read reads KVPS_RANK / RANK (torchrun) / OMPI_COMM_WORLD_RANK / PMI_RANK /
   SLURM_PROCID and KVPS_SIZE / WORLD_SIZE / OMPI_COMM_WORLD_SIZE / PMI_SIZE / SLURM_NTASKS (the
   first set of each), then KVPS_RING_PEERS, or without it meets the other ranks at MASTER_ADDR /
   MASTER_PORT (or KVPS_RENDEZVOUS=host:port) and returns the peers found there, this rank's
   port held for it until kvps_ring_create binds it (kvps_launch.h: rendezvous, KVPS_IFNAME, the
   local rank); it names what is missing or malformed.
   A call that fails with no ring to keep its error (kvps_ring_create, kvps_ring_env_read,
   kvps_ring_connect) leaves its words for kvps_ring_last_error(NULL), per thread: "kvps_ring_create:
   ring rank 0 cannot bind its endpoint 'tcp://127.0.0.1:6000': Address already in use".

   2. OPERATIONS AND COUNTS (as NCCL: count is per rank where data is cut by rank)
     allreduce       send[count] -> recv[count] on every rank
     reduce          send[count] -> recv[count] on root (recv ignored elsewhere, may be NULL)
     reduce_scatter  send[count * size] -> recv[count]: block r of the reduction to rank r
     allgather       send[count] -> recv[count * size]: block r from rank r
     broadcast       root's send[count] (or recv when send is NULL) -> recv[count] everywhere
     gather          send[count] -> root's recv[count * size]
     scatter         root's send[count * size] -> recv[count], block r to rank r
     alltoall        send[count * size] -> recv[count * size]: block j of rank i lands as block i
                     of rank j
     barrier         returns when every rank has entered
     allgatherv      send[counts[rank]] -> recv: block i (counts[i]) at recv[displs[i]] (section 8)
     gatherv         send[counts[rank]] -> root's recv: block i at recv[displs[i]]
     scatterv        root's send: block i (counts[i]) at send[displs[i]] -> recv[counts[rank]] of rank i
     alltoallv       send_counts[j] elements at send[send_displs[j]] to rank j -> recv_counts[i]
                     elements from rank i at recv[recv_displs[i]]
   In place: send == NULL or send == recv (allgather and gather: also send == recv + rank *
   count): the data is already in recv: allgather / gather: the rank's block at recv[rank *
   count]; reduce_scatter / scatter (root): the whole input in recv, the rank's result moved to
   recv[0 .. count); reduce: every rank's input in recv (non-roots' recv is clobbered). Any count,
   including 0. dtypes float32, float64, int32, int64, float16, bfloat16 (16-bit floats are
   reduced in float32 and rounded to nearest even after each step); ops sum, prod, min, max, avg
   (sum / size; integers divide with truncation). Determinism: every rank ends an all-reduce
   with the same bits, whatever the algorithm (each element is reduced in one order and the
   result copied, or reduced symmetrically; tests/kt_coll.h checks it on every rank for every
   algorithm, dtype and op); run to run the bits are the same for the same
   sizes, ranks, algorithm and groups (AUTO chooses from those, and from whether DIRECT can
   run: section 10). Every rank must pass the same collective,
   count, dtype, op and root: a rank that receives any piece of a different call reports
   KVPS_ERR_MISMATCH and tells the others, who return KVPS_ERR_PEER (or time out). A rank that
   only sends in a collective (the root of broadcast or scatter, non-roots of gather, leaves of a
   small reduce, or a rank whose count is 0) may finish before its peers notice and return
   KVPS_OK; the receivers report the error, and the sender's next call on the ring fails with
   KVPS_ERR_MISMATCH or KVPS_ERR_PEER when the late pieces or the abort reach it.

   3. ALGORITHMS (kvps_ring_algo; KVPS_ALGO_AUTO chooses by size, forced per call or per ring)
     RING    reduce-scatter then all-gather, n-1 steps each; each rank's block is cut into pieces
             of chunk_bytes, and a piece is forwarded as soon as it is reduced, so sending one
             overlaps reducing the next.
     BIRING  half the data goes round clockwise, half counter-clockwise: both directions of
             every link carry data (with 2 ranks this is RING). It pays only where each
             neighbour pair has a link of its own; behind a switch every host has one NIC and a
             plain ring already keeps it busy both ways (measured on 4 shaped hosts: RING 0.955
             Gbit/s busbw, BIRING 0.91).
     RD      recursive doubling (non-powers of two fold the extra ranks in first): log2(n)
             exchanges of the whole buffer; best for small messages.
     HIER    ranks grouped by .groups (a machine id per rank): reduce inside each group to its
             first rank, all-reduce among those leaders, broadcast back inside the group.
     RHD     Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive
             doubling, pieces of chunk_bytes. The same bytes per rank as RING in 2 log2(n)
             exchanges instead of 2(n-1). Needs a power-of-two size (else RING runs) and no
             16-bit wire (else RING runs).
     ONESHOT every rank sends its whole buffer to every other at once and reduces the k buffers in
             rank order (the same bits everywhere): one message's latency where RD takes log2(n),
             for n - 1 times the bytes. Never chosen by AUTO: on this machine's loopback (2 vCPUs)
             RD was as fast or faster at every size and rank count measured (BENCHMARKS.md, issue
             30); a forced choice where latency costs more than bytes. A 16-bit wire runs RD.
     DIRECT  every rank on one host, each allowed to read the others' memory (section 10): each
             rank reduces its 1/n block of the result straight from its peers' input buffers
             (process_vm_readv, 64 KiB pieces summed over the peers in rank order while in
             cache) and copies the others' blocks straight from their results: each byte
             crosses once, where a ring step copies it into a queue and out. Three rounds of
             small messages order the reads. Where it cannot run, RING runs.
   AUTO: all-reduce uses DIRECT from 1 MiB with 3 ranks or more where it can run (with 2 ranks
   the pipelined ring measured as fast or faster: BENCHMARKS.md, shared memory), else HIER at
   every size when .groups (given, or one per host: section 10) names more than one group with
   more than one rank (2 hosts x 2 ranks on links of 1 Gbit/s: HIER 1.01-1.66x OpenMPI from 4
   KiB to 256 KiB where RD was 0.50x at 64 KiB, each host's ranks sending the same bytes over
   one link; BENCHMARKS.md, issue 30), else RD up to .small_bytes (default 512 KiB: on loopback
   RD wins up to 512 KiB at 2, 4 and 8 ranks, the ring from 1 MiB; re-measured over the ring's
   own TCP connections, issue 30), else RHD for 4, 8, 16... ranks up to 16
   MiB (measured on loopback with 4 and 8 ranks, six runs: 0.97-1.39x RING's busbw at 1-4 MB,
   0.89-1.11x at 16 MB, 0.93-1.05x at 64 MB), else RING. Broadcast and reduce use
   binomial trees for small messages and a pipelined chain or reduce-scatter + gather for large
   ones. An out-of-place ring all-reduce reads send directly: the input is never copied first.

   4. WIRE FORMAT
   (Between ranks on one host the messages below go through shared memory instead, and between
   hosts over the ring's own TCP connections, both framed [u64 length][header][payload]: section
   10. What follows is the ZeroMQ transport, which remains where those do not reach.)
   Every rank binds one ROUTER and connects one DEALER to each peer, so each direction between
   two ranks has its own TCP connection (one connection carrying bulk data both ways runs at
   about half rate through a shaped link). Sub-rings (section 9) use the same sockets.
   Send buffers: a connection to a peer at a loopback address (tcp://127.x.x.x, localhost, [::1])
   gets SO_SNDBUF 256 KiB (.sndbuf_bytes; the kernel doubles it), others keep the OS's
   autotuning. On loopback the autotuned buffer grows to megabytes per connection, so a piece
   waits in the kernel until it has left the cache and the receiver's copy reads it from memory;
   with 256 KiB the sender stays a few segments ahead and the copies and the reduction read hot
   data (BENCHMARKS.md, tensor fusion: ResNet-50's tensors among 4 ranks on 2 vCPUs, the kernel's
   send and receive paths took half the CPU time, the fused step 0.83-0.85x the wall time). Not much
   smaller: with 32 KiB only one 64 KiB loopback segment fits, each waits for the receiver's
   delayed ACK (40 ms), and a 100 MB all-reduce did not end within a minute. A real link keeps
   the autotuning, which a long round trip needs. Waiting for a piece, a collective polls up to
   16 times, yielding the CPU between, before it sleeps in zmq_poll: on a machine with fewer
   CPUs than ranks the wake-up from a sleep cost more than the piece's wait.
   Messages:
   [header 40 B][payload].
       u32 magic 0x5250564B "KVPR" | u32 seq (collective number) | u64 tag (phase, step, piece)
       u16 src | u8 coll | u8 dtype | u8 op | u8 abort | u16 root | u64 count
       u32 ring (0: the ring kvps_ring_create made; else the sub-ring's id) | u32 layout (0; an
       all-reduce over a list of buffers, kvps_fuse.h's kvps_ring_allreduce_many: a hash of the
       list's non-zero counts, checked as count is, so lists that differ are a mismatch)
   src, seq, root are the numbers of the ring named by `ring`. A v-collective's header carries
   count 0; its first messages (tag phase 14) are each rank's counts as u64, counts[size]
   (alltoallv: send_counts[size] then recv_counts[size]), to every other rank. abort = 1 carries a kvps_result in count and a text payload. Point-to-point messages (section
   7) use the same header with coll = 0x50 (no collective has it), so neither side takes the
   other's: seq is the message's number among those from src to this rank (from 1), tag the
   user's tag (32 bits), op the kind: 1 data, 2 data that wants an answer, 3 ACK, 4 NACK (dtype
   and count: what the receive named; payload: the refused header), 5 abort (payload: the text).
   Transport messages (section 10) carry coll = 0x51, ring 0 and src the sender's rank in the
   first ring, and never reach a ring: op 1 HELLO, the first message on every connection
   (payload: version, ring size, pid, queue size, host identity, segment name, user, whether its
   memory may be read, data port, the token the receiver must show), op 3 NOSHM (the sender
   cannot use the segment the hello offered), op 4 NOTCP (the higher rank of a pair will not
   connect to the lower's data port).

   5. OWNERSHIP, THREADS, ERRORS
   Buffers (and a v-collective's counts and displs) are borrowed until the call returns
   (blocking) or until kvps_ring_wait / test reports the request done (non-blocking). Operations run in the order they were started, the same
   order on every rank; a ring is used by one thread at a time, except that kvps_ring_post'ed
   operations run on a background thread (p2p calls wait for them: section 7). A ring and its
   sub-rings share that thread and that rule (section 9).
   TIMEOUTS. Slow is not dead: with no .timeout_ms (the default) a wait on a live peer lasts as
   long as it takes, logged (warn) at .stall_ms (60 s) and every stall_ms after. A dead peer ends
   every wait within .peer_timeout_ms (5 s): KVPS_ERR_PEER_LOST naming it. A deadline is yours to set.
   In more words: the stall inspector's line names the rank (of the family's first ring) waited
   for, its process and how it is, and the call: "ring 0: stalled for 60 s waiting for rank 1
   (process 4242 on this host, alive; it answers heartbeats) in allreduce of 1000 float32 (sum,
   root 0)"; .stall_ms = -1 turns it off. How a death is seen: a peer on this host by its process
   (gone: about 100 ms), one over the ring's TCP connection by the connection's end (at once), and
   every peer by its ZeroMQ connection, which carries ZMTP heartbeats (every peer_timeout_ms / 5):
   closed, or silent for peer_timeout_ms, and not back within peer_timeout_ms more, the peer is
   gone ("rank 2 (process 4242 at 10.0.0.3) is unreachable: no ZeroMQ connection for 5014 ms ...").
   A stopped process (SIGSTOP, kill -STOP, a debugger holding it) answers no heartbeats: it is
   treated as dead, KVPS_ERR_PEER_LOST about 2 x peer_timeout_ms after it stopped (on this host the
   error says "it is stopped"), as a PS server treats a silent worker; over the network a stopped
   process cannot be told from a dead host or a cut link, and one rule holds on every transport.
   To pause a rank in a debugger longer than that, raise .peer_timeout_ms. A deadline: .timeout_ms
   (every call of the ring) or kvps_ring_wait's timeout gives KVPS_ERR_TIMEOUT naming the rank
   waited for and the call, in kvps_ring_last_error ("rank 0: timed out after 30000 ms waiting for
   rank 2 in allreduce of 100 float32 (sum, root 0) (this ring's collective #7)"). A peer that
   never connected is not known to be alive: its hello is awaited .timeout_ms, else 5 minutes
   (the stall inspector names it meanwhile); a TCP connection that has not proven itself, 30 s.
   After an error the ring is broken (KVPS_ERR_STATE for later calls): destroy it and make a new one. A failed
   collective whose frames sent without a copy are still in ZeroMQ's hands closes the sockets
   (so that the caller may free its buffers): that breaks the ring's sub-rings and parent too.
   Every rank may destroy its ring (and exit) the moment its last call returns, even a rank that
   only sent while a slower peer still waits for its pieces: kvps_ring_destroy first delivers
   what is still queued, waiting at most 5 s (or .timeout_ms if set and shorter) for a peer that is not
   connected yet; tests/test_ring_close.c checks the last call's result on every rank.

   6. TIMELINE
   KVPS_TIMELINE=DIR (or .timeline = "DIR"; "" is off) writes DIR/kvps-ring-RANK-PID.json: each
   collective from its call or post to its end (coll, dtype, count, bytes, op, root, algorithm
   as chosen, queued time of posted ones, result) and its phases nested under it: RING's
   reduce-scatter and all-gather and each of their steps, RHD's recursive halving and doubling
   and their steps, RD's fold and recursive doubling steps, tree and chain broadcast, tree
   reduce, reduce-scatter + gather to the root, HIER's three stages (with the inner algorithm's
   phases inside), all-to-all's send and receive, the barrier's rounds. kvps.h, 13. TIMELINE,
   has the rest (files, cost, scripts/kvps-timeline).

   7. POINT-TO-POINT
       kvps_ring_send(r, buf, count, KVPS_FLOAT32, dst, tag);      // returns when buf may be reused
       kvps_ring_recv(r, buf, count, KVPS_FLOAT32, src, tag);      // returns with the message in buf
       kvps_ring_req q;
       kvps_ring_irecv(r, buf, count, KVPS_INT64, src, tag, &q);   // or kvps_ring_isend
       ...; kvps_ring_wait(r, q, -1);                               // or kvps_ring_test(r, q, &done)
   Between any two ranks of the ring, a rank and itself included; any dtype; count 0 (buf may be
   NULL) too; tag any uint32_t. A receive takes the first message from src with its tag that it
   has not taken, receives in the order they were started (MPI's non-overtaking rule): messages
   from one rank on one tag arrive in the order sent; on different tags they may be received in
   any order (tag 2 before tag 1 waits for nothing). The receive must name the count and dtype
   the send did.
   Sends: up to 64 KiB (and any send to itself) are copied and done at once (eager): the blocking
   send returns, the isend's request is done. Larger ones go without a copy and wait for the
   receiver's answer, as MPI's rendezvous: the blocking send returns (the isend's request is
   done) once the receiver has taken the message and ZeroMQ has let go of buf. So a rank that
   sends more than 64 KiB to a rank that is itself in a blocking send to it waits for ever (or
   until .timeout_ms): use isend, or order the calls. The data itself goes at once, whatever the receiver is
   doing; it is kept until received.
   Errors. A receive that names another count or dtype fails with KVPS_ERR_MISMATCH: "rank 1:
   recv from rank 0 tag 7 expected 100 float32, rank 0 sent 50 float32", and answers the sender
   (NACK), who learns the same facts ("rank 0: send to rank 1 tag 7 (message #1 to it) refused
   by the receiver: rank 1: recv from rank 0 tag 7 expected ..."): in the send itself (or its
   request's wait) over 64 KiB; for an eager send, which has already returned KVPS_OK, in its
   next call on the ring, p2p or collective, which fails with KVPS_ERR_MISMATCH. Waiting for a
   rank that does not send ends within .timeout_ms when set: KVPS_ERR_TIMEOUT, "rank 0: timed out after
   500 ms waiting for rank 2 in recv of 64 float32 from rank 2 tag 3"; at once with
   KVPS_ERR_PEER when that rank said its ring broke (a failed p2p call tells every peer). As
   with collectives, any of these breaks the ring (KVPS_ERR_STATE for later calls; a request
   still pending then answers KVPS_ERR_STATE). Bad arguments (a rank outside 0..size-1, NULL buf
   with count > 0, no such dtype, count over 2^40 bytes, out NULL) give KVPS_ERR_INVALID_ARG
   with the reason in kvps_ring_last_error and leave the ring as it was. kvps_ring_wait(r, q, t)
   with t >= 0 that runs out gives KVPS_ERR_TIMEOUT and leaves q pending; t < 0 waits as a
   blocking call does (section 5: the ring's .timeout_ms, if set, fails q). A finished request is gone (KVPS_ERR_INVALID_REQ after).
   Threads and collectives. Every call uses the same transports to a peer (section 10), so p2p
   and collectives share them: a p2p message that arrives while a collective runs is kept for the
   receive, and a collective's piece that arrives during a p2p call is kept for the collective.
   p2p calls run in the caller's thread. A p2p call (send, recv, isend, irecv, wait or test of a
   p2p request) first waits until the collectives posted before it (kvps_ring_post) have run on
   the ring's thread, then holds the ring until it returns: so a posted collective must not
   depend on a p2p call made after it was posted (post p2p first, or wait for the collective).
   A p2p request makes progress only inside p2p calls (and its data arrives regardless).
   Not in the timeline yet.

   8. UNEVEN COLLECTIVES
       size_t counts[3] = {5, 0, 2};                                  // the same on every rank
       kvps_ring_allgatherv(r, mine, all, counts, NULL, KVPS_INT64);   // all: 7 elements, packed
       kvps_ring_alltoallv(r, s, send_counts, NULL, d, recv_counts, NULL, KVPS_FLOAT32);
   Rank i's block has counts[i] elements of any dtype (0 allowed); displs[i] (elements) is where
   it lies in the buffer holding every block: recv for allgatherv and gatherv, the root's send
   for scatterv; NULL displs: packed, each block right after the one before (give displs for
   gaps or another order; blocks must not overlap). alltoallv has a counts / displs pair per
   side. In place: send NULL (allgatherv and gatherv's root: the own block already at
   recv[displs[rank]]; scatterv's root: every block in recv, its own moved to recv[0]; alltoallv:
   the send layout in recv, read before anything is written).
   Counts are checked across ranks before any data moves: every rank sends its counts to every
   other (size * size counts per rank: fine for tens or hundreds of ranks, a cost at thousands)
   and every rank checks them all in the same order, so a disagreement is KVPS_ERR_MISMATCH on
   every rank, the same words everywhere: "allgatherv counts disagree: rank 2 says rank 1's
   block is 5 float32, rank 1 says 6" (block j's count is rank j's own word; gatherv and
   scatterv alike), "alltoallv counts disagree: rank 1 sends 6 int32 to rank 2, rank 2 expects 5
   from rank 1". Every rank passes counts for every rank (gatherv and scatterv too: unlike MPI,
   non-roots' counts are not ignored). Algorithms: allgatherv is the pipelined ring all-gather
   over the uneven blocks (the same code as allgather), gatherv and scatterv send directly,
   alltoallv pairwise. Other mismatches (another collective, dtype or root) are as in section 2.

   9. SUB-RINGS
       kvps_ring *half = NULL;
       kvps_ring_split(r, rank % 2, rank, &half);       // even ranks, odd ranks: two sub-rings
       kvps_ring_allreduce(half, g, g, n, KVPS_FLOAT32, KVPS_SUM); // ranks numbered in the sub-ring
       kvps_ring_destroy(&half);                           // before r
   kvps_ring_split(r, colour, key, &sub) is MPI_Comm_split: collective over r (every rank of r
   calls it, in its order among r's collectives); the ranks that pass the same colour form a
   sub-ring, ranked by key, ties by their rank in r; a negative colour (KVPS_UNDEFINED) joins
   none and gets *sub = NULL. kvps_ring_rank / kvps_ring_size give a sub-ring's numbers. A
   sub-ring takes every call a ring does, with its own ranks: each collective and algorithm
   (AUTO chooses by the sub-ring's size; .groups is carried over, so HIER works), the
   v-collectives, send / recv, post / wait, and kvps_ring_split (nested sub-rings).
   Connections. A sub-ring binds and connects nothing: its messages go over the sockets of the
   ring kvps_ring_create made (its family's first ring), with the sub-ring's id in the header
   (section 4), and whoever reads a message for another ring of the family hands it over, so
   messages are never taken by the wrong ring. Ids: in the split every rank proposes one above
   every id it has used, and a sub-ring takes the largest proposal of its members, so no rank
   has two live rings with one id, and ids are never reused (late pieces of a destroyed
   sub-ring are dropped; messages for a sub-ring a faster peer made first are kept for it).
   Threads. The family (the first ring and every sub-ring split from it, at any depth) has one
   set of sockets, so it runs one call at a time: calls on its rings from several threads are
   safe (each waits for the running one; never a data race, never a message taken by the wrong
   ring), operations posted on any of its rings run on one thread in the order posted, and
   p2p calls and splits wait for them. But a blocking collective holds the family until it
   ends, so two threads whose collectives on different rings of a family start in different
   orders on different ranks wait for each other for ever (or until .timeout_ms): use a family from one
   thread, or post its collectives in the same order on every rank.
   Destroying. Destroy sub-rings before the ring kvps_ring_create made: it owns the sockets, and
   destroying it first (operations posted on any ring of the family run first) leaves its
   sub-rings answering KVPS_ERR_STATE ("the ring it was split from ... was destroyed first");
   they must still be destroyed, which frees them. A sub-ring destroyed before its own
   sub-rings is harmless: they need only the family's sockets.
   Errors name the sub-ring and the parent's ranks: "sub-ring 1 (colour 1, parent ranks 1 3)
   rank 0 = parent rank 1: timed out after 1500 ms waiting for rank 1 in allreduce of 1000
   float32 (sum, root 0) (this ring's collective #2)" (nested: "colour 0 of sub-ring 1"); the
   ranks after the colon are the sub-ring's. A failure breaks the sub-ring; when it had to close
   the sockets (section 5) it breaks the whole family.

   10. TRANSPORTS: SHARED MEMORY ON ONE HOST, THE RING'S OWN TCP CONNECTIONS BETWEEN HOSTS
   Every rank binds and connects its ZeroMQ sockets as in section 4 and, at connect, sends every
   peer a hello: its host, process, shared-memory segment, data port and a token for that peer. A host is what the kernel keeps
   apart: the boot, the network, IPC and PID namespaces and /dev/shm's file system, so two
   containers or two network namespaces of one machine are two hosts ($KVPS_RING_HOST_ID, added
   to the identity, splits one further: for tests). A rank sends a peer nothing before it has
   read that peer's hello (the first message on every connection; it waits for it within the
   call's deadline), and decides then, once: a peer on this host whose segment it could map gets
   everything through shared memory, any other peer everything over the pair's own TCP
   connection (below), or over ZeroMQ where there is none; so nothing one rank sends can overtake
   another of its messages. kvps_ring_transport(r, rank) says which: "shm", "tcp" or "zmq" (every
   hello has been read by the end of the ring's first collective). ZeroMQ stays for the hellos,
   rendezvous and what the other transports do not carry.
   Segments. Each rank makes one in /dev/shm at connect (/kvps-ring-PID-..., mode 0600, sparse):
   a page with its futex word, and a queue per rank of the ring: a control page and 1 MiB + 4 KiB
   (256 KiB above 8 ranks; no shared memory above 1024) used as one writer's byte stream of
   [u64 length][40-byte header][payload]. A peer on this host maps it when it reads the hello and
   reserves its queue's pages (posix_fallocate); the owner unlinks the segment once every peer on
   the host has mapped it or said it will not (NOSHM), within the job's first collective: a job
   killed with SIGKILL after that leaves nothing in /dev/shm, and a segment of a process killed
   before is removed by the next ring made on the host (its pid gone, the segment over a minute
   old). A /dev/shm too small
   (a container's 64 MB: docker run --shm-size) fails the reservation: that pair keeps ZeroMQ,
   and a warning names /dev/shm. What fits in a queue is written at once; a larger message
   streams through it while the reader copies it out, the writer reading its own queues as it
   waits for room (two ranks sending each other large messages never wait on each other). So a
   send to a rank that does not call the ring waits, as MPI's does, once that rank's queue is
   full (ZeroMQ would buffer it): as long as that rank lives (section 5), or .timeout_ms when set
   (KVPS_ERR_TIMEOUT).
   Waiting. A rank that waits for a message looks at its queues for a few microseconds without
   a system call, then keeps looking for up to 200 us where every rank of this machine (its boot:
   network namespaces and containers share its CPUs) has a CPU of its own, else yields up to 16
   times (200 us at most), then sleeps on its futex word,
   which every writer rings (waking it if it sleeps), 100 ms at a time. With some peers over
   ZeroMQ it sleeps in zmq_poll and looks at the queues every millisecond. A rank waiting for a
   peer on this host (to receive from it, or for room in its queue) whose process is gone
   returns KVPS_ERR_PEER_LOST within about 100 ms, naming it: "rank 1 (process 4242 on this host)
   is gone: it died while this rank waited for it in allreduce of 256 float32 (sum, root 0)";
   over ZeroMQ its heartbeats tell (section 5).
   Trust. Everything read from a segment is checked before use: a queue's indices against its
   size, a message's length against the largest a ring sends, the header's magic and its sender;
   a malformed queue is read no more, and the error names its writer (tests/fuzz/fuzz_shm.c
   fuzzes the reader). Only processes of the same user can open a segment, and only while the
   job starts.
   DIRECT (section 3) reads the peers' buffers with process_vm_readv. Each hello says whether
   its process can (Linux; Yama's ptrace_scope absent or 0, since 1 lets a process read only its
   descendants; the system call not refused; shared memory on); it runs when every rank of the
   family is on this host, of one user, and says so: a decision from the hellos alone, the same
   on every rank.
   Hosts and AUTO. A ring given no .groups gets one group per host at its first collective, so
   where the ranks span hosts and some share one, AUTO runs HIER past .small_bytes: each host
   reduces over shared memory, one leader per host all-reduces over the network, and each host
   broadcasts the result back (tests/test_ring_netns.sh: 2 network namespaces x 2 ranks).
   TCP. Through ZeroMQ every message crossed two I/O threads (the sender's and the receiver's)
   and woke the receiving rank: 50-70 us one way on these machines. So each rank also listens on
   a data port (the address its ZeroMQ socket is bound to, a port the kernel picks, named in its
   hello), and each pair of ranks not joined by shared memory gets one TCP connection
   (TCP_NODELAY), made by the higher rank of the two when it reads the lower's hello; both ranks
   write and read it themselves with non-blocking calls (one connection for both directions: with
   one per direction every small message cost a bare ACK each way, 8-10 us half round trips
   instead of 5-6). A send writes what the kernel takes and, when it takes no more, reads this
   rank's connections and queues meanwhile (two ranks sending each other large messages never wait
   on each other); it returns once the kernel has the message, so the caller may reuse its buffer.
   A waiting rank polls its connections (without yields when every rank of this machine has a CPU of
   its own, as MPI's progress loop does; else with yields, as above) for up to 200 us, then sleeps
   in one zmq_poll over the connections, the ZeroMQ socket and the doorbell. Payloads longer than
   4 KiB are read straight into their message. The same connection serves every sub-ring.
   Who may connect. A connection's first 32 bytes must be a preamble: magic, version, ring size,
   the sender's rank and the token this rank sent that rank in its hello (16 random bytes per peer,
   sent over ZeroMQ to the endpoint the job named for it); until it has been checked (in constant
   time) nothing else the connection sent is read. A connection with a wrong preamble, a second
   one for a rank, one from a rank this rank dials, one that closes or says nothing for
   .timeout_ms (30 s when unset) is closed with one warning naming its address and why ("ring 0: refused a
   connection to its data port from 10.0.0.9:51234: a wrong token (not this job, or a stale
   one)"). The address a rank dials is the one the job's peer list names; only its port comes from
   the hello. Frames are decoded as shared memory's are (kvps_ring__frame_take: the magic and the
   length checked before anything is allocated; the sender checked against the connection's
   rank); a malformed stream closes the connection, naming its rank (tests/fuzz/fuzz_tcp.c fuzzes
   the preamble and the frames cut anywhere). The ring has no encryption (CURVE is the parameter
   server's): on an untrusted network keep the ring on a private one.
   Faults. A peer whose connection ends (closed, reset) after every byte it sent was read is named
   at once where a rank waits for it: "rank 2 (process 4242 at 10.0.0.3) closed its connection to
   this rank: it ended or died while this rank waited for it in allreduce of ..."; a send that
   fails says "its connection failed (Connection reset by peer)"; KVPS_ERR_PEER_LOST. A dialler
   that cannot connect (refused, or not within .timeout_ms, 30 s when unset) falls back to ZeroMQ for that pair and
   tells the other (NOTCP), before anything went over the connection. So the first message from
   the lower rank of a pair waits for the higher to have connected, which it does when it reads
   the lower's hello in any call on the ring: a peer that has not called the ring since it
   connected holds that message (as long as that rank lives, section 5; with .timeout_ms at most
   that: "timed out ... waiting for rank 3 to connect to this rank's data port"), where over
   ZeroMQ it was queued.
   Off: .shm = -1 or KVPS_RING_SHM=0 (no shared memory, DIRECT off), .tcp = -1 or KVPS_RING_TCP=0
   (no TCP connections: ZeroMQ), and ipc:// or inproc:// endpoints have no TCP; on other systems
   than Linux there is no shared memory.

   11. JOIN: RANKS WHOSE DATA ENDS FIRST (Horovod's hvd.join, PyTorch's Join)
       kvps_ring_create(&(kvps_ring_desc){ ..., .join = 1 }, &r);      // on every rank
       for (int s = 0; s < my_steps; s++) kvps_ring_allreduce(r, g, g, n, KVPS_FLOAT32, KVPS_AVG);
       kvps_ring_join(r);           // returns once every rank has called it
   On a ring made with .join = 1, a rank whose data has ended calls kvps_ring_join: it takes part
   in the others' all-reduces (every algorithm, a 16-bit wire too) and barriers with the op's
   identity as its input (0 for sum and avg, 1 for prod, the largest value for min, the smallest
   for max) until every rank has joined; then kvps_ring_join returns KVPS_OK on every rank and the
   ring is as before (the next epoch may use it). AVG divides by the ranks that have not joined
   (as Horovod; integers with truncation); sum, prod, min and max reduce over them alone.
   How every rank knows the same: each collective on such a ring starts with an agreement, a
   recursive-doubling all-reduce (int64 max, its header's layout "JOIN") of a flag per rank and
   the collective's parameters (collective, dtype, wire, op, count, root, algorithm, list
   layout) from the ranks that have not joined; a joined rank learns from it what to run, and
   every rank decides from the same bits. So it costs one small all-reduce per collective (8
   (size + 16) bytes; in the timeline as an allreduce of its own), and only on rings made with
   .join. While a rank has joined, another collective (reduce, broadcast, the v-collectives...,
   an all-reduce over a list of buffers) fails before any data moves on every rank, the same
   words everywhere: KVPS_ERR_STATE, "rank 0: broadcast called while rank(s) 3 had joined
   (kvps_ring_join): a joined rank takes part only in allreduce and barrier" (the ring is then
   broken, as after any error); ranks that have not joined and call different collectives get
   KVPS_ERR_MISMATCH naming the parameter. kvps_ring_joined(r, ranks, max) says how many ranks
   had joined at this rank's last collective (the same on every rank) and which. A joined rank
   waits for the others' next collective within .timeout_ms, like any wait on the ring, and holds
   the ring as a blocking collective does: its own posted operations run before it, p2p
   messages sent to it are kept until it receives them after kvps_ring_join returns.
*/
#ifndef KVPS__CORE_ZMQ
#define KVPS__CORE_ZMQ /* (core's ZeroMQ part: contexts and frames) */
#endif
#include "kvps_core.h"
#include "kvps_codec.h"
#include "kvps_launch.h"
#ifndef KVPS_RING_H
#define KVPS_RING_H

#ifdef __cplusplus
extern "C" {
#endif

/* Each enum ends in a _COUNT: one past its last value, the limit of every range check. */
typedef enum kvps_dtype {
    KVPS_FLOAT32 = 0, KVPS_FLOAT64 = 1, KVPS_INT32 = 2, KVPS_INT64 = 3, KVPS_FLOAT16 = 4, KVPS_BFLOAT16 = 5,
    KVPS_DTYPE_COUNT
} kvps_dtype;

typedef enum kvps_redop {
    KVPS_SUM = 0, KVPS_PROD = 1, KVPS_MIN = 2, KVPS_MAX = 3, KVPS_AVG = 4, KVPS_REDOP_COUNT
} kvps_redop;

typedef enum kvps_ring_algo {
    KVPS_ALGO_AUTO = 0, KVPS_ALGO_RING = 1, KVPS_ALGO_BIRING = 2, KVPS_ALGO_RD = 3, KVPS_ALGO_HIER = 4,
    KVPS_ALGO_RHD = 5, KVPS_ALGO_DIRECT = 6, KVPS_ALGO_ONESHOT = 7, KVPS_ALGO_COUNT
} kvps_ring_algo;

typedef enum kvps_coll { /* from 1 (0 is no collective), so KVPS_COLL_COUNT is the last + 1 */
    KVPS_COLL_ALLREDUCE = 1, KVPS_COLL_REDUCE, KVPS_COLL_REDUCE_SCATTER, KVPS_COLL_ALLGATHER,
    KVPS_COLL_BROADCAST, KVPS_COLL_GATHER, KVPS_COLL_SCATTER, KVPS_COLL_ALLTOALL, KVPS_COLL_BARRIER,
    KVPS_COLL_ALLGATHERV, KVPS_COLL_GATHERV, KVPS_COLL_SCATTERV, KVPS_COLL_ALLTOALLV, /* per-rank counts (section 8) */
    KVPS_COLL_COUNT
} kvps_coll;

/* kvps_ring_split's colour for a rank that joins no sub-ring (any negative colour does). */
#define KVPS_UNDEFINED (-1)

/* Zero means default.
   | field       | default                                       |
   | rank, size  | required, 0 <= rank < size                    |
   | peers       | NULL: call kvps_ring_connect later            |
   | bind        | this rank's entry of peers                    |
   | timeout_ms  | 0: none: a wait on a live peer lasts as long as it takes (section 5) |
   | chunk_bytes | 1 MiB (pipeline piece; measured best at 1-64 MB) |
   | algo        | KVPS_ALGO_AUTO                                |
   | small_bytes | 512 KiB (AUTO: RD at or below; measured crossover) |
   | groups      | NULL: one group (no HIER)                     |
   | zmq_ctx     | a context of its own; io_threads 1            |
   | io_cpus     | NULL: the OS places the I/O thread; "0-3": pinned (kvps.h, CPU PINNING) |
   | timeline    | NULL: $KVPS_TIMELINE, else none; "DIR": a timeline in DIR (kvps.h, TIMELINE) |
   | sndbuf_bytes| 0: 256 KiB to peers on a loopback address, the OS's autotuning to others; > 0: that for every peer; < 0: the OS's everywhere (section 4) |
   | shm         | 0: shared memory to peers on this host unless $KVPS_RING_SHM is 0; 1: on; -1: off (section 10) |
   | tcp         | 0: the ring's own TCP connections to the other peers unless $KVPS_RING_TCP is 0; 1: on; -1: off: ZeroMQ (section 10) |
   | stall_ms    | 60000: a wait this long is logged (warn), naming the rank waited for; -1: off (section 5) |
   | peer_timeout_ms | 5000: a peer whose ZeroMQ connection is down this long is gone (section 5) |
   | join        | 0: off; 1: kvps_ring_join may be called, each collective agreeing first on who has joined (section 11) | */
typedef struct kvps_ring_desc {
    int rank, size;
    const char *peers;
    const char *bind;
    int timeout_ms;
    size_t chunk_bytes;
    kvps_ring_algo algo;
    size_t small_bytes;
    const int *groups;
    void *zmq_ctx;
    int io_threads;
    const char *io_cpus;
    /* last, so that positional initialisers keep their meaning: */
    const char *timeline; /* a directory to write this rank's timeline into (kvps.h, TIMELINE); NULL:
                             the KVPS_TIMELINE environment variable, else none; "": none */
    int sndbuf_bytes;     /* SO_SNDBUF of the connections to peers (section 4): 0: 256 KiB to loopback
                             peers, the OS's autotuning to others; > 0: this to all; < 0: the OS's to all */
    int shm;              /* shared memory to peers on this host (section 10): 0: on unless $KVPS_RING_SHM
                             is 0; 1: on; -1: off (every peer over ZeroMQ) */
    int tcp;              /* the ring's own TCP connections to peers not reached through shared memory
                             (section 10): 0: on unless $KVPS_RING_TCP is 0; 1: on; -1: off (ZeroMQ) */
    int stall_ms;         /* the stall inspector: a wait on a peer this long is logged (warn), again every
                             stall_ms: 60000 (-1: off) (section 5) */
    int peer_timeout_ms;  /* ZMTP heartbeats every peer_timeout_ms / 5; a peer whose connection has been
                             down this long is gone (KVPS_ERR_PEER_LOST): 5000 (section 5) */
    int join;             /* 1: kvps_ring_join may be called (section 11): every collective first agrees,
                             in a small all-reduce, on who has joined; 0: off (no such cost) */
} kvps_ring_desc;

typedef struct kvps_ring_op {
    kvps_coll coll;
    const void *send;
    void *recv;
    size_t count;
    kvps_dtype dtype;
    kvps_redop op;
    int root;
    kvps_ring_algo algo; /* 0: the ring's */
    kvps_dtype wire;     /* all-reduce of float32: KVPS_FLOAT16 or KVPS_BFLOAT16 on the wire (0: as dtype) */
    /* the v-collectives (section 8; count unused): elements per rank and where each rank's
       block starts (displs NULL: packed, block i right after block i-1). counts / displs: the
       blocks of recv (allgatherv, gatherv), of send (scatterv), alltoallv's send side;
       recv_counts / recv_displs: alltoallv's receive side. Borrowed as the buffers are. */
    const size_t *counts, *displs;
    const size_t *recv_counts, *recv_displs;
} kvps_ring_op;

typedef struct kvps_ring kvps_ring;
typedef uint64_t kvps_ring_req;

KVPS_API kvps_result kvps_ring_create(const kvps_ring_desc *desc, kvps_ring **out);
KVPS_API const char *kvps_ring_endpoint(const kvps_ring *r);
KVPS_API kvps_result kvps_ring_connect(kvps_ring *r, const char *peers);
KVPS_API void kvps_ring_destroy(kvps_ring **r);
KVPS_API const char *kvps_ring_last_error(const kvps_ring *r);
KVPS_API size_t kvps_dtype_size(kvps_dtype dt);
/* Names for messages: "float32", "sum", "allreduce", "ring" ("?" for a value out of range). */
KVPS_API const char *kvps_dtype_name(kvps_dtype dt);
KVPS_API const char *kvps_redop_name(kvps_redop op);
KVPS_API const char *kvps_coll_name(kvps_coll c);
KVPS_API const char *kvps_algo_name(kvps_ring_algo a);

KVPS_API kvps_result kvps_ring_env_read(int *rank, int *size, const char **peers);

KVPS_API kvps_result kvps_ring_run(kvps_ring *r, const kvps_ring_op *op);
KVPS_API kvps_result kvps_ring_post(kvps_ring *r, const kvps_ring_op *op, kvps_ring_req *out);
KVPS_API kvps_result kvps_ring_wait(kvps_ring *r, kvps_ring_req req, int timeout_ms);
KVPS_API kvps_result kvps_ring_test(kvps_ring *r, kvps_ring_req req, int *done);

KVPS_API kvps_result kvps_ring_allreduce(kvps_ring *r, const void *send, void *recv, size_t count,
                                         kvps_dtype dt, kvps_redop op);
KVPS_API kvps_result kvps_ring_reduce(kvps_ring *r, const void *send, void *recv, size_t count,
                                      kvps_dtype dt, kvps_redop op, int root);
KVPS_API kvps_result kvps_ring_reduce_scatter(kvps_ring *r, const void *send, void *recv, size_t count,
                                              kvps_dtype dt, kvps_redop op);
KVPS_API kvps_result kvps_ring_allgather(kvps_ring *r, const void *send, void *recv, size_t count,
                                         kvps_dtype dt);
KVPS_API kvps_result kvps_ring_broadcast(kvps_ring *r, const void *send, void *recv, size_t count,
                                         kvps_dtype dt, int root);
KVPS_API kvps_result kvps_ring_gather(kvps_ring *r, const void *send, void *recv, size_t count,
                                      kvps_dtype dt, int root);
KVPS_API kvps_result kvps_ring_scatter(kvps_ring *r, const void *send, void *recv, size_t count,
                                       kvps_dtype dt, int root);
KVPS_API kvps_result kvps_ring_alltoall(kvps_ring *r, const void *send, void *recv, size_t count,
                                        kvps_dtype dt);
KVPS_API kvps_result kvps_ring_barrier(kvps_ring *r);

/* Uneven collectives (section 8): rank i's block has counts[i] elements (any dtype, 0 too) at
   element displs[i] of the buffer that holds every block (displs NULL: packed). Every rank
   passes the same counts (alltoallv: rank i's send_counts[j] equals rank j's recv_counts[i]);
   they are checked across ranks before any data moves, and a disagreement is
   KVPS_ERR_MISMATCH on every rank. In place: send NULL (allgatherv, gatherv's root: the block
   already at recv + displs[rank]; scatterv's root and alltoallv: the send layout in recv). */
KVPS_API kvps_result kvps_ring_allgatherv(kvps_ring *r, const void *send, void *recv, const size_t *counts,
                                          const size_t *displs, kvps_dtype dt);
KVPS_API kvps_result kvps_ring_gatherv(kvps_ring *r, const void *send, void *recv, const size_t *counts,
                                       const size_t *displs, kvps_dtype dt, int root);
KVPS_API kvps_result kvps_ring_scatterv(kvps_ring *r, const void *send, const size_t *counts, const size_t *displs,
                                        void *recv, kvps_dtype dt, int root);
KVPS_API kvps_result kvps_ring_alltoallv(kvps_ring *r, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, kvps_dtype dt);

/* Sub-rings (section 9), as MPI_Comm_split: collective over r; the ranks that pass the same
   colour (>= 0) form a sub-ring, ranked by key, ties by their rank in r; *out is NULL on a rank
   whose colour is negative (KVPS_UNDEFINED). A sub-ring is a kvps_ring: every call takes it, and
   splits again. It shares r's sockets; destroy it before the ring made by kvps_ring_create. */
KVPS_API kvps_result kvps_ring_split(kvps_ring *r, int colour, int key, kvps_ring **out);
KVPS_API int kvps_ring_rank(const kvps_ring *r); /* -1 for NULL */
KVPS_API int kvps_ring_size(const kvps_ring *r); /* 0 for NULL */
/* How this rank's messages reach rank `rank` of r (section 10): "shm" (shared memory), "tcp" (the
   pair's own TCP connection, made or on its way), "zmq" (ZeroMQ: TCP off or refused, an ipc:// or
   inproc:// endpoint, or not decided yet: every peer's hello is read by the first collective),
   "self", "?" (no such rank). */
KVPS_API const char *kvps_ring_transport(const kvps_ring *r, int rank);

/* Float32 all-reduce (sum) with 16-bit floats on the wire: half the bytes; sums are formed in
   float32, and each rank's partial result is rounded to the wire format before it is sent, so
   every rank ends with the same bits. */
KVPS_API kvps_result kvps_ring_allreduce_wire(kvps_ring *r, const void *send, void *recv, size_t count,
                                              kvps_redop op, kvps_dtype wire);
/* Sparse all-reduce: each rank keeps the k largest |buf + residual| entries (error feedback in
   residual, which may be NULL), the ranks all-gather their (index, value) pairs, and buf becomes
   their sum, added in rank order (the same bits everywhere). k must be the same on every rank. */
KVPS_API kvps_result kvps_ring_allreduce_topk(kvps_ring *r, float *buf, size_t count, size_t k, float *residual);

/* Point-to-point (manual section 7): count elements of dtype dt between this rank and any rank
   (itself too), matched by (rank, tag); a receive must name the same count and dtype as the send.
   Blocking forms return when buf may be reused (send) or holds the message (recv); the i-forms
   return a request for kvps_ring_wait / kvps_ring_test, and borrow buf until it is done. */
KVPS_API kvps_result kvps_ring_send(kvps_ring *r, const void *buf, size_t count, kvps_dtype dt, int dst, uint32_t tag);
KVPS_API kvps_result kvps_ring_recv(kvps_ring *r, void *buf, size_t count, kvps_dtype dt, int src, uint32_t tag);
KVPS_API kvps_result kvps_ring_isend(kvps_ring *r, const void *buf, size_t count, kvps_dtype dt, int dst, uint32_t tag,
                                     kvps_ring_req *out);
KVPS_API kvps_result kvps_ring_irecv(kvps_ring *r, void *buf, size_t count, kvps_dtype dt, int src, uint32_t tag,
                                     kvps_ring_req *out);

/* Join (manual section 11; a ring made with .join = 1): a rank whose data has ended calls
   kvps_ring_join; it takes part in the others' allreduce and barrier calls with op's identity as
   its input (0 for sum and avg) until every rank has joined, then returns KVPS_OK on every rank.
   AVG divides by the ranks that have not joined. Another collective called meanwhile fails on
   every rank (KVPS_ERR_STATE, naming it and the joined ranks). kvps_ring_joined: how many ranks
   had joined at this rank's last collective, and (ranks non-NULL) the first max of them. */
KVPS_API kvps_result kvps_ring_join(kvps_ring *r);
KVPS_API int kvps_ring_joined(const kvps_ring *r, int *ranks, int max);

/* dst[i] = dst[i] op src[i], as the collectives reduce (exposed for tests and users). */
KVPS_API void kvps_reduce_into(void *dst, const void *src, size_t n, kvps_dtype dt, kvps_redop op);

#ifdef __cplusplus
}
#endif
#endif /* KVPS_RING_H */

/* ============================================================================================ */
#if defined(KVPS_IMPLEMENTATION) || defined(KVPS_RING_IMPLEMENTATION)
/* Sections (grep "// >>name"), lowest layer first:
     shm          shared memory between ranks on one host: segments, byte queues, the one frame
                  decoder (queues and connections), futex bells, liveness, process_vm_readv, the
                  host's identity
     tcp          the ring's own TCP connections: sockets, the preamble and its check
     types        the wire header, stashed pieces, the zero-copy block, posted jobs, the
                  collectives' row, the family (what a ring and its sub-rings share), the ring
     timeline     a collective and its phases in the rank's timeline (kvps_core.h's writer)
     reduce       element sizes; dst op= src and AVG's division, per dtype and op
     transport    the transports (hellos; a peer's queue, the pair's connection or ZeroMQ; waiting
                  on all; liveness: processes, connections, heartbeats; deadlines; the stall
                  inspector),
                  then frames to and from peers: send, receive (stash, mismatch, abort),
                  zero-copy; p2p messages kept apart whoever reads them; a sub-ring's handed to it
     elements     pieces of elements: the 16-bit wire, receive-and-reduce
     ring         pipelined ring: reduce-scatter, all-gather, (bi)ring all-reduce, chain broadcast
     list         the ring all-reduce over a list of buffers, in place (kvps_fuse.h's allreduce_many)
     rhd          Rabenseifner: recursive halving reduce-scatter, recursive doubling all-gather
     small        latency-bound: recursive doubling all-reduce, binomial-tree broadcast and reduce
     views        an algorithm over a view of the ranks, chosen by size; DIRECT; the hierarchical all-reduce
     collectives  one function per kvps_coll (even and uneven blocks alike; the v-collectives'
                  count check), their table and dispatcher; the checks of an op
     queue        running an op: in the caller's thread, or posted to the ring's own thread
     p2p          point-to-point: taking the ring from its thread, keeping and matching messages,
                  eager and answered sends, send / recv / isend / irecv and their wait and test
     api          the collective calls; the sparse all-reduce
     join         kvps_ring_join: the agreement before each collective of a .join ring, its verdict,
                  a joined rank's loop
     setup        create, connect, destroy; a family's sockets; kvps_ring_split
     environment  rank, size and peers from the launcher's variables (the rendezvous through
                  kvps servers, kvps_ring_rendezvous, is kvps.h's) */
#ifndef KVPS_RING__IMPLEMENTED
#define KVPS_RING__IMPLEMENTED

// >>shm
/* Shared memory between ranks on one host (manual section 10). Each rank of a family's first
   ring makes one segment at connect: a header page (its futex word, pid, whether its ring is
   closed) and a queue per rank of the family, queue p carrying rank p's messages to the owner:
   a control page (tail: bytes written, by p; head: bytes read, by the owner; want_room: p
   sleeps for room) and cap bytes used as a byte stream. A message is [u64 length][40 B header]
   [payload]. A writer that finds no room writes what fits and waits, reading its own queues
   meanwhile (kept on the family's ready list), so two ranks sending to each other never wait on
   each other; the owner copies a message out as it comes (a large one in parts). The segment is
   sparse: only peers on this host touch their queue's pages, and each reserves them
   (posix_fallocate) when it maps the segment, so a /dev/shm that is too small shows at once and
   that pair keeps ZeroMQ. Everything read from a segment is checked before use: the indices
   against cap, the length against KVPS_RING__SHM_MSG_MAX, the header's magic; the reader
   (>>transport) checks the sender. Linux only; elsewhere every peer is reached over ZeroMQ. */
#if defined(__linux__)
#define KVPS_RING__HAS_SHM 1
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <linux/futex.h>
#ifndef __cplusplus
long syscall(long number, ...); /* (<unistd.h> declares it only for _DEFAULT_SOURCE) */
#endif
#else
#define KVPS_RING__HAS_SHM 0
#endif

enum { KVPS_RING__SHM_MAGIC = 0x4D48534Bu, KVPS_RING__SHM_PAGE = 4096, KVPS_RING__SHM_PRE = 8 + 40 }; /* PRE: length + header */
#ifndef KVPS_RING__SHM_MSG_MAX /* (fuzz_shm.c sets a small one: the fuzzer's allocator refuses 2^40) */
#define KVPS_RING__SHM_MSG_MAX ((uint64_t)1 << 40)
#endif

typedef struct kvps_ring__shm_head { /* a segment's first page */
    uint32_t magic, size;     /* the family's size */
    uint64_t cap;             /* data bytes per queue */
    int32_t pid, closed;      /* the owner's process; closed: its ring is destroyed, writers drop what they send */
    uint32_t pad0[10];
    uint32_t bell, pad1[15];  /* futex word: bumped by whoever gives the owner something to do */
    uint32_t sleeping, pad2[15];
} kvps_ring__shm_head;

typedef struct kvps_ring__shm_ctl { /* a queue's control page */
    uint64_t tail, pad0[7];   /* bytes written, by the writer */
    uint64_t head, pad1[7];   /* bytes read, by the owner */
    uint32_t want_room, pad2[15]; /* the writer sleeps on its own bell until there is room */
    uint32_t mapped, pad3[15];    /* the writer has mapped the segment (the owner may unlink it) */
} kvps_ring__shm_ctl;

/* The message being read from one byte stream (a peer's queue, a peer's TCP connection): its
   [u64 length][40 B header] as it comes (pre), then its payload (m). */
typedef struct kvps_ring__frame_rd {
    int on;                               /* 1: pre is whole and checked, the payload is coming */
    unsigned char pre[KVPS_RING__SHM_PRE]; /* the length, then the header (pre + 8) */
    size_t pre_got;
    zmq_msg_t m;
    uint64_t len, got;
} kvps_ring__frame_rd;

/* What a rank knows of each rank of its family's first ring (>>transport's hello). */
typedef struct kvps_ring__peer {
    int64_t looked;                           /* when its process was last looked at (kvps_ring__x_gone) */
    int gone;
    /* hello read; on this host; this rank's messages to it go through its segment; its come
       through this rank's (1; 2: malformed, read no more); it said NOSHM (it will not map this
       rank's segment); a message other than the hello went to it over ZeroMQ (destroy lingers) */
    unsigned char hello, same, out, in, said, zsent;
    unsigned char cma;                        /* on this host, the same user, and its hello says its memory may
                                                 be read and it can read others' (DIRECT) */
    int32_t pid;
    uint64_t host;                            /* a hash of its host identity */
    unsigned char *seg;                       /* its segment (out) */
    size_t seg_bytes;
    unsigned char bell[112];                  /* its doorbell's address (a struct sockaddr_un) */
    unsigned bell_len;
    kvps_ring__frame_rd rd;                   /* its message being read from this rank's segment */
    /* TCP (>>tcp): the pair's one connection (-1 none), made by the higher rank of the two to
       the lower's data port; topen: proven (its preamble sent, or read here) and read, counted in
       in_tcp; tready: it may have bytes (the last poll said so, or the last read filled the
       buffer); tend: how it ended (1 closed by the peer, 2 reset or failed, 3 malformed); twait:
       this rank's route to it waits for the connection (tdial: this rank is dialling it, since
       tsince); its endpoint's host (peers) and its data port (hello); the token this rank shows
       it (its hello); bytes read and not decoded yet, and the message being decoded */
    int tfd;
    unsigned char topen, tready, tend, twait, tdial;
    int64_t tsince;
    uint16_t tport;
    char thost[64];
    int tsndbuf;                              /* SO_SNDBUF for tfd (manual section 4), 0: the OS's */
    unsigned char tok_out[16];
    unsigned char *rx;
    size_t rx_off, rx_len;
    kvps_ring__frame_rd trd;
    /* liveness (>>transport, kvps_ring__x_watch): its ZeroMQ connection's handshake succeeded once
       (zup); since when it has been down after a drop or a failed handshake (0: up, or never made) */
    unsigned char zup;
    int64_t zdown;
} kvps_ring__peer;

static size_t kvps_ring__shm_bytes(uint32_t size, uint64_t cap) {
    return KVPS_RING__SHM_PAGE + (size_t)size * (KVPS_RING__SHM_PAGE + (size_t)cap);
}
static size_t kvps_ring__shm_off(uint64_t cap, int p) { /* queue p's place in a segment */
    return KVPS_RING__SHM_PAGE + (size_t)p * (KVPS_RING__SHM_PAGE + (size_t)cap);
}
static kvps_ring__shm_ctl *kvps_ring__shm_q(unsigned char *seg, uint64_t cap, int p) {
    return (kvps_ring__shm_ctl *)(void *)(seg + kvps_ring__shm_off(cap, p));
}

/* Copies n bytes into stream position pos of a queue's data (cap bytes, wrapping). */
static void kvps_ring__shm_put(unsigned char *d, uint64_t cap, uint64_t pos, const void *src, size_t n) {
    size_t at = (size_t)(pos % cap), first = n < cap - at ? n : (size_t)(cap - at);
    memcpy(d + at, src, first);
    if (n > first) memcpy(d, (const char *)src + first, n - first);
}

/* Takes bytes [p, p + n) of a stream toward the message being read, st: 1 when a message is
   complete (its header at st->pre + 8; st->m, the payload, is the caller's), *used the bytes
   taken; 0 when all n were taken and the message needs more; -1 when the stream is malformed
   (*why says how; nothing more can be read from it), -2 no memory. The header must start with
   magic and the length be at most max: both are checked before anything is allocated.
   The one decoder of what a peer writes, under both of its sources: a shared-memory queue
   (kvps_ring__shm_take) and a TCP connection (>>tcp; tests/fuzz/fuzz_shm.c and fuzz_tcp.c). */
static int kvps_ring__frame_take(kvps_ring__frame_rd *st, const unsigned char *p, size_t n, size_t *used, uint32_t magic,
                                 uint64_t max, const char **why) {
    size_t u = 0;
    *used = 0;
    if (!st->on) {
        size_t a = sizeof st->pre - st->pre_got < n ? sizeof st->pre - st->pre_got : n;
        memcpy(st->pre + st->pre_got, p, a);
        st->pre_got += a;
        u = *used = a;
        if (st->pre_got < sizeof st->pre) return 0;
        uint32_t m;
        memcpy(&st->len, st->pre, 8);
        memcpy(&m, st->pre + 8, 4);
        st->pre_got = 0;
        if (m != magic) { *why = "a message without the ring's magic"; return -1; }
        if (st->len > max) { *why = "a message longer than the largest a ring sends"; return -1; }
        if (zmq_msg_init_size(&st->m, (size_t)st->len) != 0) return -2;
        st->on = 1;
        st->got = 0;
    }
    uint64_t k = st->len - st->got < n - u ? st->len - st->got : n - u;
    if (k) memcpy((char *)zmq_msg_data(&st->m) + st->got, p + u, (size_t)k);
    st->got += k;
    *used = u + (size_t)k;
    if (st->got < st->len) return 0;
    st->on = 0;
    return 1;
}

/* Takes what queue c (data d, cap bytes) holds toward the message being read, st, through
   kvps_ring__frame_take (its results), the queue's indices checked first: they must not say it
   holds more than cap. */
static int kvps_ring__shm_take(kvps_ring__shm_ctl *c, const unsigned char *d, uint64_t cap, uint32_t magic,
                               kvps_ring__frame_rd *st, const char **why) {
    uint64_t head = __atomic_load_n(&c->head, __ATOMIC_RELAXED), tail = __atomic_load_n(&c->tail, __ATOMIC_ACQUIRE);
    uint64_t avail = tail - head;
    if (avail > cap) { *why = "its indices say it holds more than its capacity"; return -1; }
    int got = 0;
    while (avail && got == 0) { /* (at most twice: the bytes up to the end of the data, then from its start) */
        size_t at = (size_t)(head % cap), n = avail < cap - at ? (size_t)avail : (size_t)(cap - at), used = 0;
        got = kvps_ring__frame_take(st, d + at, n, &used, magic, KVPS_RING__SHM_MSG_MAX, why);
        head += used;
        avail -= used;
    }
    __atomic_store_n(&c->head, head, __ATOMIC_RELEASE);
    return got;
}

#if KVPS_RING__HAS_SHM
static void kvps_ring__futex_wake(uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }
static void kvps_ring__futex_wait(uint32_t *w, uint32_t seen, int64_t ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    syscall(SYS_futex, w, FUTEX_WAIT, seen, &ts, NULL, 0);
}
#else
static void kvps_ring__futex_wake(uint32_t *w) { (void)w; }
static void kvps_ring__futex_wait(uint32_t *w, uint32_t seen, int64_t ms) { (void)w; (void)seen; (void)ms; }
#endif

/* Gives a segment's owner something to do: its bell rung, and a sleeper woken: on its futex
   (sleeping 1), or, asleep in zmq_poll over its ZeroMQ socket and its doorbell socket (sleeping
   2: some of its peers are over ZeroMQ), by a datagram to the doorbell at addr (tx: a socket to
   send it from; -1: none). */
static void kvps_ring__shm_ring(unsigned char *seg, int tx, const void *addr, unsigned addr_len) {
    kvps_ring__shm_head *hd = (kvps_ring__shm_head *)(void *)seg;
    __atomic_add_fetch(&hd->bell, 1, __ATOMIC_SEQ_CST);
    uint32_t how = __atomic_load_n(&hd->sleeping, __ATOMIC_SEQ_CST);
    if (how == 1) kvps_ring__futex_wake(&hd->bell);
#if KVPS_RING__HAS_SHM
    else if (how == 2 && tx >= 0 && addr_len) sendto(tx, "", 1, MSG_DONTWAIT, (const struct sockaddr *)addr, (socklen_t)addr_len);
#else
    (void)tx; (void)addr; (void)addr_len;
#endif
}

/* A rank's doorbell: a datagram socket at an abstract address named after its segment (the
   abstract names belong to the network namespace: the host's). -1 where it cannot be made. */
static void kvps_ring__bell_addr(const char *seg_name, void *addr, unsigned *addr_len) {
#if KVPS_RING__HAS_SHM
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(seg_name) < sizeof a.sun_path - 1 ? strlen(seg_name) : sizeof a.sun_path - 1;
    memcpy(a.sun_path + 1, seg_name, n); /* sun_path[0] = 0: abstract */
    *addr_len = seg_name[0] ? (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + n) : 0;
    memcpy(addr, &a, sizeof a);
#else
    (void)seg_name; (void)addr;
    *addr_len = 0;
#endif
}

/* This rank's doorbell bound at its address (seg_name's), and a socket to ring others' from;
   0, or -1 (they stay -1: sleeps then take turns between zmq_poll and the futex). */
static int kvps_ring__bell_open(const char *seg_name, int *rx, int *tx) {
#if KVPS_RING__HAS_SHM
    unsigned char addr[sizeof(struct sockaddr_un)];
    unsigned len;
    kvps_ring__bell_addr(seg_name, addr, &len);
    *rx = *tx = -1;
    if (!len) return -1;
    int a = socket(AF_UNIX, SOCK_DGRAM, 0), b = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (a < 0 || b < 0 || bind(a, (const struct sockaddr *)(void *)addr, (socklen_t)len) != 0) {
        if (a >= 0) close(a);
        if (b >= 0) close(b);
        return -1;
    }
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
    fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK);
    fcntl(a, F_SETFD, FD_CLOEXEC);
    fcntl(b, F_SETFD, FD_CLOEXEC);
    *rx = a;
    *tx = b;
    return 0;
#else
    (void)seg_name;
    *rx = *tx = -1;
    return -1;
#endif
}


/* Process pid's state letter in /proc/PID/stat (R running, S sleeping, D disk, T stopped, t
   traced, Z zombie, X dead), 0 when it cannot be read. */
static char kvps_ring__pid_state(int32_t pid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *fp = fopen(path, "r");
    if (!fp) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    const char *close = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and ')' */
    return close && close[1] == ' ' ? close[2] : 0;
}

/* Whether process pid is gone (exited, or a zombie no one has reaped). */
static int kvps_ring__pid_gone(int32_t pid) {
    if (pid <= 0 || pid == (int32_t)getpid()) return 0;
    if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
    char st = kvps_ring__pid_state(pid);
    return st == 'Z' || st == 'X';
}

/* Copies bytes at addr in process pid to dst: 0, or -1 with errno (ESRCH: the process is gone;
   EFAULT: the range is not mapped there any more, as when a peer left a call after a failure
   and freed its buffer; EPERM: refused). The system call also for this process (a peer thread's
   buffer), so that a freed buffer is an error, never a crash. */
static int kvps_ring__cma_read(int32_t pid, uint64_t addr, void *dst, size_t bytes) {
#if KVPS_RING__HAS_SHM && defined(SYS_process_vm_readv)
    while (bytes) {
        struct iovec l = {dst, bytes}, rm = {(void *)(uintptr_t)addr, bytes};
        long got = syscall(SYS_process_vm_readv, (long)pid, &l, 1L, &rm, 1L, 0L);
        if (got <= 0) { if (got == 0) errno = EFAULT; return -1; }
        dst = (char *)dst + got;
        addr += (uint64_t)got;
        bytes -= (size_t)got;
    }
    return 0;
#else
    (void)addr; (void)dst; (void)bytes;
    errno = ENOSYS;
    return -1;
#endif
}

/* Why this process's peers of the same user may not read its memory or it theirs, NULL when
   they may: Yama's ptrace_scope must be absent or 0 (1, Ubuntu's default, lets a process read
   only its descendants), and process_vm_readv not refused (a sandbox: a read of this process's
   own memory tells). */
static const char *kvps_ring__cma_refused(void) {
#if KVPS_RING__HAS_SHM && defined(SYS_process_vm_readv)
    FILE *fp = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = 0;
    if (fp) { if (fscanf(fp, "%d", &scope) != 1) scope = 1; fclose(fp); }
    if (scope != 0) return "Yama's ptrace_scope is not 0 (kernel.yama.ptrace_scope: 1 lets a process read only its descendants)";
    static const uint64_t word = 0x6b767073u;
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, rm = {(void *)(uintptr_t)&word, sizeof word};
    if (syscall(SYS_process_vm_readv, (long)getpid(), &l, 1L, &rm, 1L, 0L) != (long)sizeof got || got != word)
        return "process_vm_readv is refused here (a sandbox or an old kernel)";
    return NULL;
#else
    return "not Linux";
#endif
}

/* This host (kvps_launch.h's kvps__host_ident: boot id, namespaces, /dev/shm). */
#define kvps_ring__host_ident kvps__host_ident

/* Removes segments left by processes that are gone (killed before they could unlink theirs):
   "/dev/shm/kvps-ring-PID-..." whose PID no longer runs and that are over a minute old (a live
   job unlinks its own within its first collective; the age keeps a segment of a process in
   another PID namespace that shares this /dev/shm from being taken for a dead one's). */
static void kvps_ring__shm_sweep(void) {
#if KVPS_RING__HAS_SHM
    DIR *dir = opendir("/dev/shm");
    if (!dir) return;
    struct dirent *e;
    while ((e = readdir(dir))) {
        int pid = 0;
        if (strncmp(e->d_name, "kvps-ring-", 10) != 0 || sscanf(e->d_name + 10, "%d-", &pid) != 1) continue;
        if (!kvps_ring__pid_gone(pid) || kill((pid_t)pid, 0) == 0) continue; /* (a zombie's is left to its reaping) */
        char name[300], path[300];
        struct stat st;
        snprintf(name, sizeof name, "/%.250s", e->d_name);
        snprintf(path, sizeof path, "/dev/shm/%.250s", e->d_name);
        if (stat(path, &st) != 0 || time(NULL) - st.st_mtime < 60) continue;
        if (shm_unlink(name) == 0) kvps__log(KVPS_LOG_INFO, "ring: removed %s, left by process %d, which is gone", name, pid);
    }
    closedir(dir);
#endif
}

/* Makes this rank's segment, name and mapping out; 0, or -1 with *why. */
static int kvps_ring__shm_make(uint32_t size, uint64_t cap, char *name, size_t name_cap, unsigned char **out,
                               const char **why) {
#if KVPS_RING__HAS_SHM
    static uint32_t counter;
    uint64_t salt = kvps__mix64((uint64_t)kvps__now_us() ^ ((uint64_t)(uintptr_t)out << 17)) ^
                    (uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(name, name_cap, "/kvps-ring-%d-%016llx", (int)getpid(), (unsigned long long)salt);
    size_t bytes = kvps_ring__shm_bytes(size, cap);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) { *why = "shm_open"; name[0] = 0; return -1; }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0 && posix_fallocate(fd, 0, KVPS_RING__SHM_PAGE) == 0)
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) { *why = "ftruncate, posix_fallocate or mmap"; shm_unlink(name); name[0] = 0; return -1; }
    kvps_ring__shm_head *hd = (kvps_ring__shm_head *)p;
    hd->size = size;
    hd->cap = cap;
    hd->pid = (int32_t)getpid();
    __atomic_store_n(&hd->magic, KVPS_RING__SHM_MAGIC, __ATOMIC_RELEASE);
    *out = (unsigned char *)p;
    return 0;
#else
    (void)size; (void)cap; (void)name; (void)name_cap; (void)out;
    *why = "not Linux";
    return -1;
#endif
}

/* Maps peer `me`'s view of another rank's segment `name` (its hello said size and cap) and
   reserves queue `me`'s pages in it; 0, or -1 with *why. */
static int kvps_ring__shm_map(const char *name, uint32_t size, uint64_t cap, int me, unsigned char **out, size_t *out_bytes,
                              const char **why) {
#if KVPS_RING__HAS_SHM
    size_t bytes = kvps_ring__shm_bytes(size, cap);
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) { *why = errno == ENOENT ? "it is gone (its ring was destroyed)" : "shm_open refused"; return -1; }
    struct stat st;
    size_t off = kvps_ring__shm_off(cap, me);
    int e = fstat(fd, &st) != 0 || (size_t)st.st_size != bytes ? -1 : posix_fallocate(fd, (off_t)off, (off_t)(KVPS_RING__SHM_PAGE + cap));
    void *p = MAP_FAILED;
    if (e == 0) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *why = e == ENOSPC ? "/dev/shm is full (a container's default is 64 MB: docker run --shm-size)"
               : e < 0     ? "its size is not what its hello said"
                           : "posix_fallocate or mmap failed";
        return -1;
    }
    const kvps_ring__shm_head *hd = (const kvps_ring__shm_head *)p;
    if (__atomic_load_n(&hd->magic, __ATOMIC_ACQUIRE) != KVPS_RING__SHM_MAGIC || hd->size != size || hd->cap != cap) {
        munmap(p, bytes);
        *why = "its header is not what its hello said";
        return -1;
    }
    *out = (unsigned char *)p;
    *out_bytes = bytes;
    return 0;
#else
    (void)name; (void)size; (void)cap; (void)me; (void)out; (void)out_bytes;
    *why = "not Linux";
    return -1;
#endif
}

static void kvps_ring__shm_unmap(unsigned char *seg, size_t bytes) {
#if KVPS_RING__HAS_SHM
    if (seg) munmap(seg, bytes);
#else
    (void)seg; (void)bytes;
#endif
}
static void kvps_ring__shm_unlink_name(char *name) {
#if KVPS_RING__HAS_SHM
    if (name[0]) shm_unlink(name);
#endif
    name[0] = 0;
}

// >>tcp
/* The ring's own TCP connections (manual section 10): one per pair of ranks on different hosts
   (or on one host with shared memory off), made by the higher rank of the two to the lower's
   data port, which listens on the address the rank's ZeroMQ socket is bound to; read and written
   by both ranks' own threads with non-blocking system calls, no I/O thread between. A connection
   starts with a preamble (kvps_ring__tcp_auth_make) that names the dialler's rank and shows the
   token the other gave that rank in its hello (over ZeroMQ, to the endpoint the job named for it):
   nothing else a connection sends is read before the preamble is checked, and a connection whose
   preamble is wrong, or that sends none within the timeout, is closed with a warning naming its
   address. Then frames as in shared memory, [u64 length][40 B header][payload], read by
   kvps_ring__frame_take. Here: the socket calls, the preamble and its check. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/uio.h>

enum {
    KVPS_RING__TCP_MAGIC = 0x5450564Bu, /* "KVPT" */
    KVPS_RING__TCP_VERSION = 1,
    KVPS_RING__TCP_AUTH = 32,           /* the preamble's bytes */
    KVPS_RING__TCP_RX = 16384,          /* a connection's read buffer (small messages: several per read) */
    KVPS_RING__TCP_DIRECT = 4096,       /* the rest of a payload at least this long is read straight into its message */
    KVPS_RING__TCP_PEND = 32            /* connections accepted and not yet proven, at most */
};

/* A connection's preamble: u32 magic | u16 version | u16 src (the sender's rank in the family's
   first ring) | u32 size (the ring's) | u32 0 | token[16]. */
static void kvps_ring__tcp_auth_make(unsigned char *b, int src, int size, const unsigned char *token) {
    uint32_t m = KVPS_RING__TCP_MAGIC, sz = (uint32_t)size, zero = 0;
    uint16_t v = KVPS_RING__TCP_VERSION, s16 = (uint16_t)src;
    memcpy(b, &m, 4);
    memcpy(b + 4, &v, 2);
    memcpy(b + 6, &s16, 2);
    memcpy(b + 8, &sz, 4);
    memcpy(b + 12, &zero, 4);
    memcpy(b + 16, token, 16);
}

/* Checks a preamble read from a connection to rank me of a ring of `size`, whose token for rank i
   is tokens[16 i .. 16 i + 16): 0 and *src, or -1 and *why. The decoder of the first bytes a
   stranger can send (tests/fuzz/fuzz_tcp.c). The token is compared in constant time. */
static int kvps_ring__tcp_auth_check(const unsigned char *b, int size, int me, const unsigned char *tokens, int *src,
                                     const char **why) {
    uint32_t m, sz;
    uint16_t v, s16;
    memcpy(&m, b, 4);
    memcpy(&v, b + 4, 2);
    memcpy(&s16, b + 6, 2);
    memcpy(&sz, b + 8, 4);
    if (m != KVPS_RING__TCP_MAGIC) { *why = "not a kvps ring connection"; return -1; }
    if (v != KVPS_RING__TCP_VERSION) { *why = "another version of kvps"; return -1; }
    if (sz != (uint32_t)size) { *why = "a ring of another size"; return -1; }
    if ((int)s16 >= size || (int)s16 == me) { *why = "it names no peer rank"; return -1; }
    unsigned diff = 0;
    for (int i = 0; i < 16; i++) diff |= (unsigned)(b[16 + i] ^ tokens[16 * (size_t)s16 + (size_t)i]);
    if (diff) { *why = "a wrong token (not this job, or a stale one)"; return -1; }
    *src = s16;
    return 0;
}

/* n random bytes from the kernel: 0, or -1 (no TCP transport then: a guessable token would let
   strangers in). */
static int kvps_ring__tcp_random(unsigned char *b, size_t n) {
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, b + got, n - got);
        if (k <= 0 && !(k < 0 && errno == EINTR)) break;
        if (k > 0) got += (size_t)k;
    }
    close(fd);
    return got == n ? 0 : -1;
}

/* The host of a "tcp://HOST:PORT" endpoint ("[::1]" without its brackets): 0, or -1 (another
   transport, or too long). */
static int kvps_ring__tcp_host(const char *ep, char *host, size_t cap) {
    if (!ep || strncmp(ep, "tcp://", 6) != 0) return -1;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    if (!colon || colon == h) return -1;
    size_t n = (size_t)(colon - h);
    if (h[0] == '[' && n >= 2 && h[n - 1] == ']') { h++; n -= 2; }
    const char *semi = (const char *)memchr(h, ';', n); /* (ZeroMQ's "tcp://src;dst" form: the destination is what counts) */
    if (semi) { n -= (size_t)(semi + 1 - h); h = semi + 1; }
    if (n == 0 || n >= cap) return -1;
    memcpy(host, h, n);
    host[n] = 0;
    return 0;
}

static void kvps_ring__tcp_opts(int fd) {
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Listens on host (the address this rank's ZeroMQ socket is bound to; "*" and "0.0.0.0": every
   address), on a port the kernel picks: the socket, and *port; -1 when it cannot. */
static int kvps_ring__tcp_listen(const char *host, uint16_t *port) {
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const char *h = strcmp(host, "*") == 0 ? NULL : host;
    if (getaddrinfo(h, "0", &hints, &ai) != 0 || !ai) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (fd >= 0 && (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0 ||
                    getsockname(fd, (struct sockaddr *)&sa, &len) != 0)) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    *port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

/* Starts a connection to host:port (non-blocking: it completes later, kvps_ring__tcp_dialled):
   the socket, -1 when it cannot even start. sndbuf > 0: its SO_SNDBUF (manual section 4). */
static int kvps_ring__tcp_dial(const char *host, uint16_t port, int sndbuf) {
    struct addrinfo hints, *ai = NULL;
    char ps[8];
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(ps, sizeof ps, "%u", (unsigned)port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd >= 0) {
        kvps_ring__tcp_opts(fd);
        if (sndbuf > 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) { close(fd); fd = -1; }
    }
    freeaddrinfo(ai);
    return fd;
}

/* Waits at most ms for a started connection: 0 made, 1 not yet, -1 failed (errno). */
static int kvps_ring__tcp_dialled(int fd, int64_t ms) {
    struct pollfd p;
    p.fd = fd;
    p.events = POLLOUT;
    p.revents = 0;
    int n = poll(&p, 1, ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int)ms);
    if (n < 0) return errno == EINTR ? 1 : -1;
    if (n == 0) return 1;
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
    if (err) { errno = err; return -1; }
    return 0;
}

/* "ADDR:PORT" of a connection's far end. */
static void kvps_ring__tcp_far(int fd, char *buf, size_t cap) {
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0) {
        if (sa.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, a, sizeof a);
            port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
        } else if (sa.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, a, sizeof a);
            port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
        }
    }
    snprintf(buf, cap, "%s:%u", a, port);
}


// >>types
enum {
    KVPS_RING__MAGIC = 0x5250564Bu,
    KVPS_RING__ZC_MIN = 32768,
    KVPS_RING__RHD_MAX = 16 << 20, /* AUTO: RHD up to here (power-of-two sizes from 4), RING above */
    KVPS_RING__DIRECT_MIN = 1 << 20, /* AUTO: DIRECT from here with 3 ranks or more, where it can run (BENCHMARKS.md) */
    KVPS_RING__SPIN = 16,          /* a collective's receive: non-blocking polls, each after a yield, before it sleeps */
    KVPS_RING__SPIN_US = 200,      /* ... or fewer: until this long has passed (a busy CPU: a yield costs a time slice) */
    KVPS_RING__PEEK = 256,         /* shared memory: looks at the queues (a pause between) before the first yield */
    /* with no .timeout_ms (section 5), the bounds of waits on peers not known to be alive: a hello
       (a rank that never connected), and a connection to the data port that is being made or has
       not proven itself (>>tcp) */
    KVPS_RING__HELLO_MS = 300000, KVPS_RING__PROVE_MS = 30000,
    /* tag phases */
    KVPS_RING__PH_RS = 1, KVPS_RING__PH_AG = 2, KVPS_RING__PH_RD = 3, KVPS_RING__PH_RDPRE = 4,
    KVPS_RING__PH_RDPOST = 5, KVPS_RING__PH_BCAST = 6, KVPS_RING__PH_TREE = 7, KVPS_RING__PH_GATHER = 8,
    KVPS_RING__PH_SCATTER = 9, KVPS_RING__PH_A2A = 10, KVPS_RING__PH_BARRIER = 11, KVPS_RING__PH_RH = 12,
    KVPS_RING__PH_RHAG = 13, KVPS_RING__PH_VCOUNT = 14, KVPS_RING__PH_DIRECT = 15, KVPS_RING__PH_ONESHOT = 16,
    /* join (>>join): the agreement's header carries this layout ("JOIN"); the parameters it agrees on */
    KVPS_RING__JOIN_LAYOUT = 0x4A4F494E, KVPS_RING__JOIN_NP = 8
};

typedef struct kvps_ring__hdr {
    uint32_t magic, seq;
    uint64_t tag;
    uint16_t src;
    uint8_t coll, dtype, op, abort;
    uint16_t root;
    uint64_t count;
    uint32_t ring;   /* which ring of the family: 0 the one kvps_ring_create made, else a sub-ring's id */
    uint32_t layout; /* 0; an all-reduce over a list of buffers: a hash of the list's counts (>>list) */
} kvps_ring__hdr;
typedef char kvps_ring__hdr_check[sizeof(kvps_ring__hdr) == 40 ? 1 : -1];

typedef struct kvps_ring__stash {
    struct kvps_ring__stash *next;
    kvps_ring__hdr h;
    zmq_msg_t payload;
} kvps_ring__stash;

/* Frames sent without a copy are released by ZeroMQ's I/O thread, possibly after the ring is
   gone (an inproc peer that never reads holds them): so the counters live in their own block,
   freed by whichever of the ring and the last frame lets go last. */
typedef struct kvps_ring__zc {
    int pending[2]; /* per ring phase */
    int refs;       /* 1 for the ring + 1 per frame held */
    int waiting;    /* kvps_ring__zc_drain sleeps on cv: the frame that empties a phase wakes it */
    pthread_mutex_t mu;
    pthread_cond_t cv;
} kvps_ring__zc;

static kvps_ring__zc *kvps_ring__zc_new(void) {
    kvps_ring__zc *z = (kvps_ring__zc *)calloc(1, sizeof *z);
    if (!z) return NULL;
    z->refs = 1;
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    return z;
}

static void kvps_ring__zc_unref(kvps_ring__zc *z) {
    if (__atomic_sub_fetch(&z->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    free(z);
}

/* Point-to-point messages carry coll = KVPS_RING__P2P (no kvps_coll has that value) and their
   kind in the op byte (manual section 7). */
enum {
    KVPS_RING__P2P = 0x50,
    KVPS_RING__P2P_EAGER = 1, /* data; answered only when refused (NACK) */
    KVPS_RING__P2P_SYNC = 2,  /* data over the eager limit; answered ACK or NACK */
    KVPS_RING__P2P_ACK = 3,   /* a SYNC message was received whole */
    KVPS_RING__P2P_NACK = 4,  /* a data message was refused: the receive named another count or dtype */
    KVPS_RING__P2P_ABORT = 5, /* the sender's ring broke in a p2p call: waiting for it is pointless */
    KVPS_RING__P2P_EAGER_MAX = 65536
};

/* A zero-copy send's frame: ZeroMQ's I/O thread releases it, maybe after its request is gone,
   so the flag lives in a block of its own (refs: the request + the frame). */
typedef struct kvps_ring__tok {
    int released, refs;
} kvps_ring__tok;

/* A send or receive started by the ring's user (never touched by the ring's thread). */
typedef struct kvps_ring__p2p {
    struct kvps_ring__p2p *next;
    uint64_t id;
    int is_send, peer, done, on_heap;
    uint32_t tag, seq; /* seq: a send's number among those to its peer (its answer names it) */
    kvps_dtype dtype;
    size_t count;
    void *buf;
    kvps_ring__tok *tok; /* a zero-copy send's frame, NULL when copied */
    kvps_result result;
    char why[512];       /* the error, for kvps_ring_last_error when its wait returns */
} kvps_ring__p2p;

/* The collectives, one row each (>>collectives: kvps_ring__colls, from kvps_coll 1). */
typedef struct kvps_ring__exec kvps_ring__exec;
typedef kvps_result (*kvps_ring__coll_fn)(kvps_ring *r, const kvps_ring__exec *x);
typedef struct kvps_ring__coll_row {
    const char *name;     /* kvps_coll_name */
    kvps_ring__coll_fn run;
    unsigned char rooted, reduces;
    unsigned char counts; /* 0: one count for every rank (op->count); 1: counts[size], the same on every rank;
                             2: send and receive counts, rank i's send_counts[j] = rank j's recv_counts[i] */
    const char *algo;     /* for the timeline; NULL: chosen as it runs (all-reduce) or by size (reduce, broadcast) */
} kvps_ring__coll_row;
static const kvps_ring__coll_row *kvps_ring__row(int coll);

/* An all-reduce over a list of buffers (>>list; kvps_fuse.h's kvps_ring_allreduce_many): the
   buffers, borrowed, taken as one buffer of their summed count, element e of the list being
   element e - start[i] of buffer i. */
typedef struct kvps_ring__list {
    void *const *bufs;
    const size_t *counts;
    size_t n;
    size_t *start;   /* n + 1: start[i] is buffer i's first element in the list, start[n] the total */
    uint32_t layout; /* a hash of the non-zero counts, in the header's layout field: lists that differ are a mismatch */
} kvps_ring__list;

typedef struct kvps_ring__job {
    struct kvps_ring__job *next;
    kvps_ring *ring; /* the ring of the family it runs on */
    uint64_t id;
    kvps_ring_op op;
    const kvps_ring__list *list; /* non-NULL: op is an all-reduce over this list (>>list) */
    int done;
    kvps_result result;
    uint64_t tl_t0; /* timeline on: when it was posted (ns) */
} kvps_ring__job;

/* A connection to the data port not proven yet (>>transport: kvps_ring__x_accept): its preamble
   as it comes, since when, its far end's address. */
typedef struct kvps_ring__pend {
    int fd;
    size_t got;
    int64_t since;
    unsigned char b[KVPS_RING__TCP_AUTH];
    char far[64];
} kvps_ring__pend;

/* A family: the ring kvps_ring_create made and every sub-ring split from it, at any depth.
   They share what is here: the sockets (each sub-ring's messages carry its id in the header),
   the one-call-at-a-time hold (busy) and the queue of posted operations with its thread, and
   the timeline. A sub-ring may outlive the family's first ring (which owns the sockets): closed
   then, and its calls answer KVPS_ERR_STATE; the last ring destroyed frees the family. */
typedef struct kvps_ring__fam {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started, busy, quit;
    kvps_ring__job *head, *tail, *finished;
    uint64_t next_id, running_id;
    void *ctx, *router, **dealers; /* dealers: one per rank of the first ring */
    void **mons;                   /* each dealer's monitor (NULL: none, inproc); read by kvps_ring__x_watch */
    int peer_timeout_ms;           /* the first ring's: a peer whose connection is down this long is gone */
    int64_t watched;               /* the monitors were last read then */
    /* the stall inspector (kvps_ring__x_stall): the wait of the call running since wait_t0 is
       logged at stall_at, then every stall_ms (<= 0: off) */
    int stall_ms;
    int64_t wait_t0, stall_at;
    int own_ctx, size, refs;
    int closed;                    /* the first ring is destroyed: no sockets */
    int broken;                    /* a failure on one of its rings closed the dealers */
    char why[200];                 /* what broke it */
    kvps_ring *rings;              /* the live rings, linked by fam_next */
    uint32_t next_ring, max_ring;  /* the least id this rank proposes for a new sub-ring; the largest made here */
    kvps_ring__stash *orphans, **orphans_tail; /* messages for sub-rings a peer has made and this rank not yet */
    struct kvps_ring__tl *tl;
    /* transports (>>transport): me is this rank in the first ring; peers[size], what each said in
       its hello; this rank's segment (>>shm) and its name until unlinked; counts of hellos read and
       of peers whose messages come through the segment; topo: the hosts are known (the first
       collective); messages read from the queues while a send waited for room; taking turns */
    int me;
    kvps_ring__peer *peers;
    char host[256];
    uint64_t host_hash, shm_cap;
    unsigned char *shm;
    size_t shm_bytes;
    char shm_name[64];
    int hellos, in_shm, topo;
    int cma_all;                /* 1: every rank is on this host and each may read every other's memory
                                   (DIRECT may run): from the hellos alone, so the same on every rank */
    kvps_ring__stash *ready, **ready_tail;
    unsigned turn;
    int rr, router_due;
    int bell_rx, bell_tx;       /* this rank's doorbell (bound), and a socket to ring the peers' from; -1: none */
    /* TCP (>>tcp): the data listener (-1: none) and its port; the tokens peers show it (16 bytes
       per rank); peers whose connection to this rank is proven and open; connections accepted and
       not proven yet; the poll set of a sleep, and which peer each of its entries is */
    int tcp_fd, timeout_ms;     /* (timeout_ms: the first ring's, for connections that never prove themselves) */
    uint16_t tcp_port;
    unsigned char *tok;
    int in_tcp, npend;
    int tpolled;                /* the connections were polled since a read last found nothing (kvps_ring__x_recv1) */
    int accept_due;             /* the data port or a connection not proven yet has news (a poll said so) */
    int local, cpus;            /* ranks on this machine (its boot: hellos read so far, this one too), CPUs this
                                   process may use: local <= cpus, a waiting rank polls without giving its CPU
                                   away (kvps_ring__x_wait) */
    kvps_ring__pend pend[KVPS_RING__TCP_PEND];
    zmq_pollitem_t *items;
    int *item_peer;
    struct pollfd *pfds;
} kvps_ring__fam;

struct kvps_ring {
    kvps_ring_desc desc;
    int rank, size;
    kvps_ring__fam *fam;
    kvps_ring *fam_next;
    uint32_t id;        /* 0: the family's first ring; else this sub-ring's id (the header's ring) */
    uint32_t parent_id;
    int colour;
    int *up;            /* sub-ring: rank i is parent rank up[i] */
    int *root_rank;     /* rank i is rank root_rank[i] of the family's first ring (its dealer) */
    size_t *blocks;     /* 4 * size: the blocks of an even collective (>>collectives) */
    int connected, broken;
    kvps_result abort_rc; /* the code and tag a peer's abort carried (the v-collectives' count check) */
    uint64_t abort_tag;
    char endpoint[256];
    char errmsg[512];
    uint32_t seq;
    int64_t deadline;
    kvps_ring__hdr cur; /* the running collective's identity, for mismatch checks */
    kvps_ring__hdr prev; /* the last one's: late pieces of it are checked too */
    uint64_t hier;      /* tag offset of a hierarchical sub-phase */
    int wire;           /* this all-reduce's wire format (KVPS_FLOAT16/BFLOAT16), 0: as dtype */
    kvps_ring__stash *stash;
    kvps_ring__zc *zc;  /* zero-copy frames ZeroMQ still holds (outlives the ring if need be) */
    int zc_dst;         /* the rank the last of them went to (named when they are never taken) */
    void *work, *scratch, *direct; /* (direct: DIRECT's piece of a peer's buffer; work may hold the list it reduces) */
    size_t work_cap, scratch_cap, direct_cap;
    int *view_buf;
    /* point-to-point (>>p2p). Touched by whoever holds the sockets (busy: the family's thread
       during a posted collective, else the caller): p2p messages that arrived and are not taken
       yet, in arrival order; collective messages a p2p call read, which the collectives take
       first (held); per peer, the numbers of the messages sent and of the next one expected,
       and whether it said its ring broke (1) or lost messages (2). Only the user's thread
       touches reqs, its sends and receives in the order started. */
    kvps_ring__stash *p2p_in, **p2p_in_tail, *held, **held_tail;
    uint32_t *p2p_sent, *p2p_next;
    unsigned char *p2p_gone;
    char p2p_why[200];   /* what the last peer that broke said */
    int p2p_why_rank;
    size_t p2p_eager;    /* bytes sent without waiting for an answer (KVPS_RING__P2P_EAGER_MAX) */
    kvps_ring__p2p *p2p_reqs;
    struct kvps_ring__tl *tl; /* the timeline, NULL when off (>>timeline) */
    /* join (>>join; rings made with .join): the agreement is running; ranks that had not joined
       at the last agreement (0: none yet, or every rank had); its result (size flags, then each
       of KVPS_RING__JOIN_NP parameters' max and -min); a joined rank's contribution (the op's
       identity) */
    int join_agreeing, join_live;
    int64_t *join_vec;
    void *join_buf;
    size_t join_cap;
};

// >>timeline
/* A rank's timeline (kvps_core.h's writer, its // >>timeline; the manual: kvps.h, TIMELINE): one
   event per collective from post (kvps_ring_post; the call itself for a blocking one) to
   completion, and its phases as events nested under it: reduce-scatter and all-gather and
   their steps, recursive halving and doubling, the binomial trees and chains, the stages of the
   hierarchical all-reduce. Phases are noted in memory while the collective runs (the running
   collective's thread is the only one that touches them) and written with it when it ends, on
   its lane of the "collectives" track. Hooks: kvps_ring__ph(r, name, step) opens a phase,
   kvps_ring__ph_end(r) closes the innermost; each costs one branch when the timeline is off. */
enum { KVPS_RING__TL_PHASES = 256, KVPS_RING__TL_DEPTH = 8 };
typedef struct kvps_ring__tlph {
    const char *name; /* a string literal */
    int step;         /* -1: none */
    int depth;
    uint64_t t0, t1;
} kvps_ring__tlph;

struct kvps_ring__tl {
    kvps__tl *w;
    uint64_t posted;   /* the running collective's post (kvps_ring_post), 0: called */
    uint64_t t0;       /* when it began to run */
    int algo;          /* the all-reduce's algorithm as chosen, -1: none */
    int nph, depth;
    int open[KVPS_RING__TL_DEPTH]; /* the open phases (indices in ph; -1: not kept) */
    unsigned dropped;  /* phases past KVPS_RING__TL_PHASES or KVPS_RING__TL_DEPTH, not written */
    kvps_ring__tlph ph[KVPS_RING__TL_PHASES];
};

static void kvps_ring__tl_open(struct kvps_ring__tl *t, const char *name, int step) {
    int i = -1;
    if (t->depth < KVPS_RING__TL_DEPTH && t->nph < KVPS_RING__TL_PHASES) {
        i = t->nph++;
        t->ph[i].name = name;
        t->ph[i].step = step;
        t->ph[i].depth = t->depth + 1;
        t->ph[i].t0 = kvps__tl_now();
        t->ph[i].t1 = 0;
    } else {
        t->dropped++;
    }
    if (t->depth < KVPS_RING__TL_DEPTH) t->open[t->depth] = i;
    t->depth++;
}

static void kvps_ring__tl_close(struct kvps_ring__tl *t, uint64_t now) {
    if (!t->depth) return;
    t->depth--;
    if (t->depth < KVPS_RING__TL_DEPTH && t->open[t->depth] >= 0) t->ph[t->open[t->depth]].t1 = now;
}

static inline void kvps_ring__ph(kvps_ring *r, const char *name, int step) {
    if (r->tl) kvps_ring__tl_open(r->tl, name, step);
}
static inline void kvps_ring__ph_end(kvps_ring *r) {
    if (r->tl) kvps_ring__tl_close(r->tl, kvps__tl_now());
}
static inline void kvps_ring__tl_algo(kvps_ring *r, kvps_ring_algo algo) {
    if (r->tl) r->tl->algo = (int)algo;
}

/* Opens the timeline (kvps_ring_create); off: r->tl stays NULL. */
static kvps_result kvps_ring__tl_create(kvps_ring *r, const kvps_ring_desc *desc) {
    kvps__tl *w;
    kvps_result rc = kvps__tl_open(&w, desc->timeline, "ring", "ring rank", r->rank, 2000 + r->rank);
    if (rc != KVPS_OK || !w) return rc;
    if (!(r->tl = (struct kvps_ring__tl *)calloc(1, sizeof *r->tl))) { kvps__tl_close(&w); return KVPS_ERR_NOMEM; }
    r->tl->w = w;
    return KVPS_OK;
}

static void kvps_ring__tl_start(kvps_ring *r) {
    struct kvps_ring__tl *t = r->tl;
    t->t0 = kvps__tl_now();
    t->nph = t->depth = 0;
    t->dropped = 0;
    t->algo = -1;
}

/* The algorithm a collective ran with, in words (an all-reduce's was noted as it chose). */
static const char *kvps_ring__tl_algo_name(const kvps_ring *r, const kvps_ring_op *op) {
    int large = op->count * kvps_dtype_size(op->dtype) > r->desc.small_bytes;
    switch (op->coll) {
    case KVPS_COLL_ALLREDUCE: return r->tl->algo >= 0 ? kvps_algo_name((kvps_ring_algo)r->tl->algo) : "?";
    case KVPS_COLL_REDUCE: return large ? "ring reduce-scatter + gather" : "binomial tree";
    case KVPS_COLL_BROADCAST: return large ? "chain" : "binomial tree";
    default: return kvps_ring__row(op->coll)->algo;
    }
}

/* Elements a collective moves per rank as the timeline names them: count, or for a
   v-collective the sum of the blocks received (scatterv: sent by the root). */
static uint64_t kvps_ring__tl_count(const kvps_ring *r, const kvps_ring_op *op) {
    const size_t *c = op->coll == KVPS_COLL_ALLTOALLV ? op->recv_counts : op->counts;
    if (!kvps_ring__row(op->coll)->counts || !c) return op->count;
    uint64_t n = 0;
    for (int i = 0; i < r->size; i++) n += c[i];
    return n;
}

/* The collective ended with rc: its event and its phases'. */
static void kvps_ring__tl_finish(kvps_ring *r, const kvps_ring_op *op, kvps_result rc) {
    struct kvps_ring__tl *t = r->tl;
    kvps__tl *w = t->w;
    uint64_t now = kvps__tl_now(), start = t->posted ? t->posted : t->t0;
    while (t->depth) kvps_ring__tl_close(t, now); /* phases an error left open */
    int tid = kvps__tl_lane(w, 0, "collectives", NULL, 0, start, now);
    int rooted = kvps_ring__row(op->coll)->rooted, reduces = kvps_ring__row(op->coll)->reduces;
    uint64_t count = kvps_ring__tl_count(r, op);
    char *p = kvps__tl_begin(w, kvps_coll_name(op->coll), NULL, "ring", start, now, tid); /* names: plain ASCII */
    p = kvps__tl_arg_raw(p, "coll", kvps_coll_name(op->coll));
    p = kvps__tl_arg_u64(p, "seq", r->seq);
    if (op->coll != KVPS_COLL_BARRIER) {
        p = kvps__tl_arg_raw(p, "dtype", kvps_dtype_name(op->dtype));
        p = kvps__tl_arg_u64(p, "count", count);
        p = kvps__tl_arg_u64(p, "bytes", count * kvps_dtype_size(op->dtype));
    }
    if (reduces) p = kvps__tl_arg_raw(p, "op", kvps_redop_name(op->op));
    if (rooted) p = kvps__tl_arg_i64(p, "root", op->root);
    if (op->wire) p = kvps__tl_arg_raw(p, "wire", kvps_dtype_name(op->wire));
    p = kvps__tl_arg_raw(p, "algorithm", kvps_ring__tl_algo_name(r, op));
    p = kvps__tl_arg_i64(p, "ranks", r->size);
    if (r->id) p = kvps__tl_arg_u64(p, "sub_ring", r->id);
    if (t->posted) p = kvps__tl_arg_us(p, "queued_us", t->t0 - t->posted);
    if (t->dropped) p = kvps__tl_arg_u64(p, "phases_not_written", t->dropped);
    p = kvps__tl_arg_result(p, rc);
    kvps__tl_end(w, p);
    for (int i = 0; i < t->nph; i++) {
        const kvps_ring__tlph *ph = &t->ph[i];
        char step[32];
        *kvps__tl_i64(KVPS__TL_LIT(step, "step "), ph->step) = 0;
        p = kvps__tl_begin(w, ph->name, ph->step >= 0 ? step : NULL, "ring-phase", ph->t0, ph->t1 ? ph->t1 : now, tid);
        p = kvps__tl_arg_raw(p, "coll", kvps_coll_name(op->coll));
        p = kvps__tl_arg_u64(p, "seq", r->seq);
        if (ph->step >= 0) p = kvps__tl_arg_i64(p, "step", ph->step);
        p = kvps__tl_arg_i64(p, "depth", ph->depth);
        kvps__tl_end(w, p);
    }
    t->posted = 0;
}

// >>reduce
/* Bytes per element, one entry per kvps_dtype (0: not a dtype, which every call refuses). */
static const size_t kvps_ring__dtype_bytes[] = {4, 8, 4, 8, 2, 2};
typedef char kvps_ring__dtype_check[sizeof kvps_ring__dtype_bytes / sizeof kvps_ring__dtype_bytes[0] ==
                                    KVPS_DTYPE_COUNT ? 1 : -1];

KVPS_API size_t kvps_dtype_size(kvps_dtype dt) {
    return (unsigned)dt < KVPS_DTYPE_COUNT ? kvps_ring__dtype_bytes[dt] : 0;
}

/* The names, one per value of each enum, checked against its _COUNT. */
static const char *const kvps_ring__dtype_names[] = {"float32", "float64", "int32", "int64", "float16", "bfloat16"};
static const char *const kvps_ring__redop_names[] = {"sum", "prod", "min", "max", "avg"};
static const char *const kvps_ring__algo_names[] = {"auto", "ring", "biring", "rd", "hier", "rhd", "direct", "oneshot"};
typedef char kvps_ring__names_check[sizeof kvps_ring__dtype_names / sizeof *kvps_ring__dtype_names == KVPS_DTYPE_COUNT &&
                                            sizeof kvps_ring__redop_names / sizeof *kvps_ring__redop_names == KVPS_REDOP_COUNT &&
                                            sizeof kvps_ring__algo_names / sizeof *kvps_ring__algo_names == KVPS_ALGO_COUNT
                                        ? 1 : -1];
KVPS_API const char *kvps_dtype_name(kvps_dtype dt) { return (unsigned)dt < KVPS_DTYPE_COUNT ? kvps_ring__dtype_names[dt] : "?"; }
KVPS_API const char *kvps_redop_name(kvps_redop op) { return (unsigned)op < KVPS_REDOP_COUNT ? kvps_ring__redop_names[op] : "?"; }
KVPS_API const char *kvps_coll_name(kvps_coll c) { return (unsigned)c < KVPS_COLL_COUNT ? kvps_ring__row(c)->name : "?"; }
KVPS_API const char *kvps_algo_name(kvps_ring_algo a) { return (unsigned)a < KVPS_ALGO_COUNT ? kvps_ring__algo_names[a] : "?"; }

#define KVPS_RING__RED(T, d, s, n, op)                                                    \
    do {                                                                                  \
        T *KVPS__RESTRICT d_ = (T *)(d);                                                  \
        const T *KVPS__RESTRICT s_ = (const T *)(s);                                      \
        switch (op) {                                                                     \
        case KVPS_SUM: case KVPS_AVG: for (size_t i = 0; i < (n); i++) d_[i] += s_[i]; break; \
        case KVPS_PROD: for (size_t i = 0; i < (n); i++) d_[i] *= s_[i]; break;           \
        case KVPS_MIN:                                                                    \
            for (size_t i = 0; i < (n); i++) d_[i] = (s_[i] < d_[i] || s_[i] != s_[i]) ? s_[i] : d_[i]; \
            break;                                                                        \
        case KVPS_MAX:                                                                    \
            for (size_t i = 0; i < (n); i++) d_[i] = (s_[i] > d_[i] || s_[i] != s_[i]) ? s_[i] : d_[i]; \
            break;                                                                        \
        default: break; /* not an op: refused before any reduction */                     \
        }                                                                                 \
    } while (0)

static float kvps_ring__op1(float a, float b, kvps_redop op) {
    switch (op) {
    case KVPS_PROD: return a * b;
    case KVPS_MIN: return (b < a || b != b) ? b : a;
    case KVPS_MAX: return (b > a || b != b) ? b : a;
    default: return a + b;
    }
}

/* 16-bit floats are widened, reduced or divided in float32, and rounded back, element by element
   (in a switch on the dtype: d, s / b and n, op / k as the functions below name them). */
#define KVPS_RING__HALF_RED(widen, narrow)                                                 \
    {                                                                                      \
        uint16_t *d = (uint16_t *)dst;                                                     \
        const uint16_t *s = (const uint16_t *)src;                                         \
        for (size_t i = 0; i < n; i++) d[i] = narrow(kvps_ring__op1(widen(d[i]), widen(s[i]), op)); \
        break;                                                                             \
    }
#define KVPS_RING__HALF_DIV(widen, narrow)                                                 \
    {                                                                                      \
        uint16_t *b = (uint16_t *)buf;                                                     \
        for (size_t i = 0; i < n; i++) b[i] = narrow(widen(b[i]) / (float)k);              \
        break;                                                                             \
    }

KVPS_API void kvps_reduce_into(void *dst, const void *src, size_t n, kvps_dtype dt, kvps_redop op) {
    switch (dt) {
    case KVPS_FLOAT32:
        if (op == KVPS_SUM || op == KVPS_AVG) kvps__add((float *)dst, (const float *)src, n);
        else KVPS_RING__RED(float, dst, src, n, op);
        break;
    case KVPS_FLOAT64: KVPS_RING__RED(double, dst, src, n, op); break;
    /* integers: sum and prod wrap around, computed as unsigned (signed overflow is undefined) */
#define KVPS_RING__WRAP(U, S)                                                         \
    if (op == KVPS_SUM || op == KVPS_AVG || op == KVPS_PROD) {                        \
        U *d = (U *)dst;                                                              \
        const U *s = (const U *)src;                                                  \
        if (op == KVPS_PROD) for (size_t i = 0; i < n; i++) d[i] *= s[i];             \
        else for (size_t i = 0; i < n; i++) d[i] += s[i];                             \
    } else KVPS_RING__RED(S, dst, src, n, op);
    case KVPS_INT32: KVPS_RING__WRAP(uint32_t, int32_t) break;
    case KVPS_INT64: KVPS_RING__WRAP(uint64_t, int64_t) break;
#undef KVPS_RING__WRAP
    case KVPS_FLOAT16: KVPS_RING__HALF_RED(kvps_f16_to_f32, kvps_f32_to_f16)
    case KVPS_BFLOAT16: KVPS_RING__HALF_RED(kvps_bf16_to_f32, kvps_f32_to_bf16)
    default: break; /* not a dtype: refused before any reduction (kvps_dtype_size 0) */
    }
}

/* AVG: divide the sum by the number of ranks. */
static void kvps_ring__scale(void *buf, size_t n, kvps_dtype dt, int k) {
#define KVPS_RING__DIV(T, by) { T *b = (T *)buf; for (size_t i = 0; i < n; i++) b[i] /= (by); break; }
    switch (dt) {
    case KVPS_FLOAT32: KVPS_RING__DIV(float, (float)k)
    case KVPS_FLOAT64: KVPS_RING__DIV(double, (double)k)
    case KVPS_INT32: KVPS_RING__DIV(int32_t, k)
    case KVPS_INT64: KVPS_RING__DIV(int64_t, k)
    case KVPS_FLOAT16: KVPS_RING__HALF_DIV(kvps_f16_to_f32, kvps_f32_to_f16)
    case KVPS_BFLOAT16: KVPS_RING__HALF_DIV(kvps_bf16_to_f32, kvps_f32_to_bf16)
    default: break;
    }
#undef KVPS_RING__DIV
}
#undef KVPS_RING__HALF_RED
#undef KVPS_RING__HALF_DIV

/* n elements of op's identity (what a joined rank contributes, >>join): 0 for sum and avg, 1 for
   prod, the largest value for min (+inf for floats), the smallest for max. */
static void kvps_ring__identity(void *buf, size_t n, kvps_dtype dt, kvps_redop op) {
    int mn = op == KVPS_MIN, mx = op == KVPS_MAX, one = op == KVPS_PROD;
    double f = one ? 1.0 : mn ? HUGE_VAL : mx ? -HUGE_VAL : 0.0;
    int64_t i64 = one ? 1 : mn ? INT64_MAX : mx ? INT64_MIN : 0;
    int32_t i32 = one ? 1 : mn ? INT32_MAX : mx ? INT32_MIN : 0;
    uint16_t h = kvps_f32_to_f16((float)f), b = kvps_f32_to_bf16((float)f);
    for (size_t i = 0; i < n; i++)
        switch (dt) {
        case KVPS_FLOAT32: ((float *)buf)[i] = (float)f; break;
        case KVPS_FLOAT64: ((double *)buf)[i] = f; break;
        case KVPS_INT32: ((int32_t *)buf)[i] = i32; break;
        case KVPS_INT64: ((int64_t *)buf)[i] = i64; break;
        case KVPS_FLOAT16: ((uint16_t *)buf)[i] = h; break;
        case KVPS_BFLOAT16: ((uint16_t *)buf)[i] = b; break;
        default: return;
        }
}

// >>transport
/* A sub-ring's errors say which it is and whose ranks: "sub-ring 1 (colour 3, parent ranks 4
   5 6) rank 0 = parent rank 4: " (a nested one: "colour 0 of sub-ring 1"); the ranks in the
   rest of the message are the sub-ring's. */
static void kvps_ring__who(const kvps_ring *r, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "sub-ring %u (colour %d", r->id, r->colour);
    if (r->parent_id && n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, " of sub-ring %u", r->parent_id);
    if (n >= 0 && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, ", parent ranks");
    for (int i = 0; i < r->size && n >= 0 && (size_t)n < cap; i++)
        n += i < 16 ? snprintf(buf + n, cap - (size_t)n, " %d", r->up[i]) : snprintf(buf + n, cap - (size_t)n, " ...");
    if (n >= 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, ") rank %d = parent rank %d: ", r->rank, r->up[r->rank]);
}

static kvps_result kvps_ring__fail(kvps_ring *r, kvps_result rc, const char *fmt, ...) {
    if (r->errmsg[0] == 0 || rc != KVPS_ERR_PEER) {
        char m[sizeof r->errmsg], who[160] = "", mine[24];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        const char *body = m;
        if (r->id && strncmp(m, "sub-ring ", 9) != 0) { /* (a message passed on already has it) */
            kvps_ring__who(r, who, sizeof who);
            snprintf(mine, sizeof mine, "rank %d: ", r->rank);
            if (strncmp(body, mine, strlen(mine)) == 0) body += strlen(mine); /* the prefix says it */
        }
        snprintf(r->errmsg, sizeof r->errmsg, "%s%.*s", who, (int)(sizeof r->errmsg - 1 - strlen(who)), body);
    }
    return rc;
}

/* Deadlines (section 5): a wait that starts now ends at .timeout_ms, or never (0: none; dead
   peers end it: kvps_ring__x_gone). A hello is a wait on a peer not known to be alive (it never
   connected): with no timeout it is bounded all the same, by KVPS_RING__HELLO_MS. */
static int64_t kvps_ring__dl(const kvps_ring *r) {
    return r->desc.timeout_ms > 0 ? kvps__now_ms() + r->desc.timeout_ms : KVPS__NEVER;
}
static int kvps_ring__hello_ms(const kvps_ring *r) { return r->desc.timeout_ms > 0 ? r->desc.timeout_ms : KVPS_RING__HELLO_MS; }
static int64_t kvps_ring__hello_dl(const kvps_ring *r, int64_t dl) {
    return r->desc.timeout_ms > 0 ? dl : kvps__now_ms() + KVPS_RING__HELLO_MS;
}

/* Rank dst's socket: the family's DEALER to that rank of its first ring (NULL once closed). */
static void *kvps_ring__dealer(const kvps_ring *r, int dst) {
    return r->fam->dealers ? r->fam->dealers[r->root_rank[dst]] : NULL;
}

static int kvps_ring__fifo_put(kvps_ring__stash ***tail, const kvps_ring__hdr *h, zmq_msg_t *payload);
static kvps_ring__stash *kvps_ring__fifo_cut(kvps_ring__stash **pp, kvps_ring__stash ***tail);
static kvps_ring *kvps_ring__member(const kvps_ring__fam *f, uint32_t id);
static void kvps_ring__fifo_free(kvps_ring__stash **head);
/* ---- The transports under the algorithms: ZeroMQ for every peer, and a queue in shared
   memory for each peer on this host (>>shm). Control messages (coll KVPS_RING__XPORT, ring 0,
   src the sender's rank in the family's first ring) go over ZeroMQ and never reach a ring:
   HELLO, sent by every rank at connect (its host, pid, segment), so the first message on every
   connection; NOSHM, sent only by a rank on the same host that cannot use the segment a hello
   offered. A rank sends a peer nothing before it has read the peer's hello (it waits for it,
   within the call's deadline), and decides then, once: a peer on this host whose segment it
   could map gets everything through it, any other everything over ZeroMQ; so no message of one
   sender can overtake another on the way. The owner of a segment reads the queue of every peer
   on this host, and unlinks the segment once each has marked its queue mapped or said NOSHM.
   The algorithms see only kvps_ring__post and kvps_ring__read. */
enum { KVPS_RING__XPORT = 0x51, KVPS_RING__X_HELLO = 1, KVPS_RING__X_NOSHM = 3, KVPS_RING__X_NOTCP = 4 };
typedef struct kvps_ring__hello {
    uint32_t version, size;
    int32_t pid, pad;
    uint64_t cap;
    char host[256]; /* kvps_ring__host_ident */
    char seg[64];   /* its segment's name, "" for none */
    uint32_t uid, cma;            /* its user; 1: peers of the same user may read its memory and it can
                                     read theirs (kvps_ring__cma_refused) */
    uint16_t tport, pad1;         /* its data port (>>tcp), 0: none */
    uint32_t pad2;
    unsigned char token[16];      /* what the hello's receiver shows when it connects to that port */
} kvps_ring__hello;

static void kvps_ring__x_ctl(kvps_ring__fam *f, int dst, int kind, const void *payload, size_t bytes) {
    kvps_ring__hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVPS_RING__MAGIC;
    h.coll = KVPS_RING__XPORT;
    h.op = (uint8_t)kind;
    h.src = (uint16_t)f->me;
    zmq_msg_t fr[2];
    if (!f->dealers || !f->dealers[dst] || kvps__msg_from_buf(&fr[0], &h, sizeof h) != 0) return;
    if (kvps__msg_from_buf(&fr[1], payload, bytes) != 0) { zmq_msg_close(&fr[0]); return; }
    kvps__send_frames(f->dealers[dst], fr, 2);
}

/* Whether a transport is asked for: the desc's field (1 on, -1 off), else its variable (0 off). */
static int kvps_ring__wanted(int field, const char *var) {
    if (field) return field > 0;
    const char *e = getenv(var);
    return !(e && strcmp(e, "0") == 0);
}
static int kvps_ring__shm_wanted(const kvps_ring_desc *d) { return kvps_ring__wanted(d->shm, "KVPS_RING_SHM"); }
static int kvps_ring__tcp_wanted(const kvps_ring_desc *d) { return kvps_ring__wanted(d->tcp, "KVPS_RING_TCP"); }

/* At connect: this rank's segment (when asked for and possible) and its hello to every peer. */
static void kvps_ring__x_hello(kvps_ring *r) {
    kvps_ring__fam *f = r->fam;
    kvps_ring__hello hl;
    memset(&hl, 0, sizeof hl);
    kvps_ring__host_ident(f->host, sizeof f->host);
    f->host_hash = kvps__fnv1a(f->host);
    f->shm_cap = r->size <= 8 ? (1u << 20) + KVPS_RING__SHM_PAGE : (256u << 10);
    const char *why = NULL;
    if (kvps_ring__shm_wanted(&r->desc) && f->host[0] && r->size > 1 && r->size <= 1024) {
        kvps_ring__shm_sweep();
        if (kvps_ring__shm_make((uint32_t)r->size, f->shm_cap, f->shm_name, sizeof f->shm_name, &f->shm, &why) != 0)
            kvps__log(KVPS_LOG_WARN, "ring %d: no shared memory (%s: %s): every peer over ZeroMQ", r->rank, why, strerror(errno));
        else {
            f->shm_bytes = kvps_ring__shm_bytes((uint32_t)r->size, f->shm_cap);
            kvps_ring__bell_open(f->shm_name, &f->bell_rx, &f->bell_tx);
        }
    }
    char lhost[64];
    if (kvps_ring__tcp_wanted(&r->desc) && r->size > 1 && kvps_ring__tcp_host(r->endpoint, lhost, sizeof lhost) == 0) {
        f->tok = (unsigned char *)malloc((size_t)r->size * 16);
        if (f->tok && kvps_ring__tcp_random(f->tok, (size_t)r->size * 16) == 0) f->tcp_fd = kvps_ring__tcp_listen(lhost, &f->tcp_port);
        if (f->tcp_fd < 0)
            kvps__log(KVPS_LOG_WARN, "ring %d: no TCP data port on %s (%s): ZeroMQ to the peers that shared memory does "
                      "not reach", r->rank, lhost, !f->tok ? "no memory" : strerror(errno));
    }
    f->timeout_ms = r->desc.timeout_ms > 0 ? r->desc.timeout_ms : KVPS_RING__PROVE_MS;
    f->peer_timeout_ms = r->desc.peer_timeout_ms;
    f->local = 1;
    f->cpus = 1;
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t cs;
    if (sched_getaffinity(0, sizeof cs, &cs) == 0) f->cpus = CPU_COUNT(&cs);
#else
    f->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
    hl.version = 2;
    hl.size = (uint32_t)r->size;
    hl.pid = (int32_t)getpid();
    hl.cap = f->shm_cap;
    memcpy(hl.host, f->host, sizeof hl.host);
    if (f->shm) snprintf(hl.seg, sizeof hl.seg, "%s", f->shm_name);
    hl.uid = (uint32_t)getuid();
    const char *no_cma = kvps_ring__shm_wanted(&r->desc) && r->size > 1 && f->host[0] ? kvps_ring__cma_refused() : "";
    hl.cma = no_cma == NULL; /* (off with shared memory) */
    if (no_cma && no_cma[0])
        kvps__log(KVPS_LOG_WARN, "ring %d: peers cannot read this process's buffers, nor it theirs: %s; the direct "
                  "all-reduce is off (shared memory queues still carry the data)", r->rank, no_cma);
    f->peers[r->rank].cma = (unsigned char)hl.cma;
    f->peers[r->rank].host = f->host_hash;
    f->peers[r->rank].same = f->peers[r->rank].hello = 1;
    hl.tport = f->tcp_fd >= 0 ? f->tcp_port : 0;
    for (int i = 0; i < r->size; i++)
        if (i != r->rank) {
            if (f->tcp_fd >= 0) memcpy(hl.token, f->tok + 16 * (size_t)i, 16);
            kvps_ring__x_ctl(f, i, KVPS_RING__X_HELLO, &hl, sizeof hl);
        }
}

/* Every local peer has mapped this rank's segment or said it will not: unlinked, so that a job
   killed from now on leaves nothing in /dev/shm. */
static void kvps_ring__x_maybe_unlink(kvps_ring__fam *f) {
    if (!f->shm_name[0] || f->hellos < f->size - 1) return;
    for (int p = 0; p < f->size; p++)
        if (p != f->me && f->peers[p].same && !f->peers[p].said &&
            !__atomic_load_n(&kvps_ring__shm_q(f->shm, f->shm_cap, p)->mapped, __ATOMIC_ACQUIRE))
            return;
    kvps_ring__shm_unlink_name(f->shm_name);
}

/* TCP between this rank and rank p (its hello read; shared memory decided): the higher rank of
   the two dials the lower's data port, when both have one, p's endpoint is a tcp:// one and the
   dialler does not send to the other through shared memory; the route of each (out 2) waits
   for the connection (twait), which the dialler makes in the background
   (kvps_ring__x_dial_progress) and the other accepts (kvps_ring__x_accept). A dialler that will
   not dial, or cannot, says so (NOTCP): then neither waits, and ZeroMQ carries what shared
   memory does not. */
/* This rank's dial to rank p failed (why) or will not finish: warned of, closed, and said
   (NOTCP), so that p waits for it no more: ZeroMQ to p. */
static void kvps_ring__x_dial_failed(kvps_ring__fam *f, int p, const char *why) {
    kvps_ring__peer *q = &f->peers[p];
    kvps__log(KVPS_LOG_WARN, "ring %d: cannot connect to rank %d's data port %s:%u (%s): ZeroMQ to it", f->me, p, q->thost,
              (unsigned)q->tport, why);
    if (q->tfd >= 0) close(q->tfd);
    q->tfd = -1;
    q->tdial = q->twait = 0;
    kvps_ring__x_ctl(f, p, KVPS_RING__X_NOTCP, NULL, 0);
}

static void kvps_ring__x_tcp_route(kvps_ring__fam *f, int p) {
    kvps_ring__peer *q = &f->peers[p];
    int both = f->tcp_fd >= 0 && q->tport && q->thost[0] && q->out != 1;
    if (p < f->me) { /* this rank dials */
        if (!both) {
            if (q->tport && f->tcp_fd >= 0) kvps_ring__x_ctl(f, p, KVPS_RING__X_NOTCP, NULL, 0); /* (p may wait for it) */
            return;
        }
        q->tfd = kvps_ring__tcp_dial(q->thost, q->tport, q->tsndbuf);
        if (q->tfd < 0) { kvps_ring__x_dial_failed(f, p, strerror(errno)); return; }
        q->tdial = q->twait = 1;
        q->tsince = kvps__now_ms();
    } else if (both) { /* p dials */
        if (q->topen) q->out = 2;
        else q->twait = 1;
    }
}

/* The dialled connections that are not made yet: a made one sends its preamble (32 bytes into
   an empty socket) and carries this rank's messages from now on; one that failed, or is not made
   within the ring's timeout, is closed, said (NOTCP) and warned of: ZeroMQ to that peer. */
static void kvps_ring__x_dial_progress(kvps_ring__fam *f) {
    for (int p = 0; p < f->size; p++) {
        kvps_ring__peer *q = &f->peers[p];
        if (!q->tdial || !q->twait) continue;
        int d = kvps_ring__tcp_dialled(q->tfd, 0);
        if (d == 1 && kvps__now_ms() - q->tsince <= f->timeout_ms) continue;
        if (d == 0) {
            unsigned char a[KVPS_RING__TCP_AUTH];
            kvps_ring__tcp_auth_make(a, f->me, f->size, q->tok_out);
            d = send(q->tfd, a, sizeof a, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof a ? 0 : -1;
        }
        if (d != 0) {
            kvps_ring__x_dial_failed(f, p, d < 0 ? strerror(errno) : "it took longer than the ring's timeout");
            continue;
        }
        q->twait = 0;
        q->topen = q->tready = 1;
        f->in_tcp++;
        q->out = 2; /* (it dials only where shared memory does not carry its messages) */
    }
}

/* A peer's hello, checked: its host; a peer on this host gets this rank's messages through its
   segment (its queue there marked mapped), or is told it will not (NOSHM) when it offered one. */
static void kvps_ring__x_on_hello(kvps_ring__fam *f, int src, zmq_msg_t *pl) {
    kvps_ring__hello hl;
    kvps_ring__peer *p = &f->peers[src];
    if (zmq_msg_size(pl) != sizeof hl || p->hello) {
        kvps__log(KVPS_LOG_WARN, "ring %d: dropped a malformed or repeated hello from rank %d", f->me, src);
        return;
    }
    memcpy(&hl, zmq_msg_data(pl), sizeof hl);
    hl.host[sizeof hl.host - 1] = 0;
    hl.seg[sizeof hl.seg - 1] = 0;
    if (hl.size != (uint32_t)f->size) {
        kvps__log(KVPS_LOG_WARN, "ring %d: rank %d's hello says %u ranks, this ring has %d: dropped", f->me, src, hl.size, f->size);
        return;
    }
    p->hello = 1;
    f->hellos++;
    p->pid = hl.pid;
    p->host = kvps__fnv1a(hl.host);
    p->same = f->host[0] && strcmp(hl.host, f->host) == 0;
    p->cma = 0;
    p->tport = hl.tport;
    memcpy(p->tok_out, hl.token, 16);
    size_t boot = strcspn(f->host, " "); /* (the boot id: another network namespace or container of this machine
                                            shares its CPUs) */
    if (f->host[0] && strncmp(hl.host, f->host, boot) == 0 && hl.host[boot] == ' ') f->local++;
    if (!p->same) { kvps_ring__x_tcp_route(f, src); return; }
    if (f->shm) { p->in = 1; f->in_shm++; }
    const char *why = "this rank has no segment";
    int ok = f->shm && hl.seg[0] && hl.cap == f->shm_cap && strncmp(hl.seg, "/kvps-ring-", 11) == 0 && !strchr(hl.seg + 1, '/') &&
             kvps_ring__shm_map(hl.seg, hl.size, hl.cap, f->me, &p->seg, &p->seg_bytes, &why) == 0;
    if (!ok && f->shm && hl.seg[0])
        kvps__log(KVPS_LOG_WARN, "ring %d: rank %d is on this host, but its shared memory %s cannot be used (%s): ZeroMQ to it",
                  f->me, src, hl.seg, why);
    p->cma = hl.cma == 1 && hl.uid == (uint32_t)getuid();
    if (ok) kvps_ring__bell_addr(hl.seg, p->bell, &p->bell_len);
    p->out = (unsigned char)ok;
    if (ok) {
        __atomic_store_n(&kvps_ring__shm_q(p->seg, f->shm_cap, f->me)->mapped, 1, __ATOMIC_RELEASE);
        kvps_ring__shm_ring(p->seg, f->bell_tx, p->bell, p->bell_len);
    } else if (hl.seg[0]) {
        kvps_ring__x_ctl(f, src, KVPS_RING__X_NOSHM, NULL, 0);
    }
    kvps_ring__x_tcp_route(f, src);
    kvps_ring__x_maybe_unlink(f);
}

/* A control message from rank src of the family's first ring. */
static void kvps_ring__x_control(kvps_ring__fam *f, const kvps_ring__hdr *h, zmq_msg_t *pl) {
    int src = h->src;
    kvps_ring__peer *p = &f->peers[src];
    if (h->op == KVPS_RING__X_HELLO) kvps_ring__x_on_hello(f, src, pl);
    else if (h->op == KVPS_RING__X_NOSHM && p->same && !p->said) {
        p->said = 1;
        if (p->in == 1) { p->in = 0; f->in_shm--; } /* (it writes nothing there: its messages come over ZeroMQ) */
        kvps_ring__x_maybe_unlink(f);
    } else if (h->op == KVPS_RING__X_NOTCP && src > f->me) {
        p->twait = 0; /* (it will not connect: what shared memory does not carry goes over ZeroMQ) */
    } else {
        kvps__log(KVPS_LOG_WARN, "ring %d: dropped a transport message of kind %d from rank %d", f->me, h->op, src);
    }
    zmq_msg_close(pl);
}

/* A whole message rd read from root rank p's queue or connection: 1 and h and payload filled,
   when its header names p as its sender (through the sub-ring it names); else dropped, 0. */
static int kvps_ring__x_taken(kvps_ring__fam *f, int p, kvps_ring__frame_rd *rd, kvps_ring__hdr *h, zmq_msg_t *payload) {
    memcpy(h, rd->pre + 8, sizeof *h);
    const kvps_ring *t = h->ring ? kvps_ring__member(f, h->ring) : NULL;
    int from = h->ring == 0 ? h->src : t && h->src < t->size ? t->root_rank[h->src] : p;
    if (from != p) { /* (a sub-ring not made here yet: its rank is checked when it is) */
        kvps__log(KVPS_LOG_WARN, "ring %d: dropped a message from rank %d that names another sender", f->me, p);
        zmq_msg_close(&rd->m);
        return 0;
    }
    *payload = rd->m;
    return 1;
}

/* One message from peer p's queue in this rank's segment, if a whole one is there: 1 (h and
   payload filled), else 0. A malformed queue is read no more (its writer is named). */
static int kvps_ring__x_take(kvps_ring__fam *f, int p, kvps_ring__hdr *h, zmq_msg_t *payload) {
    kvps_ring__peer *q = &f->peers[p];
    const char *why = NULL;
    kvps_ring__shm_ctl *c = kvps_ring__shm_q(f->shm, f->shm_cap, p);
    int was = q->rd.on;
    uint64_t before = __atomic_load_n(&c->head, __ATOMIC_RELAXED);
    int got = kvps_ring__shm_take(c, (const unsigned char *)c + KVPS_RING__SHM_PAGE, f->shm_cap, KVPS_RING__MAGIC, &q->rd, &why);
    if (__atomic_load_n(&c->head, __ATOMIC_RELAXED) != before) __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(&c->head, __ATOMIC_RELAXED) != before && __atomic_load_n(&c->want_room, __ATOMIC_SEQ_CST) && q->seg)
        kvps_ring__shm_ring(q->seg, f->bell_tx, q->bell, q->bell_len); /* room for a writer that waits for it */
    if (got < 0) {
        if (was || q->rd.on) zmq_msg_close(&q->rd.m);
        q->rd.on = 0;
        q->in = 2; /* read no more */
        f->in_shm--;
        kvps__log(KVPS_LOG_ERROR, "ring %d: rank %d's shared-memory queue is malformed (%s): nothing more is read from it",
                  f->me, p, got == -2 ? "no memory for a message" : why);
        return 0;
    }
    if (got == 0) return 0;
    return kvps_ring__x_taken(f, p, &q->rd, h, payload);
}

/* Rank p's connection to this rank ended (how: 1 closed, 2 reset or failed, 3 malformed): closed
   here; a message it had begun is dropped. */
static void kvps_ring__x_tcp_end(kvps_ring__fam *f, int p, int how) {
    kvps_ring__peer *q = &f->peers[p];
    if (q->tfd >= 0) close(q->tfd);
    if (q->topen) f->in_tcp--;
    q->tfd = -1;
    q->topen = q->twait = 0;
    q->tend = (unsigned char)how;
    q->tready = 0;
    q->rx_off = q->rx_len = 0;
    if (q->trd.on) zmq_msg_close(&q->trd.m);
    q->trd.on = 0;
    q->trd.pre_got = 0;
}

/* One message from rank p's connection to this rank, if a whole one has come: 1 (h and payload
   filled), else 0. Reads only when the connection may have bytes (tready); the rest of a long
   payload goes straight into its message (one copy, the kernel's). A malformed stream ends the connection (its
   sender is named). */
static int kvps_ring__x_tcp_take(kvps_ring__fam *f, int p, kvps_ring__hdr *h, zmq_msg_t *payload) {
    kvps_ring__peer *q = &f->peers[p];
    for (;;) {
        if (q->rx_off < q->rx_len) {
            size_t used = 0;
            const char *why = NULL;
            int got = kvps_ring__frame_take(&q->trd, q->rx + q->rx_off, q->rx_len - q->rx_off, &used, KVPS_RING__MAGIC,
                                            KVPS_RING__SHM_MSG_MAX, &why);
            q->rx_off += used;
            if (got < 0) {
                kvps__log(KVPS_LOG_ERROR, "ring %d: rank %d's TCP connection is malformed (%s): closed", f->me, p,
                          got == -2 ? "no memory for a message" : why);
                kvps_ring__x_tcp_end(f, p, 3);
                return 0;
            }
            if (got == 1) return kvps_ring__x_taken(f, p, &q->trd, h, payload);
            continue;
        }
        if (!q->topen || !q->tready) return 0;
        ssize_t n;
        size_t want;
        if (q->trd.on && q->trd.len - q->trd.got >= KVPS_RING__TCP_DIRECT) {
            want = (size_t)(q->trd.len - q->trd.got);
            n = recv(q->tfd, (char *)zmq_msg_data(&q->trd.m) + q->trd.got, want, MSG_DONTWAIT);
            if (n > 0) {
                q->trd.got += (uint64_t)n;
                if ((size_t)n < want) q->tready = 0; /* (the kernel had no more) */
                if (q->trd.got < q->trd.len) continue;
                q->trd.on = 0;
                return kvps_ring__x_taken(f, p, &q->trd, h, payload);
            }
        } else {
            if (!q->rx && !(q->rx = (unsigned char *)malloc(KVPS_RING__TCP_RX))) return 0;
            want = KVPS_RING__TCP_RX;
            n = recv(q->tfd, q->rx, want, MSG_DONTWAIT);
            if (n > 0) {
                q->rx_off = 0;
                q->rx_len = (size_t)n;
                if ((size_t)n < want) q->tready = 0;
                continue;
            }
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) { q->tready = 0; return 0; }
        kvps_ring__x_tcp_end(f, p, n == 0 && !q->trd.on ? 1 : 2); /* (closed mid-message: it failed) */
        return 0;
    }
}

/* Connections to the data port: new ones accepted; each reads its preamble (and nothing past
   it) and, checked, becomes its rank's connection to this rank; a wrong one, a second one for
   a rank, one closed or silent for the ring's timeout is closed with a warning naming its
   address. */
static void kvps_ring__x_accept(kvps_ring__fam *f) {
    if (f->tcp_fd < 0) return;
    for (;;) {
        int fd = accept(f->tcp_fd, NULL, NULL);
        if (fd < 0) break;
        kvps_ring__tcp_opts(fd);
        if (f->npend == KVPS_RING__TCP_PEND) {
            char far[64];
            kvps_ring__tcp_far(fd, far, sizeof far);
            kvps__log(KVPS_LOG_WARN, "ring %d: refused a connection to its data port from %s: %d others wait to prove "
                      "themselves", f->me, far, KVPS_RING__TCP_PEND);
            close(fd);
            continue;
        }
        kvps_ring__pend *e = &f->pend[f->npend++];
        memset(e, 0, sizeof *e);
        e->fd = fd;
        e->since = kvps__now_ms();
        kvps_ring__tcp_far(fd, e->far, sizeof e->far);
    }
    for (int i = 0; i < f->npend;) {
        kvps_ring__pend *e = &f->pend[i];
        ssize_t n = recv(e->fd, e->b + e->got, KVPS_RING__TCP_AUTH - e->got, MSG_DONTWAIT);
        if (n > 0) e->got += (size_t)n;
        const char *why = NULL;
        int src = -1;
        if (e->got == KVPS_RING__TCP_AUTH) {
            if (kvps_ring__tcp_auth_check(e->b, f->size, f->me, f->tok, &src, &why) == 0) {
                if (src < f->me) why = "its rank is one this rank connects to";
                else if (f->peers[src].tfd >= 0 || f->peers[src].tend) why = "its rank is connected already";
            }
        } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            why = "it closed before it said who it is";
        } else if (kvps__now_ms() - e->since > f->timeout_ms) {
            why = "it said nothing for the ring's timeout";
        } else {
            i++;
            continue;
        }
        if (why) {
            kvps__log(KVPS_LOG_WARN, "ring %d: refused a connection to its data port from %s: %s", f->me, e->far, why);
            close(e->fd);
        } else {
            kvps_ring__peer *q = &f->peers[src];
            q->tfd = e->fd;
            if (q->tsndbuf > 0) setsockopt(q->tfd, SOL_SOCKET, SO_SNDBUF, &q->tsndbuf, sizeof q->tsndbuf); /* (as the dialler's) */
            q->topen = q->tready = 1;
            f->in_tcp++;
            if (q->twait) { q->twait = 0; q->out = 2; } /* (its hello came first: the route waited for this) */
        }
        *e = f->pend[--f->npend];
    }
}

/* Reads every whole message waiting in this rank's queues onto the ready list (a send waiting
   for room does it, so that its peer, maybe waiting for room too, can go on). */
static void kvps_ring__x_drain(kvps_ring__fam *f) {
    for (int p = 0; f->in_shm > 0 && p < f->size; p++) {
        kvps_ring__hdr h;
        zmq_msg_t pl;
        while (f->peers[p].in == 1 && kvps_ring__x_take(f, p, &h, &pl)) {
            if (kvps_ring__fifo_put(&f->ready_tail, &h, &pl) != 0) break;
        }
    }
    if (f->tcp_fd >= 0) { /* (a peer's connection may wait there with what it sends; a peer may wait for this rank's) */
        kvps_ring__x_accept(f);
        kvps_ring__x_dial_progress(f);
    }
    for (int p = 0; f->in_tcp > 0 && p < f->size; p++) { /* (a send waiting for room: every connection read) */
        kvps_ring__hdr h;
        zmq_msg_t pl;
        f->peers[p].tready = f->peers[p].topen;
        while (kvps_ring__x_tcp_take(f, p, &h, &pl)) {
            if (kvps_ring__fifo_put(&f->ready_tail, &h, &pl) != 0) break;
        }
    }
}

static int kvps_ring__x_tcp_ready(kvps_ring__fam *f);

/* The next message from any transport, without waiting: 1 (*h, *payload), 0 none. Control
   messages are handled here; malformed ZeroMQ messages are dropped. The ready list first, then,
   taking turns, this rank's queues and its peers' TCP connections (from rank rr on), and the
   router with the data port's new connections. */
static int kvps_ring__x_recv1(kvps_ring__fam *f, kvps_ring__hdr *h, zmq_msg_t *payload) {
    if (f->ready) {
        kvps_ring__stash *e = kvps_ring__fifo_cut(&f->ready, &f->ready_tail);
        *h = e->h;
        *payload = e->payload;
        free(e);
        return 1;
    }
    int direct_first = (f->turn++ & 1) == 0;
    /* every peer through shared memory or its own connection: the router (control messages,
       strangers) and the data port only now and then and after a real wait, not at every look
       (each costs system calls) */
    int router = f->in_shm + f->in_tcp < f->size - 1 || f->router_due || (f->turn & 63) == 0;
    f->router_due = 0;
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0) == direct_first) {
            if (f->in_tcp > 0 && !f->tpolled) kvps_ring__x_tcp_ready(f); /* (a caller that does not wait, as test does) */
            for (int k = 0; f->in_shm + f->in_tcp > 0 && k < f->size; k++) {
                int p = (f->rr + k) % f->size;
                kvps_ring__peer *q = &f->peers[p];
                if ((q->in == 1 && kvps_ring__x_take(f, p, h, payload)) ||
                    ((q->tready || q->rx_off < q->rx_len) && kvps_ring__x_tcp_take(f, p, h, payload))) {
                    f->rr = p + 1;
                    return 1;
                }
            }
            continue;
        }
        if (router && (f->in_shm + f->in_tcp < f->size - 1 || f->accept_due || (f->turn & 63) == 0)) {
            f->accept_due = 0;
            kvps_ring__x_accept(f);
            kvps_ring__x_dial_progress(f);
        }
        for (; router;) {
            zmq_msg_t fr[3];
            int extra, n = f->router ? kvps__recv_msg(f->router, fr, 3, &extra) : 0;
            if (n <= 0) break;
            int ok = n == 3 && !extra && zmq_msg_size(&fr[1]) == sizeof *h;
            if (ok) memcpy(h, zmq_msg_data(&fr[1]), sizeof *h);
            ok = ok && h->magic == KVPS_RING__MAGIC && (h->coll != KVPS_RING__XPORT || (h->src < f->size && h->src != f->me));
            for (int i = 0; i < n && i < 2; i++) zmq_msg_close(&fr[i]);
            if (!ok) {
                kvps__log(KVPS_LOG_WARN, "ring %d: dropped a malformed message", f->me);
                if (n == 3) zmq_msg_close(&fr[2]);
                continue;
            }
            if (h->coll == KVPS_RING__XPORT) { kvps_ring__x_control(f, h, &fr[2]); continue; }
            *payload = fr[2];
            return 1;
        }
    }
    f->tpolled = 0; /* (nothing: the next look polls the connections again, unless a wait does first) */
    return 0;
}

static int kvps_ring__x_recv(kvps_ring__fam *f, kvps_ring__hdr *h, zmq_msg_t *payload) {
    while (kvps_ring__x_recv1(f, h, payload)) {
        if (h->coll != KVPS_RING__XPORT) return 1;
        if (h->ring == 0 && h->src < f->size && h->src != f->me) kvps_ring__x_control(f, h, payload); /* (none comes
            through a queue or a connection today; handled as from the router) */
        else zmq_msg_close(payload);
    }
    return 0;
}

static int kvps_ring__x_shm_ready(kvps_ring__fam *f);

/* Whether a peer's connection to this rank may have bytes: those that do are marked (tready);
   one poll, no wait. */
static int kvps_ring__x_tcp_ready(kvps_ring__fam *f) {
    int n = 0, any = 0;
    f->tpolled = 1;
    for (int p = 0; f->in_tcp > 0 && p < f->size; p++) {
        kvps_ring__peer *q = &f->peers[p];
        if (q->tready || q->rx_off < q->rx_len) any = 1;
        else if (q->topen) {
            f->pfds[n].fd = q->tfd;
            f->pfds[n].events = POLLIN;
            f->pfds[n].revents = 0;
            f->item_peer[n++] = p;
        }
    }
    if (any || n == 0) return any;
    if (poll(f->pfds, (nfds_t)n, 0) <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (f->pfds[i].revents) { f->peers[f->item_peer[i]].tready = 1; any = 1; }
    return any;
}

/* Whether anything may be there to read (a peek: the queues' indices, the connections' poll,
   the router's poll, the data port's). */
static int kvps_ring__x_ready(kvps_ring__fam *f) {
    if (kvps_ring__x_shm_ready(f) || kvps_ring__x_tcp_ready(f)) return 1;
    zmq_pollitem_t it[2];
    int n = 0;
    if (f->router) { it[n].socket = f->router; it[n].fd = 0; it[n].events = ZMQ_POLLIN; it[n++].revents = 0; }
    if (f->tcp_fd >= 0) { it[n].socket = NULL; it[n].fd = f->tcp_fd; it[n].events = ZMQ_POLLIN; it[n++].revents = 0; }
    return n && zmq_poll(it, n, 0) > 0 ? (f->router_due = f->accept_due = 1) : 0;
}

/* One sleep of at most ms in zmq_poll over what can bring this rank something: the router, the
   doorbell (shared-memory writers ring it when sleeping is 2), the peers' connections, the data
   port and the connections not proven yet; and the room on out_fd (a send waiting for it; -1
   none). The connections with bytes are marked (tready); the data port's news is taken with
   the router's (router_due). -1 when zmq_poll fails. */
static int kvps_ring__x_poll(kvps_ring__fam *f, int64_t ms, int out_fd) {
    zmq_pollitem_t *it = f->items;
    int n = 0, bell = f->shm && f->in_shm > 0 && f->bell_rx >= 0;
#define KVPS_RING__ITEM(s_, fd_, ev_, who_) \
    do { it[n].socket = (s_); it[n].fd = (fd_); it[n].events = (short)(ev_); it[n].revents = 0; f->item_peer[n++] = (who_); } while (0)
    if (f->router) KVPS_RING__ITEM(f->router, 0, ZMQ_POLLIN, -1);
    if (bell) KVPS_RING__ITEM(NULL, f->bell_rx, ZMQ_POLLIN, -1);
    if (f->tcp_fd >= 0) KVPS_RING__ITEM(NULL, f->tcp_fd, ZMQ_POLLIN, -1);
    for (int i = 0; i < f->npend; i++) KVPS_RING__ITEM(NULL, f->pend[i].fd, ZMQ_POLLIN, -1);
    for (int p = 0; p < f->size; p++) {
        const kvps_ring__peer *q = &f->peers[p];
        if (q->topen) KVPS_RING__ITEM(NULL, q->tfd, ZMQ_POLLIN, p);
        else if (q->tdial && q->twait) KVPS_RING__ITEM(NULL, q->tfd, ZMQ_POLLOUT, -2); /* (its connect completes) */
    }
    if (out_fd >= 0) KVPS_RING__ITEM(NULL, out_fd, ZMQ_POLLOUT, -1);
#undef KVPS_RING__ITEM
    kvps_ring__shm_head *hd = bell ? (kvps_ring__shm_head *)(void *)f->shm : NULL;
    if (hd) {
        __atomic_store_n(&hd->sleeping, 2, __ATOMIC_SEQ_CST);
        if (kvps_ring__x_shm_ready(f)) ms = 0;
    }
    int rc = zmq_poll(it, n, (long)ms);
    if (hd) {
        __atomic_store_n(&hd->sleeping, 0, __ATOMIC_SEQ_CST);
        char drain[64];
        while (recv(f->bell_rx, drain, sizeof drain, MSG_DONTWAIT) > 0) {}
    }
    if (rc < 0) return zmq_errno() == EINTR ? 0 : -1;
    f->tpolled = 1;
    for (int i = 0; i < n; i++)
        if (it[i].revents & ZMQ_POLLIN) {
            if (f->item_peer[i] >= 0) f->peers[f->item_peer[i]].tready = 1;
            else f->router_due = f->accept_due = 1;
        } else if (it[i].revents && f->item_peer[i] == -2) {
            f->router_due = f->accept_due = 1;
        }
    return 0;
}

/* Sleeps on this rank's bell for at most ms, unless something is there already (the order of
   the flag, the bell and the look makes a writer's ring after the look wake it). */
static void kvps_ring__x_sleep(kvps_ring__fam *f, int64_t ms, kvps_ring__shm_ctl *room_q, uint64_t tail) {
    kvps_ring__shm_head *hd = (kvps_ring__shm_head *)(void *)f->shm;
    uint32_t *want_room = room_q ? &room_q->want_room : NULL;
    __atomic_store_n(&hd->sleeping, 1, __ATOMIC_SEQ_CST);
    if (want_room) __atomic_store_n(want_room, 1, __ATOMIC_SEQ_CST);
    uint32_t seen = __atomic_load_n(&hd->bell, __ATOMIC_SEQ_CST);
    int room = want_room && __atomic_load_n(&room_q->head, __ATOMIC_SEQ_CST) != tail - f->shm_cap;
    if (!room && !kvps_ring__x_ready(f)) kvps_ring__futex_wait(&hd->bell, seen, ms);
    if (want_room) __atomic_store_n(want_room, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&hd->sleeping, 0, __ATOMIC_SEQ_CST);
}

/* Whether a queue of this rank's holds bytes not read yet, or the ready list a message. */
static int kvps_ring__x_shm_ready(kvps_ring__fam *f) {
    for (int p = 0; p < f->size; p++) {
        if (f->peers[p].in != 1) continue;
        kvps_ring__shm_ctl *c = kvps_ring__shm_q(f->shm, f->shm_cap, p);
        if (__atomic_load_n(&c->tail, __ATOMIC_ACQUIRE) != __atomic_load_n(&c->head, __ATOMIC_RELAXED)) return 1;
    }
    return f->ready != NULL;
}

/* Waits until a message may be there, at most left ms (a slice of it: the caller looks and
   waits again). First, with every peer through shared memory, a look at the queues alone; then a
   few yields (BENCHMARKS.md: a piece is often microseconds away, and where ranks share CPUs
   waking from a sleep costs more; not for long: under another busy process each yield gives
   away a time slice); then a sleep: on the futex when every peer's messages come through shared
   memory, else in one zmq_poll over the router, the doorbell when some do (in 1 ms turns between
   zmq_poll and the futex where the doorbell could not be made) and the TCP connections. */
static kvps_result kvps_ring__x_wait(kvps_ring__fam *f, int64_t left) {
    /* every peer through shared memory: first a look at the queues alone, no system call, for
       a few microseconds (a small message from a peer running on another CPU) */
    if (f->in_shm == f->size - 1)
        for (int i = 0; i < KVPS_RING__PEEK; i++) {
            if (kvps_ring__x_shm_ready(f)) return KVPS_OK;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    int64_t spin_end = kvps__now_us() + KVPS_RING__SPIN_US;
    /* every peer through shared memory or its own connection: the router, rarely used, is
       looked at every 4th look */
    int direct = f->in_shm + f->in_tcp == f->size - 1;
    int own_cpu = f->local <= f->cpus; /* a CPU for every rank here: looks without yields (as MPI's progress loop) */
    for (int spin = 0; (own_cpu || spin < KVPS_RING__SPIN) && kvps__now_us() < spin_end; spin++) {
        if (!own_cpu) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else if (spin) __builtin_ia32_pause();
#endif
        if (direct && (spin & 63) != 63 ? kvps_ring__x_shm_ready(f) || kvps_ring__x_tcp_ready(f) : kvps_ring__x_ready(f))
            return KVPS_OK;
    }
    kvps_ring__x_maybe_unlink(f);
    if (f->in_shm == f->size - 1) {
        kvps_ring__x_sleep(f, left < 100 ? left : 100, NULL, 0);
        f->router_due = 1; /* (the router was not watched in that sleep: the next read looks at it) */
    } else if (f->in_shm > 0 && f->bell_rx < 0) { /* no doorbell: 1 ms turns between zmq_poll and the futex */
        if (kvps_ring__x_poll(f, left < 1 ? left : 1, -1) != 0) return KVPS_ERR_ZMQ;
        if (!kvps_ring__x_ready(f)) kvps_ring__x_sleep(f, 1, NULL, 0);
        f->router_due = 1;
    } else if (kvps_ring__x_poll(f, left < 100 ? left : 100, -1) != 0) {
        return KVPS_ERR_ZMQ;
    }
    return KVPS_OK;
}

/* Liveness (section 5): reads the dealers' monitors, at most every 10 ms: a handshake that
   succeeded marks a peer's ZeroMQ connection up, a drop (the peer closed or died, or its
   heartbeats went unanswered for peer_timeout_ms) or a failed handshake down from then on. */
static void kvps_ring__x_watch(kvps_ring__fam *f) {
    int64_t now = kvps__now_ms();
    if (now - f->watched < 10) return;
    f->watched = now;
    for (int p = 0; p < f->size; p++) {
        kvps_ring__peer *q = &f->peers[p];
        uint16_t ev = 0;
        int32_t val = 0;
        while (f->mons[p] && kvps__monitor_event(f->mons[p], &ev, &val)) {
            if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) { q->zup = 1; q->zdown = 0; }
            else if (ev & (ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH))
                q->zdown = q->zdown ? q->zdown : now;
        }
    }
}

/* How root rank p's process is, in words for the stall inspector: "process 4242 on this host,
   stopped; its ZeroMQ connection down for 3 s". */
static void kvps_ring__x_peer_text(kvps_ring__fam *f, int p, char *buf, size_t cap) {
    kvps_ring__peer *q = &f->peers[p];
    char st = q->same && q->pid ? kvps_ring__pid_state(q->pid) : 0;
    const char *how = st == 'T' || st == 't' ? ", stopped (SIGSTOP or a debugger)" : st == 'Z' || st == 'X' ? ", dead"
                    : st ? ", alive" : "";
    kvps_ring__x_watch(f);
    char conn[64] = "";
    if (q->zdown) snprintf(conn, sizeof conn, "; its ZeroMQ connection down for %lld s", (long long)(kvps__now_ms() - q->zdown) / 1000);
    else if (q->zup) snprintf(conn, sizeof conn, "; it answers heartbeats");
    if (!q->hello) snprintf(buf, cap, "no hello from it yet: not connected");
    else if (q->same) snprintf(buf, cap, "process %d on this host%s%s", (int)q->pid, how, conn);
    else snprintf(buf, cap, "process %d at %s%s", (int)q->pid, q->thost[0] ? q->thost : "another host", conn);
}

/* Whether root rank p is gone, in words that follow "rank N ": its connection to this rank
   ended and every byte it sent has been read, or, on this host, its process exited or was
   killed (looked at once per 100 ms at most), or its ZeroMQ connection has been down for
   peer_timeout_ms (it died, was stopped, or its network failed: section 5). NULL while it is
   not known to be. */
static const char *kvps_ring__x_gone(kvps_ring__fam *f, int p, char *buf, size_t cap) {
    kvps_ring__peer *q = &f->peers[p];
    if (q->tend && !q->topen) {
        snprintf(buf, cap, "(process %d at %s) %s", (int)q->pid, q->thost,
                 q->tend == 1   ? "closed its connection to this rank: it ended or died"
                 : q->tend == 2 ? "reset its connection to this rank: it died or its network failed"
                                : "sent a malformed stream and was cut off");
        return buf;
    }
    int64_t now = kvps__now_ms();
    if (q->same && q->pid && now - q->looked >= 100) {
        q->looked = now;
        q->gone = kvps_ring__pid_gone(q->pid);
    }
    if (q->same && q->pid && q->gone) {
        snprintf(buf, cap, "(process %d on this host) is gone: it died", (int)q->pid);
        return buf;
    }
    kvps_ring__x_watch(f);
    if (!q->zdown || now - q->zdown < f->peer_timeout_ms) return NULL;
    char st = q->same && q->pid ? kvps_ring__pid_state(q->pid) : 0;
    char where[96];
    if (q->same) snprintf(where, sizeof where, "(process %d on this host)", (int)q->pid);
    else snprintf(where, sizeof where, "(process %d at %s)", (int)q->pid, q->thost[0] ? q->thost : "another host");
    snprintf(buf, cap, "%s is unreachable: no ZeroMQ connection for %lld ms (closed, or no heartbeat for %d ms): %s",
             where, (long long)(now - q->zdown), f->peer_timeout_ms,
             st == 'T' || st == 't' ? "it is stopped (SIGSTOP), which counts as dead" : "it died, stopped, or its network failed");
    return buf;
}

/* The stall inspector (section 5). A call starts its wait (kvps_ring__x_wait_start); a wait loop
   asks kvps_ring__x_stall_due after each sleep and, when it says so, logs what it waits for with
   kvps_ring__x_stall: "ring 0: stalled for 60 s waiting for rank 2 (process 4242 on this host,
   stopped ...) in allreduce of ...", again every stall_ms. */
static void kvps_ring__x_wait_start(kvps_ring__fam *f, int stall_ms) {
    f->stall_ms = stall_ms;
    f->wait_t0 = kvps__now_ms();
    f->stall_at = stall_ms > 0 ? f->wait_t0 + stall_ms : KVPS__NEVER;
}
static int kvps_ring__x_stall_due(kvps_ring__fam *f) {
    int64_t now = kvps__now_ms();
    if (now < f->stall_at) return 0;
    f->stall_at = now + f->stall_ms;
    return 1;
}
static void kvps_ring__x_stall(kvps_ring__fam *f, int p, const char *what, const char *call) {
    char how[200];
    kvps_ring__x_peer_text(f, p, how, sizeof how);
    kvps__log(KVPS_LOG_WARN, "ring %d: stalled for %lld s %s rank %d (%s) in %s", f->me,
              (long long)(kvps__now_ms() - f->wait_t0) / 1000, what, p, how, call);
}
/* The same for a message h being sent to or awaited from root rank p. */
static const char *kvps_ring__call_text(const kvps_ring__hdr *h, char *buf, size_t cap);
static void kvps_ring__x_stall_msg(kvps_ring__fam *f, int p, const char *what, const kvps_ring__hdr *h) {
    char call[160];
    if (h->coll == KVPS_RING__P2P) snprintf(call, sizeof call, "a p2p message (tag %u)", (unsigned)h->tag);
    else kvps_ring__call_text(h, call, sizeof call);
    kvps_ring__x_stall(f, p, what, call);
}

/* The first ring is destroyed: writers are told to drop what they send to this rank (its
   segment closed), the segment unlinked if it was not yet, every mapping and message let go. */
static void kvps_ring__x_close(kvps_ring__fam *f) {
    if (f->shm) {
        kvps_ring__shm_head *hd = (kvps_ring__shm_head *)(void *)f->shm;
        __atomic_store_n(&hd->closed, 1, __ATOMIC_RELEASE);
        kvps_ring__shm_unlink_name(f->shm_name);
    }
    for (int p = 0; p < f->size; p++) {
        kvps_ring__peer *q = &f->peers[p];
        if (q->seg) kvps_ring__shm_ring(q->seg, f->bell_tx, q->bell, q->bell_len); /* a peer asleep for room here wakes, sees it closed */
        kvps_ring__shm_unmap(q->seg, q->seg_bytes);
        q->seg = NULL;
        q->out = 0;
        if (q->rd.on) zmq_msg_close(&q->rd.m);
        q->rd.on = 0;
        q->in = 0;
    }
    kvps_ring__shm_unmap(f->shm, f->shm_bytes);
    f->shm = NULL;
    f->in_shm = 0;
    for (int p = 0; p < f->size; p++) { /* (what this rank sent is in the kernel's hands: close delivers it) */
        kvps_ring__peer *q = &f->peers[p];
        kvps_ring__x_tcp_end(f, p, 0);
        free(q->rx);
        q->rx = NULL;
    }
    for (int i = 0; i < f->npend; i++) close(f->pend[i].fd);
    f->npend = 0;
    if (f->tcp_fd >= 0) close(f->tcp_fd);
    f->tcp_fd = -1;
    free(f->tok);
    f->tok = NULL;
    if (f->bell_rx >= 0) close(f->bell_rx);
    if (f->bell_tx >= 0) close(f->bell_tx);
    f->bell_rx = f->bell_tx = -1;
    kvps_ring__fifo_free(&f->ready);
    f->ready_tail = &f->ready;
}

/* Sends [h][data] to root rank p through p's segment: what fits at once, the rest as p makes
   room, reading this rank's own queues meanwhile. A peer whose ring is closed gets nothing (as
   over ZeroMQ, what reaches a closed socket is dropped). 0 sent; 1 deadline passed; 2 the peer's
   process is gone; 3 its queue's indices are malformed. */
static int kvps_ring__x_shm_send(kvps_ring__fam *f, int p, const kvps_ring__hdr *h, const void *data, size_t bytes,
                                 int64_t deadline) {
    kvps_ring__peer *q = &f->peers[p];
    kvps_ring__shm_head *hd = (kvps_ring__shm_head *)(void *)q->seg;
    const uint64_t cap = f->shm_cap;
    kvps_ring__shm_ctl *c = kvps_ring__shm_q(q->seg, cap, f->me);
    unsigned char *d = (unsigned char *)c + KVPS_RING__SHM_PAGE, pre[KVPS_RING__SHM_PRE];
    uint64_t len = bytes, tail = __atomic_load_n(&c->tail, __ATOMIC_RELAXED); /* (this rank is its only writer) */
    memcpy(pre, &len, 8);
    memcpy(pre + 8, h, sizeof *h);
    size_t done = 0, total = sizeof pre + bytes;
    for (int spins = 0; done < total;) {
        if (__atomic_load_n(&hd->closed, __ATOMIC_ACQUIRE)) return 0;
        uint64_t head = __atomic_load_n(&c->head, __ATOMIC_ACQUIRE);
        if (tail - head > cap) return 3;
        size_t room = (size_t)(cap - (tail - head));
        if (room) {
            size_t n = room < total - done ? room : total - done;
            size_t a = done < sizeof pre ? (n < sizeof pre - done ? n : sizeof pre - done) : 0;
            if (a) kvps_ring__shm_put(d, cap, tail, pre + done, a);
            if (n > a) kvps_ring__shm_put(d, cap, tail + a, (const char *)data + (done + a - sizeof pre), n - a);
            tail += n;
            done += n;
            __atomic_store_n(&c->tail, tail, __ATOMIC_RELEASE);
            kvps_ring__shm_ring(q->seg, f->bell_tx, q->bell, q->bell_len);
            spins = 0;
            continue;
        }
        kvps_ring__x_drain(f);
        int64_t left = deadline - kvps__now_ms();
        if (left <= 0) return 1;
        char gone[320];
        if (kvps_ring__x_gone(f, p, gone, sizeof gone)) return 2;
        if (kvps_ring__x_stall_due(f)) kvps_ring__x_stall_msg(f, p, "waiting for room in the shared-memory queue of", h);
        if (spins++ < KVPS_RING__SPIN) { sched_yield(); continue; }
        kvps_ring__x_sleep(f, left < 10 ? left : 10, c, tail);
    }
    return 0;
}


static void kvps_ring__zc_free(void *data, void *hint) {
    /* hint encodes the block and the phase: the block pointer with the phase in bit 0 */
    (void)data;
    uintptr_t h = (uintptr_t)hint;
    kvps_ring__zc *z = (kvps_ring__zc *)(h & ~(uintptr_t)1);
    /* seq_cst with the drain's store of waiting and load of pending: either the drain sees the
       phase empty, or this sees it waiting and wakes it (it holds mu until it sleeps) */
    if (__atomic_sub_fetch(&z->pending[h & 1], 1, __ATOMIC_SEQ_CST) == 0 && __atomic_load_n(&z->waiting, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&z->mu);
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
    }
    kvps_ring__zc_unref(z);
}

static const char *kvps_ring__call_text(const kvps_ring__hdr *h, char *buf, size_t cap);

static int kvps_ring__read(kvps_ring *r, kvps_ring__hdr *h, zmq_msg_t *payload);
static void kvps_ring__deliver(kvps_ring *t, const kvps_ring__hdr *h, zmq_msg_t *payload);

/* How this rank reaches rank dst of r, for a message h: 1 through shared memory, 0 over ZeroMQ
   (or the ring is closed: the send says so), -1 failed (recorded). Decided when dst's hello is
   read: before the first message to dst this waits for it, within the call's deadline (a p2p
   message: the ring's timeout; an abort notice does not wait), keeping what arrives meanwhile
   for the rings it is for. */
/* Waits until rank p of the family's first ring has said hello (conn: has connected to this
   rank's data port), reading meanwhile (what comes is kept for the rings it is for; control
   messages are handled as they are read, so the hello is looked for after every read): KVPS_OK,
   KVPS_ERR_TIMEOUT when dl passes, KVPS_ERR_PEER_LOST when p is gone (kvps_ring__x_gone),
   KVPS_ERR_ZMQ. */
static kvps_result kvps_ring__x_await(kvps_ring *r, int p, int64_t dl, int conn) {
    kvps_ring__peer *q = &r->fam->peers[p];
    while (conn ? q->twait : !q->hello) {
        kvps_ring__hdr m;
        zmq_msg_t pl;
        if (conn) kvps_ring__x_dial_progress(r->fam);
        if (kvps_ring__read(r, &m, &pl)) { kvps_ring__deliver(r, &m, &pl); continue; }
        if (conn ? !q->twait : q->hello) break;
        int64_t left = dl - kvps__now_ms();
        if (left <= 0) return KVPS_ERR_TIMEOUT;
        if (kvps_ring__x_wait(r->fam, left) != KVPS_OK) return KVPS_ERR_ZMQ;
        char gone[320];
        if (kvps_ring__x_gone(r->fam, p, gone, sizeof gone) && !kvps_ring__x_ready(r->fam)) return KVPS_ERR_PEER_LOST;
        if (kvps_ring__x_stall_due(r->fam))
            kvps_ring__x_stall(r->fam, p, "waiting for", conn ? "its connection to this rank's data port" : "its hello");
    }
    return KVPS_OK;
}
static kvps_result kvps_ring__x_await_hello(kvps_ring *r, int p, int64_t dl) { return kvps_ring__x_await(r, p, dl, 0); }

static int kvps_ring__x_route(kvps_ring *r, int dst, const kvps_ring__hdr *h) {
    int p = r->root_rank[dst];
    kvps_ring__peer *q = &r->fam->peers[p];
    if (!kvps_ring__dealer(r, dst)) return 0;
    int64_t dl = h->abort ? kvps__now_ms() + 200 : h->coll == KVPS_RING__P2P ? kvps_ring__dl(r) : r->deadline;
    kvps_result rc = KVPS_OK;
    if (!q->hello && !h->abort) {
        int64_t hdl = kvps_ring__hello_dl(r, dl);
        rc = kvps_ring__x_await(r, p, hdl, 0);
        if (rc == KVPS_ERR_TIMEOUT)
            return kvps_ring__fail(r, rc, "rank %d: timed out after %d ms waiting for rank %d's hello (the first message of "
                                   "a rank that connects) to send it a message: it never connected", r->rank,
                                   kvps_ring__hello_ms(r), dst), -1;
    }
    if (rc == KVPS_OK && q->twait && !h->abort) { /* the pair's connection first (an abort notice goes over ZeroMQ) */
        rc = kvps_ring__x_await(r, p, dl, 1);
        if (rc == KVPS_ERR_TIMEOUT)
            return kvps_ring__fail(r, rc, "rank %d: timed out after %d ms waiting for rank %d to connect to this rank's data "
                                   "port %u (TCP) to send it a message", r->rank, r->desc.timeout_ms, dst,
                                   (unsigned)r->fam->tcp_port), -1;
    }
    char gone[320];
    if (rc == KVPS_ERR_PEER_LOST && kvps_ring__x_gone(r->fam, p, gone, sizeof gone))
        return kvps_ring__fail(r, rc, "rank %d: rank %d %s, while this rank waited for it to %s", r->rank, dst, gone,
                               q->hello ? "connect to this rank's data port" : "say hello"), -1;
    if (rc != KVPS_OK) return kvps_ring__fail(r, rc, "poll: %s", zmq_strerror(zmq_errno())), -1;
    return q->twait ? 0 : q->out;
}

/* Sends [h][data] to root rank p over the pair's connection: with non-blocking writes, reading this rank's own connections and queues
   whenever the kernel has no room, so that two ranks sending to each other never wait on each
   other. 0 sent (in the kernel's hands: the caller may reuse data); 1 deadline passed; 2 the
   connection failed (*err: errno); 4 the peer is gone otherwise (kvps_ring__x_gone: its process,
   its ZeroMQ connection). */
static int kvps_ring__x_tcp_send(kvps_ring__fam *f, int p, const kvps_ring__hdr *h, const void *data, size_t bytes,
                                 int64_t deadline, int *err) {
    kvps_ring__peer *q = &f->peers[p];
    unsigned char pre[KVPS_RING__SHM_PRE];
    uint64_t len = bytes;
    memcpy(pre, &len, 8);
    memcpy(pre + 8, h, sizeof *h);
    size_t done = 0, total = sizeof pre + bytes;
    while (done < total) {
        struct iovec iov[2];
        int n = 0;
        if (!q->topen) { *err = q->tend == 2 ? ECONNRESET : EPIPE; return 2; } /* (closed as it was read) */
        if (done < sizeof pre) {
            iov[n].iov_base = pre + done;
            iov[n++].iov_len = sizeof pre - done;
        }
        size_t off = done > sizeof pre ? done - sizeof pre : 0;
        if (off < bytes) {
            iov[n].iov_base = (char *)(uintptr_t)data + off;
            iov[n++].iov_len = bytes - off;
        }
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(q->tfd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) { *err = errno; return 2; }
        kvps_ring__x_drain(f);
        int64_t left = deadline - kvps__now_ms();
        if (left <= 0) return 1;
        char gone[320];
        if (kvps_ring__x_gone(f, p, gone, sizeof gone)) return 4;
        if (kvps_ring__x_stall_due(f)) kvps_ring__x_stall_msg(f, p, "waiting for room in the TCP connection to", h);
        if (kvps_ring__x_poll(f, left < 10 ? left : 10, q->topen ? q->tfd : -1) != 0) { *err = EIO; return 2; }
    }
    return 0;
}

/* Sends [h][data] to rank dst of r through its queue or over this rank's connection to it, with
   the ring's words for a failure: within the running collective's deadline (a p2p message: the
   ring's timeout; an abort notice: 200 ms, and no failure recorded). */
static kvps_result kvps_ring__x_send(kvps_ring *r, int dst, const kvps_ring__hdr *h, const void *data, size_t bytes) {
    int64_t dl = h->abort ? kvps__now_ms() + 200 : h->coll == KVPS_RING__P2P ? kvps_ring__dl(r) : r->deadline;
    int p = r->root_rank[dst], err = 0;
    kvps_ring__peer *q = &r->fam->peers[p];
    int tcp = q->out == 2;
    int e = tcp ? kvps_ring__x_tcp_send(r->fam, p, h, data, bytes, dl, &err) : kvps_ring__x_shm_send(r->fam, p, h, data, bytes, dl);
    char call[128];
    if (e == 0 || h->abort) return KVPS_OK;
    if (h->coll != KVPS_RING__P2P) kvps_ring__call_text(&r->cur, call, sizeof call);
    else snprintf(call, sizeof call, "a p2p message to it (tag %u)", (unsigned)h->tag);
    if (e == 1)
        return kvps_ring__fail(r, KVPS_ERR_TIMEOUT, "rank %d: timed out after %d ms waiting for rank %d to make room in its "
                               "%s, in %s", r->rank, r->desc.timeout_ms, dst, tcp ? "TCP connection" : "shared-memory queue", call);
    if (e == 2 && tcp)
        return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d (process %d at %s:%u) is unreachable: its "
                               "connection failed (%s): it died or its network failed, before it took %s", r->rank, dst,
                               (int)q->pid, q->thost, (unsigned)q->tport, strerror(err), call);
    char gone[320];
    if (e == 2 && !tcp && !q->gone && kvps_ring__x_gone(r->fam, p, gone, sizeof gone)) e = 4; /* (by its heartbeats) */
    if (e == 2)
        return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d (process %d on this host) is gone: it died before "
                               "taking %s", r->rank, dst, (int)q->pid, call);
    if (e == 4 && kvps_ring__x_gone(r->fam, p, gone, sizeof gone))
        return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d %s, before it took %s", r->rank, dst, gone, call);
    return kvps_ring__fail(r, KVPS_ERR_MALFORMED, "rank %d: rank %d's shared-memory queue is malformed (its indices), in %s",
                           r->rank, dst, call);
}

/* The part of a send that shared memory takes: 1 when it took the message (consumed; *rc its
   result, or the route's failure), 0 when the message goes over ZeroMQ. */
static int kvps_ring__x_post(kvps_ring *r, int dst, const kvps_ring__hdr *h, zmq_msg_t *payload, kvps_result *rc) {
    int how = kvps_ring__x_route(r, dst, h);
    if (how == 0) return 0;
    *rc = how < 0 ? KVPS_ERR_TIMEOUT : kvps_ring__x_send(r, dst, h, zmq_msg_data(payload), zmq_msg_size(payload));
    zmq_msg_close(payload);
    return 1;
}

/* Sends [h][payload] to rank dst; the payload frame is consumed. */
static kvps_result kvps_ring__post(kvps_ring *r, int dst, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    kvps_result rc;
    if (kvps_ring__x_post(r, dst, h, payload, &rc)) return rc;
    zmq_msg_t f[2];
    kvps__msg_from_buf(&f[0], h, sizeof *h);
    f[1] = *payload;
    zmq_msg_init(payload);
    void *d = kvps_ring__dealer(r, dst);
    if (!d) { zmq_msg_close(&f[0]); zmq_msg_close(&f[1]); return KVPS_ERR_STATE; }
    r->fam->peers[r->root_rank[dst]].zsent = 1;
    if (kvps__send_frames(d, f, 2) != 0)
        return kvps_ring__fail(r, zmq_errno() == EAGAIN ? KVPS_ERR_PEER : KVPS_ERR_ZMQ, "%s: send to rank %d: %s",
                               kvps_coll_name((kvps_coll)r->cur.coll), dst,
                               zmq_errno() == EAGAIN ? "no connection (the peer is gone)" : zmq_strerror(zmq_errno()));
    return KVPS_OK;
}

static kvps_result kvps_ring__send_hdr(kvps_ring *r, int dst, const kvps_ring__hdr *h, const void *data,
                                       size_t bytes, int phase_zc) {
    zmq_msg_t pl;
    int how = kvps_ring__x_route(r, dst, h);
    if (how < 0) return KVPS_ERR_TIMEOUT;
    if (how) return kvps_ring__x_send(r, dst, h, data, bytes); /* straight into the queue */
    if (bytes >= KVPS_RING__ZC_MIN && phase_zc >= 0) {
        kvps_ring__zc *z = r->zc;
        r->zc_dst = dst;
        __atomic_add_fetch(&z->pending[phase_zc], 1, __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&z->refs, 1, __ATOMIC_ACQ_REL);
        if (zmq_msg_init_data(&pl, (void *)(uintptr_t)data, bytes, kvps_ring__zc_free,
                              (void *)((uintptr_t)z | (uintptr_t)phase_zc)) != 0) {
            __atomic_sub_fetch(&z->pending[phase_zc], 1, __ATOMIC_ACQ_REL);
            __atomic_sub_fetch(&z->refs, 1, __ATOMIC_ACQ_REL);
            return KVPS_ERR_NOMEM;
        }
    } else if (kvps__msg_from_buf(&pl, data, bytes) != 0) {
        return KVPS_ERR_NOMEM;
    }
    return kvps_ring__post(r, dst, h, &pl);
}

/* Sends a piece of the running collective. phase_zc: which zero-copy counter (0/1), -1 to copy. */
static kvps_result kvps_ring__send(kvps_ring *r, int dst, uint64_t tag, const void *data, size_t bytes,
                                   int phase_zc) {
    kvps_ring__hdr h = r->cur;
    h.tag = tag + r->hier;
    return kvps_ring__send_hdr(r, dst, &h, data, bytes, phase_zc);
}

/* Tells every peer that this collective failed, so they stop waiting. */
static void kvps_ring__abort_all(kvps_ring *r, kvps_result rc) {
    kvps_ring__hdr h = r->cur;
    h.abort = 1;
    h.count = (uint64_t)(int64_t)rc;
    for (int i = 0; i < r->size; i++)
        if (i != r->rank && kvps_ring__dealer(r, i)) kvps_ring__send_hdr(r, i, &h, r->errmsg, strlen(r->errmsg), -1);
}

/* A call as a header describes it: "allreduce of 100 float32 (sum, root 0)", and its wire format
   when it has one (the dtype byte's high half: KVPS_FLOAT16 or KVPS_BFLOAT16). */
static const char *kvps_ring__call_text(const kvps_ring__hdr *h, char *buf, size_t cap) {
    char list[48] = "";
    if (h->layout == KVPS_RING__JOIN_LAYOUT) snprintf(list, sizeof list, ", the agreement on who has joined"); /* (>>join) */
    else if (h->layout) snprintf(list, sizeof list, ", a list of buffers of layout %08x", (unsigned)h->layout);
    snprintf(buf, cap, "%s of %llu %s (%s, root %u%s%s%s)", kvps_coll_name((kvps_coll)h->coll), (unsigned long long)h->count,
             kvps_dtype_name((kvps_dtype)(h->dtype & 15)), kvps_redop_name((kvps_redop)h->op), h->root,
             h->dtype >> 4 ? ", on the wire as " : "", h->dtype >> 4 ? kvps_dtype_name((kvps_dtype)(h->dtype >> 4)) : "", list);
    return buf;
}

/* A piece checked against the running call; text: an abort's payload (the aborting rank's own
   message, which names what it waited for), or NULL. */
static kvps_result kvps_ring__check(kvps_ring *r, const kvps_ring__hdr *h, zmq_msg_t *text) {
    if (h->abort) {
        r->abort_rc = (kvps_result)(int64_t)h->count;
        r->abort_tag = h->tag;
        int len = text ? (int)(zmq_msg_size(text) < 240 ? zmq_msg_size(text) : 240) : 0;
        return kvps_ring__fail(r, KVPS_ERR_PEER, "rank %u aborted the %s: %s%s%.*s", h->src,
                               kvps_coll_name((kvps_coll)r->cur.coll), kvps_result_str((kvps_result)(int64_t)h->count),
                               len ? ": " : "", len, len ? (const char *)zmq_msg_data(text) : "");
    }
    const kvps_ring__hdr *c = &r->cur;
    if (h->coll != c->coll || h->dtype != c->dtype || h->op != c->op || h->count != c->count || h->root != c->root ||
        h->layout != c->layout) {
        char theirs[128], ours[128];
        return kvps_ring__fail(r, KVPS_ERR_MISMATCH, "rank %u called %s; this rank (%d) called %s", h->src,
                               kvps_ring__call_text(h, theirs, sizeof theirs), r->rank, kvps_ring__call_text(c, ours, sizeof ours));
    }
    return KVPS_OK;
}

/* Appends a message to a FIFO list (the stash entries' type). */
static int kvps_ring__fifo_put(kvps_ring__stash ***tail, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    kvps_ring__stash *e = (kvps_ring__stash *)malloc(sizeof *e);
    if (!e) { zmq_msg_close(payload); return -1; }
    e->h = *h;
    e->payload = *payload;
    e->next = NULL;
    **tail = e;
    *tail = &e->next;
    return 0;
}

/* Unlinks *pp from a FIFO list whose tail pointer is *tail; returns it. */
static kvps_ring__stash *kvps_ring__fifo_cut(kvps_ring__stash **pp, kvps_ring__stash ***tail) {
    kvps_ring__stash *e = *pp;
    *pp = e->next;
    if (*tail == &e->next) *tail = pp;
    return e;
}

static int kvps_ring__p2p_keep(kvps_ring *r, const kvps_ring__hdr *h, zmq_msg_t *payload);

/* The family's ring with id `id`, NULL when this rank has none (not made yet, or destroyed). */
static kvps_ring *kvps_ring__member(const kvps_ring__fam *f, uint32_t id) {
    kvps_ring *t = f->rings;
    while (t && t->id != id) t = t->fam_next;
    return t;
}

/* A message ring t's reader did not read itself: p2p ones kept for its p2p calls, collective
   ones held for its collectives, in order (a collective abort also says its sender broke). */
static void kvps_ring__deliver(kvps_ring *t, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    if (h->coll == KVPS_RING__P2P) { kvps_ring__p2p_keep(t, h, payload); return; }
    if (h->abort && !t->p2p_gone[h->src]) {
        snprintf(t->p2p_why, sizeof t->p2p_why, "it aborted a collective (%s)", kvps_result_str((kvps_result)(int64_t)h->count));
        t->p2p_why_rank = h->src;
        t->p2p_gone[h->src] = 1;
    }
    kvps_ring__fifo_put(&t->held_tail, h, payload);
}

/* A message for a sub-ring this rank does not have: ids only grow, so one above every id made
   here is for a sub-ring a faster peer has made already (kept, handed over when this rank makes
   it: kvps_ring_split); the rest are late pieces of a destroyed one (dropped). */
static void kvps_ring__orphan(kvps_ring__fam *f, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    if (h->ring > f->max_ring) { kvps_ring__fifo_put(&f->orphans_tail, h, payload); return; }
    kvps__log(KVPS_LOG_DEBUG, "ring: dropped a message for sub-ring %u, gone here", h->ring);
    zmq_msg_close(payload);
}

/* A message for ring r from any transport, without waiting: 1 and *h and *payload (to close)
   filled; 0: none. Malformed ones are dropped, other rings' handed to them. */
static int kvps_ring__read(kvps_ring *r, kvps_ring__hdr *h, zmq_msg_t *payload) {
    for (;;) {
        if (!kvps_ring__x_recv(r->fam, h, payload)) return 0;
        kvps_ring *t = h->ring == r->id ? r : kvps_ring__member(r->fam, h->ring);
        if (t && h->src >= t->size) {
            kvps__log(KVPS_LOG_WARN, "ring %d: dropped a malformed message", r->rank);
            zmq_msg_close(payload);
            continue;
        }
        if (t == r) return 1;
        if (t) kvps_ring__deliver(t, h, payload);
        else kvps_ring__orphan(r->fam, h, payload);
    }
}

/* The next message for a collective: first those a p2p call read and held, then the router's. */
static int kvps_ring__next(kvps_ring *r, kvps_ring__hdr *h, zmq_msg_t *payload) {
    if (!r->held) return kvps_ring__read(r, h, payload);
    kvps_ring__stash *e = kvps_ring__fifo_cut(&r->held, &r->held_tail);
    *h = e->h;
    *payload = e->payload;
    free(e);
    return 1;
}

/* Keeps a p2p message (coll KVPS_RING__P2P) for the p2p calls, whoever read it: data checked
   (a known dtype, a payload of count elements, the next number from its sender), answers and
   aborts as they are. Returns the message's kind, 0 when it was dropped. */
static int kvps_ring__p2p_keep(kvps_ring *r, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    int kind = h->op, src = h->src;
    if (kind == KVPS_RING__P2P_EAGER || kind == KVPS_RING__P2P_SYNC) {
        size_t es = kvps_dtype_size((kvps_dtype)h->dtype);
        if (!es || h->count > ((uint64_t)1 << 40) || h->tag > UINT32_MAX || zmq_msg_size(payload) != h->count * es) {
            kvps__log(KVPS_LOG_WARN, "ring %d: dropped a malformed p2p message from rank %d", r->rank, src);
            zmq_msg_close(payload);
            return 0;
        }
        if (h->seq != r->p2p_next[src]) { /* ZeroMQ lost some (a connection cut): nothing later can be trusted */
            if (!r->p2p_gone[src]) {
                snprintf(r->p2p_why, sizeof r->p2p_why, "message #%u from rank %d arrived when #%u was due (lost "
                         "messages or a malformed one)", h->seq, src, r->p2p_next[src]);
                r->p2p_why_rank = src;
            }
            r->p2p_gone[src] = 2;
            zmq_msg_close(payload);
            return 0;
        }
        r->p2p_next[src]++;
    } else if (kind == KVPS_RING__P2P_ABORT) {
        size_t n = zmq_msg_size(payload) < 160 ? zmq_msg_size(payload) : 160;
        if (!r->p2p_gone[src]) {
            snprintf(r->p2p_why, sizeof r->p2p_why, "%.*s", (int)n, (const char *)zmq_msg_data(payload));
            r->p2p_why_rank = src;
        }
        r->p2p_gone[src] = 1;
    } else if (kind != KVPS_RING__P2P_ACK && kind != KVPS_RING__P2P_NACK) {
        kvps__log(KVPS_LOG_WARN, "ring %d: dropped a p2p message of unknown kind %d from rank %d", r->rank, kind, src);
        zmq_msg_close(payload);
        return 0;
    }
    return kvps_ring__fifo_put(&r->p2p_in_tail, h, payload) == 0 ? kind : 0;
}

/* The receiver's words for a refused message (both sides print them): "rank 1: recv from rank
   0 tag 7 expected 100 float32, rank 0 sent 50 float32". */
static void kvps_ring__p2p_mm_text(char *buf, size_t cap, int me, int src, uint32_t tag, uint64_t want_n, int want_dt,
                                   uint64_t got_n, int got_dt) {
    snprintf(buf, cap, "rank %d: recv from rank %d tag %u expected %llu %s, rank %d sent %llu %s", me, src, tag,
             (unsigned long long)want_n, kvps_dtype_name((kvps_dtype)want_dt), src, (unsigned long long)got_n,
             kvps_dtype_name((kvps_dtype)got_dt));
}

/* A refusal (NACK) in words, as the sender reports it; the NACK's payload echoes the header the
   receiver refused. */
static void kvps_ring__p2p_nack_text(const kvps_ring *r, const kvps_ring__stash *e, char *buf, size_t cap) {
    kvps_ring__hdr sent;
    char mm[200];
    if (zmq_msg_size((zmq_msg_t *)&e->payload) == sizeof sent) {
        memcpy(&sent, zmq_msg_data((zmq_msg_t *)&e->payload), sizeof sent);
        kvps_ring__p2p_mm_text(mm, sizeof mm, e->h.src, r->rank, (uint32_t)e->h.tag, e->h.count, e->h.dtype, sent.count, sent.dtype);
    } else {
        kvps_ring__p2p_mm_text(mm, sizeof mm, e->h.src, r->rank, (uint32_t)e->h.tag, e->h.count, e->h.dtype, 0, 0);
    }
    snprintf(buf, cap, "rank %d: send to rank %u tag %u (message #%u to it) refused by the receiver: %s", r->rank,
             e->h.src, (uint32_t)e->h.tag, e->h.seq, mm);
}

/* The first refusal kept, if any: this rank's send went wrong, so its call fails (section 7). */
static kvps_result kvps_ring__p2p_refused(kvps_ring *r) {
    for (kvps_ring__stash *e = r->p2p_in; e; e = e->next)
        if (e->h.op == KVPS_RING__P2P_NACK) {
            char t[320];
            kvps_ring__p2p_nack_text(r, e, t, sizeof t);
            return kvps_ring__fail(r, KVPS_ERR_MISMATCH, "%s", t);
        }
    return KVPS_OK;
}

/* Receives the piece (src, tag) of the running collective into *out (a payload to close).
   p2p messages met on the way are kept for the p2p calls. */
static kvps_result kvps_ring__recv(kvps_ring *r, int src, uint64_t tag, zmq_msg_t *out) {
    tag += r->hier;
    for (kvps_ring__stash **pp = &r->stash; *pp; pp = &(*pp)->next) {
        kvps_ring__stash *e = *pp;
        if (e->h.seq == r->seq && !e->h.abort && kvps_ring__check(r, &e->h, NULL) != KVPS_OK) return KVPS_ERR_MISMATCH;
        if (e->h.seq == r->seq && ((e->h.src == src && e->h.tag == tag) || e->h.abort)) {
            kvps_result rc = kvps_ring__check(r, &e->h, &e->payload);
            *pp = e->next;
            *out = e->payload;
            free(e);
            if (rc != KVPS_OK) zmq_msg_close(out);
            return rc;
        }
    }
    for (;;) {
        kvps_ring__hdr h;
        zmq_msg_t pl;
        if (!kvps_ring__next(r, &h, &pl)) {
            int64_t left = r->deadline - kvps__now_ms();
            if (left <= 0) {
                char call[128];
                return kvps_ring__fail(r, KVPS_ERR_TIMEOUT, "rank %d: timed out after %d ms waiting for rank %d in %s (this "
                                       "ring's collective #%u)", r->rank, r->desc.timeout_ms, src,
                                       kvps_ring__call_text(&r->cur, call, sizeof call), r->seq);
            }
            if (kvps_ring__x_wait(r->fam, left) != KVPS_OK)
                return kvps_ring__fail(r, KVPS_ERR_ZMQ, "poll: %s", zmq_strerror(zmq_errno()));
            char gone[320];
            if (kvps_ring__x_gone(r->fam, r->root_rank[src], gone, sizeof gone) && !kvps_ring__x_ready(r->fam)) {
                char call[128];
                return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d %s while this rank waited for it in %s "
                                       "(this ring's collective #%u)", r->rank, src, gone,
                                       kvps_ring__call_text(&r->cur, call, sizeof call), r->seq);
            }
            if (kvps_ring__x_stall_due(r->fam)) kvps_ring__x_stall_msg(r->fam, r->root_rank[src], "waiting for", &r->cur);
            continue;
        }
        if (h.coll == KVPS_RING__P2P) {
            int kind = kvps_ring__p2p_keep(r, &h, &pl);
            if (kind == KVPS_RING__P2P_NACK) return kvps_ring__p2p_refused(r); /* "its next call" learns it */
            if (kind == KVPS_RING__P2P_ABORT && h.src == src)
                return kvps_ring__fail(r, KVPS_ERR_PEER, "rank %d: rank %d, waited for in %s, failed in a p2p call: %s",
                                       r->rank, src, kvps_coll_name((kvps_coll)r->cur.coll), r->p2p_why);
            continue;
        }
        if ((int32_t)(h.seq - r->seq) < 0) { /* a late piece of an old collective */
            zmq_msg_close(&pl);
            /* a rank that only sent in the last collective learns of a mismatch here */
            if (h.seq == r->prev.seq && h.abort)
                return kvps_ring__fail(r, KVPS_ERR_PEER, "rank %u aborted the previous collective (%s, #%u): %s", h.src,
                                       kvps_coll_name((kvps_coll)r->prev.coll), h.seq,
                                       kvps_result_str((kvps_result)(int64_t)h.count));
            if (h.seq == r->prev.seq) {
                kvps_ring__hdr c = r->cur;
                r->cur = r->prev;
                kvps_result late = kvps_ring__check(r, &h, NULL);
                r->cur = c;
                if (late != KVPS_OK) return late;
            }
            continue;
        }
        if (h.seq == r->seq && !h.abort && kvps_ring__check(r, &h, NULL) != KVPS_OK) { /* any piece tells */
            zmq_msg_close(&pl);
            return KVPS_ERR_MISMATCH;
        }
        if (h.seq == r->seq && ((h.src == src && h.tag == tag) || h.abort)) {
            kvps_result rc = kvps_ring__check(r, &h, &pl);
            *out = pl;
            if (rc != KVPS_OK) zmq_msg_close(out);
            return rc;
        }
        kvps_ring__stash *e = (kvps_ring__stash *)malloc(sizeof *e);
        if (!e) { zmq_msg_close(&pl); return KVPS_ERR_NOMEM; }
        e->h = h;
        e->payload = pl;
        e->next = NULL;
        kvps_ring__stash **tail = &r->stash;
        while (*tail) tail = &(*tail)->next;
        *tail = e;
    }
}

/* Receives exactly `bytes` into a message; a different size means the ranks disagree. */
static kvps_result kvps_ring__recv_n(kvps_ring *r, int src, uint64_t tag, size_t bytes, zmq_msg_t *out) {
    kvps_result rc = kvps_ring__recv(r, src, tag, out);
    if (rc != KVPS_OK) return rc;
    if (zmq_msg_size(out) != bytes) {
        size_t got = zmq_msg_size(out);
        zmq_msg_close(out);
        return kvps_ring__fail(r, KVPS_ERR_MISMATCH, "rank %d sent %zu bytes in %s, expected %zu", src, got,
                               kvps_coll_name((kvps_coll)r->cur.coll), bytes);
    }
    return KVPS_OK;
}

static kvps_result kvps_ring__recv_copy(kvps_ring *r, int src, uint64_t tag, void *dst, size_t bytes) {
    zmq_msg_t m;
    kvps_result rc = kvps_ring__recv_n(r, src, tag, bytes, &m);
    if (rc != KVPS_OK) return rc;
    if (bytes) memcpy(dst, zmq_msg_data(&m), bytes);
    zmq_msg_close(&m);
    return KVPS_OK;
}

static void *kvps_ring__grow(void **buf, size_t *cap, size_t bytes) {
    if (*cap >= bytes && *buf) return *buf;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    free(*buf);
    *buf = p;
    *cap = bytes;
    return p;
}

/* Payload data, aligned for its dtype (ZeroMQ's receive buffers may start at any byte). */
static const void *kvps_ring__data(kvps_ring *r, zmq_msg_t *m) {
    const void *p = zmq_msg_data(m);
    if (((uintptr_t)p & 7) == 0) return p;
    void *s = kvps_ring__grow(&r->scratch, &r->scratch_cap, zmq_msg_size(m));
    if (!s) return NULL;
    memcpy(s, p, zmq_msg_size(m));
    return s;
}

static int kvps_ring__zc_busy(const kvps_ring *r, int i) {
    return i < 0 ? __atomic_load_n(&r->zc->pending[0], __ATOMIC_SEQ_CST) + __atomic_load_n(&r->zc->pending[1], __ATOMIC_SEQ_CST)
                 : __atomic_load_n(&r->zc->pending[i], __ATOMIC_SEQ_CST);
}

/* Waits until ZeroMQ has let go of every zero-copy frame of phase i (-1: both). An inproc frame
   is let go when the peer reads it, so a peer that stops reading shows up here. It sleeps until
   the I/O thread releases the last frame (kvps_ring__zc_free wakes it; 2 ms at most, as a
   backstop): a yield loop here took CPU that the ranks sharing it needed, on a machine with
   fewer CPUs than ranks (BENCHMARKS.md, tensor fusion). */
static kvps_result kvps_ring__zc_drain(kvps_ring *r, int i, int64_t deadline) {
    for (;;) {
        int busy = kvps_ring__zc_busy(r, i);
        if (busy == 0) return KVPS_OK;
        if (kvps__now_ms() > deadline) {
            char call[128];
            return kvps_ring__fail(r, KVPS_ERR_TIMEOUT, "rank %d: timed out after %d ms waiting for rank %d (the last "
                                   "peer sent to) to take %d frames sent without a copy, in %s (this ring's collective #%u)",
                                   r->rank, r->desc.timeout_ms, r->zc_dst, busy,
                                   kvps_ring__call_text(&r->cur, call, sizeof call), r->seq);
        }
        char gone[320];
        if (kvps_ring__x_gone(r->fam, r->root_rank[r->zc_dst], gone, sizeof gone)) {
            char call[128];
            return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d %s while %d frames sent to it without a copy "
                                   "were not taken, in %s (this ring's collective #%u)", r->rank, r->zc_dst, gone, busy,
                                   kvps_ring__call_text(&r->cur, call, sizeof call), r->seq);
        }
        if (kvps_ring__x_stall_due(r->fam))
            kvps_ring__x_stall_msg(r->fam, r->root_rank[r->zc_dst], "waiting for frames sent without a copy to be taken by", &r->cur);
        kvps_ring__zc *z = r->zc;
        pthread_mutex_lock(&z->mu);
        __atomic_store_n(&z->waiting, 1, __ATOMIC_SEQ_CST);
        if (kvps_ring__zc_busy(r, i)) {
            struct timespec ts = kvps__deadline_ts(2);
            pthread_cond_timedwait(&z->cv, &z->mu, &ts);
        }
        __atomic_store_n(&z->waiting, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&z->mu);
    }
}

static uint64_t kvps_ring__tag(int phase, int dir, uint64_t step, uint64_t piece) {
    return ((uint64_t)phase << 56) | ((uint64_t)dir << 55) | ((step & 0x7fffffull) << 32) | (piece & 0xffffffffull);
}

// >>elements
static kvps_dtype kvps_ring__dt(const kvps_ring *r) { return (kvps_dtype)(r->cur.dtype & 15); }

/* Elements per pipeline piece (chunk_bytes, at least one element). */
static size_t kvps_ring__piece(const kvps_ring *r, size_t es) {
    size_t p = r->desc.chunk_bytes / es;
    return p ? p : 1;
}

/* Sends nel elements of the running collective: float32 as 16-bit when the wire says so. */
static kvps_result kvps_ring__send_el(kvps_ring *r, int dst, uint64_t tag, const void *ptr, size_t nel, int zc) {
    if (!r->wire) return kvps_ring__send(r, dst, tag, ptr, nel * kvps_dtype_size(kvps_ring__dt(r)), zc);
    kvps_ring__hdr h = r->cur;
    h.tag = tag + r->hier;
    zmq_msg_t m; /* converted straight into the frame */
    if (zmq_msg_init_size(&m, nel * 2) != 0) return KVPS_ERR_NOMEM;
    uint16_t *d = (uint16_t *)zmq_msg_data(&m);
    if (r->wire == KVPS_FLOAT16) kvps_f32_to_f16_n(d, (const float *)ptr, nel);
    else kvps_f32_to_bf16_n(d, (const float *)ptr, nel);
    return kvps_ring__post(r, dst, &h, &m);
}

/* Wire float32 -> 16 bits -> float32, in place: what the peers will see of these elements. */
static void kvps_ring__round(const kvps_ring *r, float *p, size_t nel) {
    if (!r->wire) return;
    uint16_t h[1024];
    for (size_t b = 0; b < nel; b += 1024) {
        size_t m = nel - b < 1024 ? nel - b : 1024;
        if (r->wire == KVPS_FLOAT16) { kvps_f32_to_f16_n(h, p + b, m); kvps_f16_to_f32_n(p + b, h, m); }
        else { kvps_f32_to_bf16_n(h, p + b, m); kvps_bf16_to_f32_n(p + b, h, m); }
    }
}

/* Widens a received 16-bit piece into float32 at dst (aligned scratch when needed). */
static void kvps_ring__widen(const kvps_ring *r, float *dst, const void *src, size_t nel) {
    uint16_t h[1024];
    for (size_t b = 0; b < nel; b += 1024) {
        size_t m = nel - b < 1024 ? nel - b : 1024;
        memcpy(h, (const char *)src + b * 2, m * 2);
        if (r->wire == KVPS_FLOAT16) kvps_f16_to_f32_n(dst + b, h, m);
        else kvps_bf16_to_f32_n(dst + b, h, m);
    }
}

static kvps_result kvps_ring__recv_reduce(kvps_ring *r, int src, uint64_t tag, void *dst, size_t n) {
    size_t es = r->wire ? 2 : kvps_dtype_size((kvps_dtype)(r->cur.dtype & 15));
    zmq_msg_t m;
    kvps_result rc = kvps_ring__recv_n(r, src, tag, n * es, &m);
    if (rc != KVPS_OK) return rc;
    const void *p;
    if (r->wire) { /* widen into scratch, reduce in float32 */
        float *w = (float *)kvps_ring__grow(&r->scratch, &r->scratch_cap, n * sizeof(float));
        if (w) kvps_ring__widen(r, w, zmq_msg_data(&m), n);
        p = w;
    } else {
        p = kvps_ring__data(r, &m);
    }
    if (p) kvps_reduce_into(dst, p, n, (kvps_dtype)(r->cur.dtype & 15), (kvps_redop)r->cur.op);
    zmq_msg_close(&m);
    return p ? KVPS_OK : KVPS_ERR_NOMEM;
}

/* dst = in op (received piece): the first reduction of a block when the all-reduce is out of
   place, so that the input never has to be copied to the output first. */
static kvps_result kvps_ring__recv_reduce3(kvps_ring *r, int src, uint64_t tag, void *dst, const void *in, size_t n) {
    kvps_dtype dt = (kvps_dtype)(r->cur.dtype & 15);
    kvps_redop op = (kvps_redop)r->cur.op;
    if (dt != KVPS_FLOAT32 || (op != KVPS_SUM && op != KVPS_AVG)) { /* the piece is cache-hot for the reduce */
        memcpy(dst, in, n * kvps_dtype_size(dt));
        return kvps_ring__recv_reduce(r, src, tag, dst, n);
    }
    zmq_msg_t m;
    kvps_result rc = kvps_ring__recv_n(r, src, tag, n * sizeof(float), &m);
    if (rc != KVPS_OK) return rc;
    const float *KVPS__RESTRICT b = (const float *)kvps_ring__data(r, &m);
    if (b) {
        float *KVPS__RESTRICT d = (float *)dst;
        const float *KVPS__RESTRICT a = (const float *)in;
        size_t i = 0;
        KVPS__VLOOP(n, i, kvps__st(d + i, kvps__ld(a + i) + kvps__ld(b + i)))
        for (; i < n; i++) d[i] = a[i] + b[i];
    }
    zmq_msg_close(&m);
    return b ? KVPS_OK : KVPS_ERR_NOMEM;
}

/* Receives nel elements into dst, widening 16-bit wire data. */
static kvps_result kvps_ring__recv_el(kvps_ring *r, int src, uint64_t tag, void *dst, size_t nel) {
    if (!r->wire) return kvps_ring__recv_copy(r, src, tag, dst, nel * kvps_dtype_size((kvps_dtype)(r->cur.dtype & 15)));
    zmq_msg_t m;
    kvps_result rc = kvps_ring__recv_n(r, src, tag, nel * 2, &m);
    if (rc != KVPS_OK) return rc;
    kvps_ring__widen(r, (float *)dst, zmq_msg_data(&m), nel);
    zmq_msg_close(&m);
    return KVPS_OK;
}

// >>ring
/* One direction of a pipelined ring over view[0..k) (me = my index): reduce-scatter leaves
   block me reduced at rank me, all-gather spreads every block. Blocks: [off(c), off(c+1)). */
typedef struct kvps_ring__task {
    const int *view;
    int k, me, dir;
    char *buf;
    const char *src; /* all-reduce out of place: the input (buf is the output), NULL: in place */
    size_t count, blk, es, piece; /* blk > 0: fixed blocks of blk elements, else count cut in k */
    const size_t *voff, *vlen;    /* non-NULL: block c is [voff[c], voff[c] + vlen[c]) (all-gather's blocks) */
} kvps_ring__task;

static size_t kvps_ring__bound(const kvps_ring__task *t, int c) { /* start of block c, 0 <= c <= k */
    return t->blk ? (size_t)c * t->blk : (size_t)((uint64_t)t->count * (uint64_t)c / (uint64_t)t->k);
}
static size_t kvps_ring__off(const kvps_ring__task *t, int c) {
    c = ((c % t->k) + t->k) % t->k;
    return t->vlen ? t->voff[c] : kvps_ring__bound(t, c);
}
static size_t kvps_ring__len(const kvps_ring__task *t, int c) {
    c = ((c % t->k) + t->k) % t->k;
    return t->vlen ? t->vlen[c] : kvps_ring__bound(t, c + 1) - kvps_ring__bound(t, c);
}
static size_t kvps_ring__npieces(const kvps_ring__task *t, int c) {
    size_t n = kvps_ring__len(t, c);
    return (n + t->piece - 1) / t->piece;
}

static kvps_result kvps_ring__send_block(kvps_ring *r, const kvps_ring__task *t, int phase, int step, int c, int zc) {
    int right = t->view[(t->me + 1) % t->k];
    size_t off = kvps_ring__off(t, c), len = kvps_ring__len(t, c), np = kvps_ring__npieces(t, c);
    for (size_t p = 0; p < np; p++) {
        size_t b = p * t->piece, n = len - b < t->piece ? len - b : t->piece;
        const char *base = t->src && phase == KVPS_RING__PH_RS ? t->src : t->buf;
        kvps_result rc = kvps_ring__send_el(r, right, kvps_ring__tag(phase, t->dir, (uint64_t)step, p),
                                            base + (off + b) * t->es, n, zc);
        if (rc != KVPS_OK) return rc;
    }
    return KVPS_OK;
}

/* Runs up to two ring directions interleaved piece by piece. rs/ag select the phases. */
static kvps_result kvps_ring__rings(kvps_ring *r, kvps_ring__task *t, int nt, int rs, int ag) {
    kvps_result rc = KVPS_OK;
    int k = t[0].k;
    kvps_ring__ph(r, rs ? "reduce-scatter" : "all-gather", -1);
    for (int d = 0; d < nt; d++)
        rc = rc ? rc : rs ? kvps_ring__send_block(r, &t[d], KVPS_RING__PH_RS, 0, t[d].me - 1, 0)
                          : kvps_ring__send_block(r, &t[d], KVPS_RING__PH_AG, 0, t[d].me, 1);
    for (int phase = rs ? 0 : 1; phase <= (ag ? 1 : 0) && rc == KVPS_OK; phase++) {
        if (phase == 1 && rs) { kvps_ring__ph_end(r); kvps_ring__ph(r, "all-gather", -1); }
        /* about to overwrite blocks sent from buf (out of place with 2 ranks, none were) */
        if (phase == 1 && rs && !(t[0].src && k == 2)) rc = kvps_ring__zc_drain(r, 0, r->deadline);
        for (int s = 0; s < k - 1 && rc == KVPS_OK; s++) {
            kvps_ring__ph(r, phase == 0 ? "reduce-scatter" : "all-gather", s);
            size_t maxp = 0;
            for (int d = 0; d < nt; d++) {
                int c = phase == 0 ? t[d].me - s - 2 : t[d].me - s - 1;
                size_t np = kvps_ring__npieces(&t[d], c);
                if (np > maxp) maxp = np;
            }
            for (size_t p = 0; p < maxp && rc == KVPS_OK; p++) {
                for (int d = 0; d < nt && rc == KVPS_OK; d++) {
                    kvps_ring__task *x = &t[d];
                    int c = phase == 0 ? x->me - s - 2 : x->me - s - 1;
                    if (p >= kvps_ring__npieces(x, c)) continue;
                    int left = x->view[(x->me - 1 + k) % k], right = x->view[(x->me + 1) % k];
                    size_t b = p * x->piece, len = kvps_ring__len(x, c);
                    size_t n = len - b < x->piece ? len - b : x->piece;
                    char *ptr = x->buf + (kvps_ring__off(x, c) + b) * x->es;
                    int ph = phase == 0 ? KVPS_RING__PH_RS : KVPS_RING__PH_AG;
                    uint64_t tag = kvps_ring__tag(ph, x->dir, (uint64_t)s, p);
                    if (phase == 0 && x->src) rc = kvps_ring__recv_reduce3(r, left, tag, ptr, x->src + (ptr - x->buf), n);
                    else rc = phase == 0 ? kvps_ring__recv_reduce(r, left, tag, ptr, n) : kvps_ring__recv_el(r, left, tag, ptr, n);
                    if (rc != KVPS_OK) break;
                    if (s < k - 2) { /* forward: it is the next step's block */
                        rc = kvps_ring__send_el(r, right, kvps_ring__tag(ph, x->dir, (uint64_t)s + 1, p), ptr, n, phase);
                    } else if (phase == 0 && ag) { /* the finished block opens the all-gather */
                        kvps_ring__round(r, (float *)(void *)ptr, n); /* keep exactly what the others get */
                        rc = kvps_ring__send_el(r, right, kvps_ring__tag(KVPS_RING__PH_AG, x->dir, 0, p), ptr, n, 1);
                    }
                }
            }
            kvps_ring__ph_end(r);
        }
    }
    kvps_ring__ph_end(r);
    return rc;
}

static void kvps_ring__task_init(kvps_ring__task *t, kvps_ring *r, const int *view, int k, int me, void *buf,
                                 size_t count, size_t blk, int dir) {
    t->view = view;
    t->k = k;
    t->me = me;
    t->dir = dir;
    t->buf = (char *)buf;
    t->src = NULL;
    t->count = count;
    t->blk = blk;
    t->voff = t->vlen = NULL;
    t->es = kvps_dtype_size(kvps_ring__dt(r));
    t->piece = kvps_ring__piece(r, t->es);
}

/* All-reduce of buf over view by ring (bidir: half each way). */
static kvps_result kvps_ring__allreduce_ring(kvps_ring *r, const int *view, int k, int me, void *buf, size_t count,
                                             int bidir, const void *src) {
    kvps_ring__task t[2];
    if (bidir && k >= 3 && count >= 2 * (size_t)k) {
        size_t half = count / 2, es = kvps_dtype_size(kvps_ring__dt(r));
        int *rev = r->view_buf + r->size; /* the view reversed: my index becomes k-1-me */
        for (int i = 0; i < k; i++) rev[i] = view[k - 1 - i];
        kvps_ring__task_init(&t[0], r, view, k, me, buf, half, 0, 0);
        kvps_ring__task_init(&t[1], r, rev, k, k - 1 - me, (char *)buf + half * es, count - half, 0, 1);
        if (src) { t[0].src = (const char *)src; t[1].src = (const char *)src + half * es; }
        return kvps_ring__rings(r, t, 2, 1, 1);
    }
    kvps_ring__task_init(&t[0], r, view, k, me, buf, count, 0, 0);
    t[0].src = (const char *)src;
    return kvps_ring__rings(r, t, 1, 1, 1);
}

/* Pipelined chain broadcast along the view from root. */
static kvps_result kvps_ring__bcast_chain(kvps_ring *r, const int *view, int k, int me, int root, void *buf, size_t count) {
    kvps_ring__task t;
    kvps_ring__task_init(&t, r, view, k, me, buf, count, 0, 0);
    int rel = (me - root + k) % k, next = view[(me + 1) % k], prev = view[(me - 1 + k) % k];
    size_t np = (count + t.piece - 1) / t.piece;
    kvps_result rc = KVPS_OK;
    for (size_t p = 0; p < np && rc == KVPS_OK; p++) {
        size_t b = p * t.piece, n = count - b < t.piece ? count - b : t.piece;
        char *ptr = t.buf + b * t.es;
        uint64_t tag = kvps_ring__tag(KVPS_RING__PH_BCAST, 0, 0, p);
        if (rel != 0) rc = kvps_ring__recv_copy(r, prev, tag, ptr, n * t.es);
        if (rc == KVPS_OK && rel != k - 1) rc = kvps_ring__send(r, next, tag, ptr, n * t.es, 0);
    }
    return rc;
}

// >>list
/* The pipelined ring all-reduce over a list of buffers (kvps_ring__list): the ring of >>ring over
   the list taken as one buffer, reducing into and copying out to the buffers themselves, so no
   bucket is packed or unpacked and the whole list is one collective. Pieces are cut at the
   buffers' edges, so that each goes out without a copy from where it lies; only runs shorter than
   KVPS_RING__ZC_MIN, which any send copies anyway (ResNet-50's batch norms), are packed together,
   up to a piece. A piece is at most 2 chunk_bytes: cut at the edges, ResNet-50's pieces then
   average 1.2 MB, as the concatenated model's 1 MiB pieces (with 1 chunk_bytes: 0.83 MB, and the
   step a few per cent slower; BENCHMARKS.md, tensor fusion). */
static size_t kvps_ring__list_at(const kvps_ring__list *l, size_t e) { /* the buffer of element e < start[n] */
    size_t lo = 0, hi = l->n; /* start[lo] <= e < start[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->start[mid] <= e) lo = mid;
        else hi = mid;
    }
    return lo;
}

static char *kvps_ring__list_ptr(const kvps_ring__list *l, size_t i, size_t e, size_t es) {
    return (char *)l->bufs[i] + (e - l->start[i]) * es;
}

/* The end of the piece that starts at element e of [e, hi): one buffer's run of `small` elements
   or more (or of `piece`) is a piece of its own, at most `piece` long; shorter runs are packed,
   up to `piece`. Both sides of every link cut the same pieces from the same list. */
static size_t kvps_ring__list_cut(const kvps_ring__list *l, size_t e, size_t hi, size_t piece, size_t small) {
    size_t i = kvps_ring__list_at(l, e), end = l->start[i + 1] < hi ? l->start[i + 1] : hi;
    if (end - e >= small || end - e >= piece) return end - e > piece ? e + piece : end;
    while (end < hi) {
        size_t j = kvps_ring__list_at(l, end), nx = l->start[j + 1] < hi ? l->start[j + 1] : hi;
        if (nx - end >= small || nx - e > piece) break;
        end = nx;
    }
    return end;
}

/* Sends the piece [e, end) of the list: without a copy when it lies in one buffer (and is long
   enough: kvps_ring__send_hdr), else packed into one message. */
static kvps_result kvps_ring__list_send(kvps_ring *r, const kvps_ring__list *l, int dst, uint64_t tag, size_t e,
                                        size_t end, int zc) {
    size_t es = kvps_dtype_size(kvps_ring__dt(r)), i = kvps_ring__list_at(l, e);
    if (end <= l->start[i + 1]) return kvps_ring__send(r, dst, tag, kvps_ring__list_ptr(l, i, e, es), (end - e) * es, zc);
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, (end - e) * es) != 0) return KVPS_ERR_NOMEM;
    char *d = (char *)zmq_msg_data(&m);
    for (size_t at = e; at < end; i++) {
        size_t to = l->start[i + 1] < end ? l->start[i + 1] : end;
        if (to > at) memcpy(d + (at - e) * es, kvps_ring__list_ptr(l, i, at, es), (to - at) * es);
        at = to > at ? to : at;
    }
    kvps_ring__hdr h = r->cur;
    h.tag = tag + r->hier;
    return kvps_ring__post(r, dst, &h, &m);
}

/* The piece [e, end) of the list op= src (reduce), or = src. */
static void kvps_ring__list_apply(kvps_ring *r, const kvps_ring__list *l, size_t e, size_t end, const char *src, int reduce) {
    kvps_dtype dt = kvps_ring__dt(r);
    size_t es = kvps_dtype_size(dt);
    for (size_t i = kvps_ring__list_at(l, e), at = e; at < end; i++) {
        size_t to = l->start[i + 1] < end ? l->start[i + 1] : end;
        if (to <= at) continue;
        char *d = kvps_ring__list_ptr(l, i, at, es);
        if (reduce) kvps_reduce_into(d, src, to - at, dt, (kvps_redop)r->cur.op);
        else memcpy(d, src, (to - at) * es);
        src += (to - at) * es;
        at = to;
    }
}

/* Block c (mod k) of a list of `total` elements: [total c / k, total (c + 1) / k), as >>ring cuts. */
static size_t kvps_ring__list_blk(size_t total, int k, int c, size_t *hi) {
    c = ((c % k) + k) % k;
    *hi = (size_t)((uint64_t)total * (uint64_t)(c + 1) / (uint64_t)k);
    return (size_t)((uint64_t)total * (uint64_t)c / (uint64_t)k);
}

/* Sends every piece of [lo, hi) to dst: phase / step tags, piece numbers from 0. */
static kvps_result kvps_ring__list_send_range(kvps_ring *r, const kvps_ring__list *l, int dst, int phase, int step,
                                              size_t lo, size_t hi, size_t piece, size_t small, int zc) {
    kvps_result rc = KVPS_OK;
    for (size_t e = lo, end, p = 0; e < hi && rc == KVPS_OK; e = end, p++) {
        end = kvps_ring__list_cut(l, e, hi, piece, small);
        rc = kvps_ring__list_send(r, l, dst, kvps_ring__tag(phase, 0, (uint64_t)step, p), e, end, zc);
    }
    return rc;
}

/* The ring all-reduce over the list among the ring's k ranks (k >= 2, the list not empty). As
   kvps_ring__rings: block c is [total c / k, total (c+1) / k); reduce-scatter step s takes block
   me - s - 2 from the left, reduces it and passes it on, and the block finished at the last step
   (block me) opens the all-gather, whose step s takes block me - s - 1. */
static kvps_result kvps_ring__list_ring(kvps_ring *r, const kvps_ring__list *l, int k, int me) {
    size_t es = kvps_dtype_size(kvps_ring__dt(r)), piece = 2 * kvps_ring__piece(r, es);
    size_t small = (KVPS_RING__ZC_MIN + es - 1) / es, total = l->start[l->n];
    int left = (me - 1 + k) % k, right = (me + 1) % k;
    kvps_result rc = KVPS_OK;
    kvps_ring__ph(r, "reduce-scatter", -1);
    size_t lo, hi;
    lo = kvps_ring__list_blk(total, k, me - 1, &hi);
    rc = kvps_ring__list_send_range(r, l, right, KVPS_RING__PH_RS, 0, lo, hi, piece, small, 0);
    for (int s = 0; s < k - 1 && rc == KVPS_OK; s++) {
        kvps_ring__ph(r, "reduce-scatter", s);
        lo = kvps_ring__list_blk(total, k, me - s - 2, &hi);
        for (size_t e = lo, end, p = 0; e < hi && rc == KVPS_OK; e = end, p++) {
            end = kvps_ring__list_cut(l, e, hi, piece, small);
            zmq_msg_t m;
            rc = kvps_ring__recv_n(r, left, kvps_ring__tag(KVPS_RING__PH_RS, 0, (uint64_t)s, p), (end - e) * es, &m);
            if (rc != KVPS_OK) break;
            const char *d = (const char *)kvps_ring__data(r, &m);
            if (d) kvps_ring__list_apply(r, l, e, end, d, 1);
            zmq_msg_close(&m);
            if (!d) rc = KVPS_ERR_NOMEM;
            else if (s < k - 2) /* forward: it is the next step's block */
                rc = kvps_ring__list_send(r, l, right, kvps_ring__tag(KVPS_RING__PH_RS, 0, (uint64_t)s + 1, p), e, end, 0);
            else /* finished: it opens the all-gather */
                rc = kvps_ring__list_send(r, l, right, kvps_ring__tag(KVPS_RING__PH_AG, 0, 0, p), e, end, 1);
        }
        kvps_ring__ph_end(r);
    }
    kvps_ring__ph_end(r);
    kvps_ring__ph(r, "all-gather", -1);
    /* the all-gather writes the blocks sent above: ZeroMQ must have let go of them */
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, 0, r->deadline);
    for (int s = 0; s < k - 1 && rc == KVPS_OK; s++) {
        kvps_ring__ph(r, "all-gather", s);
        lo = kvps_ring__list_blk(total, k, me - s - 1, &hi);
        for (size_t e = lo, end, p = 0; e < hi && rc == KVPS_OK; e = end, p++) {
            end = kvps_ring__list_cut(l, e, hi, piece, small);
            zmq_msg_t m;
            rc = kvps_ring__recv_n(r, left, kvps_ring__tag(KVPS_RING__PH_AG, 0, (uint64_t)s, p), (end - e) * es, &m);
            if (rc != KVPS_OK) break;
            kvps_ring__list_apply(r, l, e, end, (const char *)zmq_msg_data(&m), 0);
            zmq_msg_close(&m);
            if (s < k - 2) /* passed on from where it was copied to, while it is in the cache */
                rc = kvps_ring__list_send(r, l, right, kvps_ring__tag(KVPS_RING__PH_AG, 0, (uint64_t)s + 1, p), e, end, 1);
        }
        kvps_ring__ph_end(r);
    }
    kvps_ring__ph_end(r);
    return rc;
}

// >>rhd
/* Sends [lo, hi) of base to peer in pieces (tags phase/step/piece from 0), without a copy. */
static kvps_result kvps_ring__send_range(kvps_ring *r, int peer, int phase, int step, const char *base, size_t lo,
                                         size_t hi, size_t es, size_t piece, int zc) {
    kvps_result rc = KVPS_OK;
    for (size_t o = lo, p = 0; o < hi && rc == KVPS_OK; o += piece, p++)
        rc = kvps_ring__send(r, peer, kvps_ring__tag(phase, 0, (uint64_t)step, p), base + o * es,
                             (hi - o < piece ? hi - o : piece) * es, zc);
    return rc;
}

/* Recursive halving reduce-scatter, then recursive doubling all-gather (Rabenseifner), k a
   power of two. Step s of the halving pairs rank me with me ^ (k >> (s+1)): each keeps one half
   of the range both hold, sends the other and reduces what comes back; after log2(k) steps rank
   me holds block me reduced, and the doubling undoes the splits. Each rank sends (k-1)/k of the
   buffer each way, as the ring does, in 2 log2(k) exchanges instead of 2(k-1). Every block is
   reduced at one rank, so all ranks end with the same bits. src: out of place, the input. */
static kvps_result kvps_ring__allreduce_rhd(kvps_ring *r, const int *view, int k, int me, void *buf, size_t count,
                                            const void *src) {
    size_t es = kvps_dtype_size(kvps_ring__dt(r)), piece = kvps_ring__piece(r, es), lo = 0, hi = count;
    size_t plo[32], phi[32];
    char *b = (char *)buf;
    const char *in = (const char *)src;
    kvps_result rc = KVPS_OK;
    int steps = 0;
    kvps_ring__ph(r, "recursive halving", -1);
    for (int mask = k >> 1; mask >= 1 && rc == KVPS_OK; mask >>= 1, steps++) {
        kvps_ring__ph(r, "recursive halving", steps);
        int peer = view[me ^ mask], upper = (me & mask) != 0;
        size_t mid = lo + (hi - lo) / 2, klo = upper ? mid : lo, khi = upper ? hi : mid;
        plo[steps] = lo;
        phi[steps] = hi;
        rc = kvps_ring__send_range(r, peer, KVPS_RING__PH_RH, steps, steps == 0 && in ? in : b, upper ? lo : mid,
                                   upper ? mid : hi, es, piece, 0);
        for (size_t o = klo, p = 0; o < khi && rc == KVPS_OK; o += piece, p++) {
            size_t n = khi - o < piece ? khi - o : piece;
            uint64_t tag = kvps_ring__tag(KVPS_RING__PH_RH, 0, (uint64_t)steps, p);
            rc = steps == 0 && in ? kvps_ring__recv_reduce3(r, peer, tag, b + o * es, in + o * es, n)
                                  : kvps_ring__recv_reduce(r, peer, tag, b + o * es, n);
        }
        lo = klo;
        hi = khi;
        kvps_ring__ph_end(r);
    }
    kvps_ring__ph_end(r);
    kvps_ring__ph(r, "recursive doubling", -1);
    /* the all-gather writes the halves sent above: ZeroMQ must have let go of them */
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, 0, r->deadline);
    for (int s = steps - 1, mask = 1; s >= 0 && rc == KVPS_OK; s--, mask <<= 1) {
        kvps_ring__ph(r, "recursive doubling", steps - 1 - s);
        int peer = view[me ^ mask], upper = (me & mask) != 0;
        size_t mid = plo[s] + (phi[s] - plo[s]) / 2, olo = upper ? plo[s] : mid, ohi = upper ? mid : phi[s];
        rc = kvps_ring__send_range(r, peer, KVPS_RING__PH_RHAG, s, b, lo, hi, es, piece, 1);
        for (size_t o = olo, p = 0; o < ohi && rc == KVPS_OK; o += piece, p++)
            rc = kvps_ring__recv_copy(r, peer, kvps_ring__tag(KVPS_RING__PH_RHAG, 0, (uint64_t)s, p), b + o * es,
                                      (ohi - o < piece ? ohi - o : piece) * es);
        lo = plo[s];
        hi = phi[s];
        kvps_ring__ph_end(r);
    }
    kvps_ring__ph_end(r);
    return rc;
}

// >>small
/* Recursive doubling all-reduce of the whole buffer over view (any k). With a 16-bit wire each
   rank rounds its partial sum before sending it, so both sides of an exchange add the same two
   values and every rank ends with the same bits. */
static kvps_result kvps_ring__allreduce_rd(kvps_ring *r, const int *view, int k, int me, void *buf, size_t count) {
    int p2 = 1;
    while (p2 * 2 <= k) p2 *= 2;
    int rem = k - p2, nid;
    kvps_result rc = KVPS_OK;
    float *fb = (float *)buf;
    /* fold: among the first 2*rem, even ranks hand their data to the odd one above */
    if (me < 2 * rem) {
        if (me % 2 == 0) {
            kvps_ring__ph(r, "fold: hand over, wait for the result", -1);
            kvps_ring__round(r, fb, count);
            rc = kvps_ring__send_el(r, view[me + 1], kvps_ring__tag(KVPS_RING__PH_RDPRE, 0, 0, 0), buf, count, -1);
            if (rc == KVPS_OK) rc = kvps_ring__recv_el(r, view[me + 1], kvps_ring__tag(KVPS_RING__PH_RDPOST, 0, 0, 0), buf, count);
            kvps_ring__ph_end(r);
            return rc;
        }
        kvps_ring__ph(r, "fold", -1);
        kvps_ring__round(r, fb, count);
        rc = kvps_ring__recv_reduce(r, view[me - 1], kvps_ring__tag(KVPS_RING__PH_RDPRE, 0, 0, 0), buf, count);
        kvps_ring__ph_end(r);
        nid = me / 2;
    } else {
        nid = me - rem;
    }
    kvps_ring__ph(r, "recursive doubling", -1);
    for (int mask = 1, step = 0; mask < p2 && rc == KVPS_OK; mask <<= 1, step++) {
        kvps_ring__ph(r, "recursive doubling", step);
        int pn = nid ^ mask, peer = view[pn < rem ? pn * 2 + 1 : pn + rem];
        kvps_ring__round(r, fb, count);
        rc = kvps_ring__send_el(r, peer, kvps_ring__tag(KVPS_RING__PH_RD, 0, (uint64_t)step, 0), buf, count, -1);
        if (rc == KVPS_OK) rc = kvps_ring__recv_reduce(r, peer, kvps_ring__tag(KVPS_RING__PH_RD, 0, (uint64_t)step, 0), buf, count);
        kvps_ring__ph_end(r);
    }
    kvps_ring__ph_end(r);
    kvps_ring__round(r, fb, count);
    if (rc == KVPS_OK && me < 2 * rem)
        rc = kvps_ring__send_el(r, view[me - 1], kvps_ring__tag(KVPS_RING__PH_RDPOST, 0, 0, 0), buf, count, -1);
    return rc;
}

/* One-shot all-reduce over view: every rank sends its whole buffer to every other at once, then
   reduces the k buffers in rank order (the same order on every rank: the same bits). One
   message's latency where RD takes log2(k), for k - 1 times the bytes sent: small buffers, few
   ranks (AUTO: KVPS_RING__ONESHOT_MAX). The peers' buffers land in r->direct (r->work may hold
   the list buf is). Not with a 16-bit wire (RD runs). */
static kvps_result kvps_ring__allreduce_oneshot(kvps_ring *r, const int *view, int k, int me, void *buf, size_t count) {
    kvps_dtype dt = kvps_ring__dt(r);
    size_t bytes = count * kvps_dtype_size(dt);
    char *all = (char *)kvps_ring__grow(&r->direct, &r->direct_cap, bytes * (size_t)k);
    if (!all) return KVPS_ERR_NOMEM;
    uint64_t tag = kvps_ring__tag(KVPS_RING__PH_ONESHOT, 0, 0, 0);
    kvps_result rc = KVPS_OK;
    kvps_ring__ph(r, "one-shot: to every peer", -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++) rc = kvps_ring__send(r, view[(me + j) % k], tag, buf, bytes, -1);
    kvps_ring__ph_end(r);
    kvps_ring__ph(r, "one-shot: from every peer, reduce", -1);
    memcpy(all + (size_t)me * bytes, buf, bytes);
    for (int j = 1; j < k && rc == KVPS_OK; j++) {
        int o = (me - j + k) % k;
        rc = kvps_ring__recv_copy(r, view[o], tag, all + (size_t)o * bytes, bytes);
    }
    if (rc == KVPS_OK) {
        memcpy(buf, all, bytes);
        for (int i = 1; i < k; i++) kvps_reduce_into(buf, all + (size_t)i * bytes, count, dt, (kvps_redop)r->cur.op);
    }
    kvps_ring__ph_end(r);
    return rc;
}

/* Binomial-tree broadcast from view index root. */
static kvps_result kvps_ring__bcast_tree(kvps_ring *r, const int *view, int k, int me, int root, void *buf, size_t bytes) {
    int rel = (me - root + k) % k, mask = 1;
    kvps_result rc = KVPS_OK;
    while (mask < k) {
        if (rel & mask) {
            rc = kvps_ring__recv_copy(r, view[(rel - mask + root) % k], kvps_ring__tag(KVPS_RING__PH_TREE, 0, 0, 0), buf, bytes);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0 && rc == KVPS_OK; mask >>= 1)
        if (rel + mask < k)
            rc = kvps_ring__send(r, view[(rel + mask + root) % k], kvps_ring__tag(KVPS_RING__PH_TREE, 0, 0, 0), buf, bytes, 0);
    return rc;
}

/* Binomial-tree reduce to view index root, into buf (buf is clobbered on non-roots). */
static kvps_result kvps_ring__reduce_tree(kvps_ring *r, const int *view, int k, int me, int root, void *buf, size_t count) {
    size_t bytes = count * kvps_dtype_size(kvps_ring__dt(r));
    int rel = (me - root + k) % k;
    kvps_result rc = KVPS_OK;
    for (int mask = 1; mask < k && rc == KVPS_OK; mask <<= 1) {
        if (rel & mask) {
            return kvps_ring__send(r, view[(rel - mask + root) % k], kvps_ring__tag(KVPS_RING__PH_TREE, 0, (uint64_t)mask, 0),
                                   buf, bytes, -1);
        }
        if (rel + mask < k)
            rc = kvps_ring__recv_reduce(r, view[(rel + mask + root) % k], kvps_ring__tag(KVPS_RING__PH_TREE, 0, (uint64_t)mask, 0),
                                        buf, count);
    }
    return rc;
}

// >>views
static int kvps_ring__index(const int *view, int k, int rank) {
    for (int i = 0; i < k; i++)
        if (view[i] == rank) return i;
    return -1;
}

/* DIRECT (manual section 3): every rank of the view on this host, each allowed to read the
   others' memory (the family's cma_all). Rank me reduces its block of the result straight from
   its peers' input buffers, piece by piece (each piece summed over the peers while it is in
   cache, in rank order), then copies each peer's block of the result straight from its recv:
   every byte crosses once, where a ring step copies it twice (into a queue, out of it). Three
   rounds of small messages order the reads: the buffers' addresses; "my block is reduced" (a
   peer may then read it, and overwrite what this rank read from it: in place, its own block);
   "I have your block" (this rank's buffers are then no longer read: the call may return). */
static kvps_result kvps_ring__direct_read(kvps_ring *r, int rank, uint64_t addr, void *dst, size_t bytes) {
    int32_t pid = r->fam->peers[r->root_rank[rank]].pid;
    if (!bytes || kvps_ring__cma_read(pid, addr, dst, bytes) == 0) return KVPS_OK;
    char call[128];
    kvps_ring__call_text(&r->cur, call, sizeof call);
    if (errno == ESRCH)
        return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: rank %d (process %d on this host) is gone: it died before "
                               "this rank read its buffer in %s", r->rank, rank, (int)pid, call);
    if (errno == EFAULT) /* (it cannot have ended the call well: that takes this rank's word that it read) */
        return kvps_ring__fail(r, KVPS_ERR_PEER, "rank %d: rank %d's buffer is gone from its memory: it left %s, after a "
                               "failure of its own", r->rank, rank, call);
    return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "rank %d: cannot read rank %d's buffer (process %d: %s) in %s", r->rank,
                           rank, (int)pid, strerror(errno), call);
}

static kvps_result kvps_ring__allreduce_direct(kvps_ring *r, const int *view, int k, int me, char *recv, size_t n,
                                               const char *send) {
    kvps_dtype dt = kvps_ring__dt(r);
    kvps_redop op = (kvps_redop)r->cur.op;
    size_t es = kvps_dtype_size(dt), piece = 16384;
    uint64_t mine[2] = {(uint64_t)(uintptr_t)(send ? send : recv), (uint64_t)(uintptr_t)recv}, *addr;
    char *tmp = (char *)kvps_ring__grow(&r->direct, &r->direct_cap, piece * es + (size_t)k * 16);
    if (!tmp) return KVPS_ERR_NOMEM;
    addr = (uint64_t *)(void *)(tmp + piece * es);
    kvps_result rc = KVPS_OK;
    kvps_ring__ph(r, "direct: addresses", -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++)
        rc = kvps_ring__send(r, view[(me + j) % k], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 0, 0), mine, sizeof mine, -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++) {
        int o = (me + k - j) % k;
        rc = kvps_ring__recv_copy(r, view[o], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 0, 0), addr + 2 * o, 16);
    }
    kvps_ring__ph_end(r);
    size_t lo = n * (size_t)me / (size_t)k, hi = n * (size_t)(me + 1) / (size_t)k;
    kvps_ring__ph(r, "direct: reduce this rank's block", -1);
    if (rc == KVPS_OK && send && send != recv) memcpy(recv + lo * es, send + lo * es, (hi - lo) * es);
    for (size_t b = lo; b < hi && rc == KVPS_OK; b += piece) {
        size_t m = hi - b < piece ? hi - b : piece;
        for (int o = 0; o < k && rc == KVPS_OK; o++) {
            if (o == me) continue;
            rc = kvps_ring__direct_read(r, view[o], addr[2 * o] + b * es, tmp, m * es);
            if (rc == KVPS_OK) kvps_reduce_into(recv + b * es, tmp, m, dt, op);
        }
    }
    kvps_ring__ph_end(r);
    kvps_ring__ph(r, "direct: copy the others' blocks", -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++)
        rc = kvps_ring__send(r, view[(me + j) % k], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 1, 0), NULL, 0, -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++) {
        int o = (me + j) % k;
        size_t olo = n * (size_t)o / (size_t)k, ohi = n * (size_t)(o + 1) / (size_t)k;
        rc = kvps_ring__recv_copy(r, view[o], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 1, 0), NULL, 0);
        if (rc == KVPS_OK) rc = kvps_ring__direct_read(r, view[o], addr[2 * o + 1] + olo * es, recv + olo * es, (ohi - olo) * es);
    }
    for (int j = 1; j < k && rc == KVPS_OK; j++)
        rc = kvps_ring__send(r, view[(me + j) % k], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 2, 0), NULL, 0, -1);
    for (int j = 1; j < k && rc == KVPS_OK; j++)
        rc = kvps_ring__recv_copy(r, view[(me + k - j) % k], kvps_ring__tag(KVPS_RING__PH_DIRECT, 0, 2, 0), NULL, 0);
    kvps_ring__ph_end(r);
    return rc;
}

static kvps_result kvps_ring__allreduce_view(kvps_ring *r, const int *view, int k, void *buf, size_t count,
                                             kvps_ring_algo algo) {
    int me = kvps_ring__index(view, k, r->rank);
    if (k == 1 || count == 0) return KVPS_OK;
    if (algo == KVPS_ALGO_RD) return kvps_ring__allreduce_rd(r, view, k, me, buf, count);
    if (algo == KVPS_ALGO_ONESHOT) return kvps_ring__allreduce_oneshot(r, view, k, me, buf, count);
    if (algo == KVPS_ALGO_DIRECT) return kvps_ring__allreduce_direct(r, view, k, me, (char *)buf, count, NULL);
    if (algo == KVPS_ALGO_RHD) return kvps_ring__allreduce_rhd(r, view, k, me, buf, count, NULL); /* (a power of two) */
    return kvps_ring__allreduce_ring(r, view, k, me, buf, count, algo == KVPS_ALGO_BIRING, NULL);
}

static kvps_result kvps_ring__reduce_view(kvps_ring *r, const int *view, int k, int root, void *buf, size_t count,
                                          int large) {
    int me = kvps_ring__index(view, k, r->rank);
    if (k == 1 || count == 0) return KVPS_OK;
    kvps_result rc;
    if (!large) {
        kvps_ring__ph(r, "tree reduce", -1);
        rc = kvps_ring__reduce_tree(r, view, k, me, root, buf, count);
        kvps_ring__ph_end(r);
        return rc;
    }
    /* reduce-scatter, then every block to the root */
    kvps_ring__task t;
    kvps_ring__task_init(&t, r, view, k, me, buf, count, 0, 0);
    rc = kvps_ring__rings(r, &t, 1, 1, 0);
    if (rc != KVPS_OK) return rc;
    kvps_ring__ph(r, "gather to the root", -1);
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, -1, r->deadline); /* blocks sent may be overwritten now */
    if (me != root)
        rc = kvps_ring__send(r, view[root], kvps_ring__tag(KVPS_RING__PH_GATHER, 0, 0, 0), t.buf + kvps_ring__off(&t, me) * t.es,
                             kvps_ring__len(&t, me) * t.es, 0);
    for (int c = 0; c < k && rc == KVPS_OK && me == root; c++)
        if (c != me)
            rc = kvps_ring__recv_copy(r, view[c], kvps_ring__tag(KVPS_RING__PH_GATHER, 0, 0, 0), t.buf + kvps_ring__off(&t, c) * t.es,
                                      kvps_ring__len(&t, c) * t.es);
    kvps_ring__ph_end(r);
    return rc;
}

static kvps_result kvps_ring__bcast_view(kvps_ring *r, const int *view, int k, int root, void *buf, size_t count, int large) {
    int me = kvps_ring__index(view, k, r->rank);
    if (k == 1 || count == 0) return KVPS_OK;
    size_t bytes = count * kvps_dtype_size(kvps_ring__dt(r));
    kvps_ring__ph(r, large ? "chain broadcast" : "tree broadcast", -1);
    kvps_result rc = large ? kvps_ring__bcast_chain(r, view, k, me, root, buf, count) : kvps_ring__bcast_tree(r, view, k, me, root, buf, bytes);
    kvps_ring__ph_end(r);
    return rc;
}

static int kvps_ring__multi_group(const kvps_ring *r) {
    const int *g = r->desc.groups;
    if (!g) return 0;
    int groups = 0, big = 0;
    for (int i = 0; i < r->size; i++) {
        int first = 1, members = 0;
        for (int j = 0; j < r->size; j++) { first &= !(j < i && g[j] == g[i]); members += g[j] == g[i]; }
        if (first) { groups++; big |= members > 1; }
    }
    return groups > 1 && big;
}

static kvps_result kvps_ring__hier(kvps_ring *r, void *buf, size_t count, kvps_ring_algo inner) {
    const int *g = r->desc.groups;
    int *grp = r->view_buf, *lead = r->view_buf + r->size, ng = 0, nl = 0;
    for (int i = 0; i < r->size; i++) {
        if (g[i] == g[r->rank]) grp[ng++] = i;
        int first = 1;
        for (int j = 0; j < i; j++) first &= g[j] != g[i];
        if (first) lead[nl++] = i;
    }
    size_t bytes = count * kvps_dtype_size(kvps_ring__dt(r));
    int large = bytes > r->desc.small_bytes, wire = r->wire;
    r->wire = 0; /* inside a machine the data goes as it is; the wire format is for the leaders */
    r->hier = 0x10ull << 56;
    kvps_ring__ph(r, "hier: reduce in the group", -1);
    kvps_result rc = kvps_ring__reduce_view(r, grp, ng, 0, buf, count, large);
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, -1, r->deadline);
    kvps_ring__ph_end(r);
    r->hier = 0x20ull << 56;
    kvps_ring__ph(r, "hier: all-reduce among the leaders", -1);
    if (rc == KVPS_OK && grp[0] == r->rank) {
        int *lv = (int *)malloc((size_t)nl * sizeof *lv); /* view_buf's second half is the reversed view */
        if (!lv) rc = KVPS_ERR_NOMEM;
        else {
            memcpy(lv, lead, (size_t)nl * sizeof *lv);
            r->wire = wire;
            rc = kvps_ring__allreduce_view(r, lv, nl, buf, count, inner);
            r->wire = 0;
            free(lv);
        }
    }
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, -1, r->deadline);
    kvps_ring__ph_end(r);
    r->hier = 0x30ull << 56;
    kvps_ring__ph(r, "hier: broadcast in the group", -1);
    if (rc == KVPS_OK) rc = kvps_ring__bcast_view(r, grp, ng, 0, buf, count, large);
    kvps_ring__ph_end(r);
    r->hier = 0;
    r->wire = wire;
    return rc;
}

// >>collectives
/* One running collective as its function sees it: the op, this ring's shape, and the identity
   view (every rank, in order) that the algorithms run over. */
struct kvps_ring__exec {
    const kvps_ring_op *op;
    int k, me, large; /* large: bytes > small_bytes (pipelined algorithms rather than trees) */
    size_t n, bytes;  /* elements and bytes of one rank's block (v-collectives: this rank's) */
    size_t es;        /* bytes per element */
    const char *send;
    char *recv;
    int *all;
    /* the blocks (elements) of rank i: cnt[i] at dsp[i] of recv (all-gather, gather,
       all-to-all) or of send (scatter); scnt, sdsp: all-to-all's send side. Even collectives:
       n each, packed; v-collectives: the op's, agreed across ranks first */
    const size_t *cnt, *dsp, *scnt, *sdsp;
    const kvps_ring__list *list; /* an all-reduce over a list of buffers (>>list; send, recv NULL), else NULL */
};

/* The algorithm an all-reduce of `bytes` per rank runs with on ring r: algo (0: the ring's) with
   AUTO chosen by size; RHD where it cannot run (a size that is not a power of two, a 16-bit wire)
   and HIER without groups are RING. */
static kvps_ring_algo kvps_ring__allreduce_algo(const kvps_ring *r, kvps_ring_algo algo, size_t bytes, int wire) {
    int k = r->size;
    if (!algo) algo = r->desc.algo;
    int direct = r->fam->cma_all == 1 && !wire;
    if (algo == KVPS_ALGO_AUTO)
        algo = direct && k >= 3 && bytes >= KVPS_RING__DIRECT_MIN ? KVPS_ALGO_DIRECT
               : kvps_ring__multi_group(r)               ? KVPS_ALGO_HIER /* (every size: BENCHMARKS.md, issue 30) */
               : bytes <= r->desc.small_bytes            ? KVPS_ALGO_RD
               : k >= 4 && bytes <= KVPS_RING__RHD_MAX   ? KVPS_ALGO_RHD
                                                         : KVPS_ALGO_RING;
    if (algo == KVPS_ALGO_DIRECT && !direct) algo = KVPS_ALGO_RING;
    if (algo == KVPS_ALGO_RHD && ((k & (k - 1)) != 0 || wire)) algo = KVPS_ALGO_RING;
    if (algo == KVPS_ALGO_ONESHOT && wire) algo = KVPS_ALGO_RD;
    if (algo == KVPS_ALGO_HIER && !r->desc.groups) algo = KVPS_ALGO_RING;
    return algo;
}

/* The all-reduce of x's n elements with algo, from send (NULL or recv: in place) into recv. */
static kvps_result kvps_ring__allreduce_buf(kvps_ring *r, const kvps_ring__exec *x, kvps_ring_algo algo, const char *send,
                                            char *recv) {
    int k = x->k, me = x->me, large = x->large;
    size_t n = x->n, bytes = x->bytes;
    kvps_result rc;
    if (send && send != recv && k > 1 && n && !r->wire &&
        (algo == KVPS_ALGO_RING || algo == KVPS_ALGO_BIRING || algo == KVPS_ALGO_RHD || algo == KVPS_ALGO_DIRECT)) {
        /* out of place: the algorithm reads send and writes every block of recv itself */
        rc = algo == KVPS_ALGO_DIRECT ? kvps_ring__allreduce_direct(r, x->all, k, me, recv, n, send)
           : algo == KVPS_ALGO_RHD ? kvps_ring__allreduce_rhd(r, x->all, k, me, recv, n, send)
                                   : kvps_ring__allreduce_ring(r, x->all, k, me, recv, n, algo == KVPS_ALGO_BIRING, send);
    } else {
        if (send && send != recv && bytes) memcpy(recv, send, bytes);
        if (algo == KVPS_ALGO_HIER) rc = kvps_ring__hier(r, recv, n, large ? KVPS_ALGO_RING : KVPS_ALGO_RD);
        else rc = kvps_ring__allreduce_view(r, x->all, k, recv, n, algo);
    }
    return rc;
}

/* An all-reduce over a list (>>list): the ring over the buffers themselves; another algorithm
   (small lists: RD; RHD, HIER) over a copy of the list packed into the ring's work buffer. */
static kvps_result kvps_ring__list_allreduce(kvps_ring *r, const kvps_ring__exec *x, kvps_ring_algo algo) {
    const kvps_ring__list *l = x->list;
    if (x->k == 1 || !x->n) return KVPS_OK;
    if (algo == KVPS_ALGO_RING) return kvps_ring__list_ring(r, l, x->k, x->me);
    char *w = (char *)kvps_ring__grow(&r->work, &r->work_cap, x->bytes);
    if (!w) return KVPS_ERR_NOMEM;
    for (size_t i = 0; i < l->n; i++)
        if (l->counts[i]) memcpy(w + l->start[i] * x->es, l->bufs[i], l->counts[i] * x->es);
    kvps_result rc = kvps_ring__allreduce_buf(r, x, algo, NULL, w);
    for (size_t i = 0; i < l->n && rc == KVPS_OK; i++)
        if (l->counts[i]) memcpy(l->bufs[i], w + l->start[i] * x->es, l->counts[i] * x->es);
    return rc;
}

static kvps_result kvps_ring__coll_allreduce(kvps_ring *r, const kvps_ring__exec *x) {
    kvps_ring_algo algo = kvps_ring__allreduce_algo(r, x->op->algo, x->bytes, r->wire);
    kvps_ring__tl_algo(r, algo);
    kvps_result rc = x->list ? kvps_ring__list_allreduce(r, x, algo) : kvps_ring__allreduce_buf(r, x, algo, x->send, x->recv);
    if (rc == KVPS_OK && x->op->op == KVPS_AVG) {
        rc = kvps_ring__zc_drain(r, -1, r->deadline); /* all-gather frames may still be going out */
        for (size_t i = 0; rc == KVPS_OK && i < (x->list ? x->list->n : 1); i++)
            kvps_ring__scale(x->list ? x->list->bufs[i] : x->recv, x->list ? x->list->counts[i] : x->n, x->op->dtype,
                             r->join_live ? r->join_live : x->k); /* (a join ring: the ranks that have not joined) */
    }
    return rc;
}

static kvps_result kvps_ring__coll_reduce(kvps_ring *r, const kvps_ring__exec *x) {
    const kvps_ring_op *op = x->op;
    const char *send = x->send;
    char *recv = x->recv;
    /* in place (send NULL or == recv): the data is in recv on every rank, and clobbered */
    char *buf = x->me == op->root || !send || send == recv ? recv : (char *)kvps_ring__grow(&r->work, &r->work_cap, x->bytes);
    if (!buf) return KVPS_ERR_NOMEM;
    if (send && send != buf && x->bytes) memcpy(buf, send, x->bytes);
    kvps_result rc = kvps_ring__reduce_view(r, x->all, x->k, op->root, buf, x->n, x->large);
    if (rc == KVPS_OK && op->op == KVPS_AVG && x->me == op->root) kvps_ring__scale(recv, x->n, op->dtype, x->k);
    return rc;
}

static kvps_result kvps_ring__coll_broadcast(kvps_ring *r, const kvps_ring__exec *x) {
    if (x->me == x->op->root && x->send && x->send != x->recv && x->bytes) memcpy(x->recv, x->send, x->bytes);
    return kvps_ring__bcast_view(r, x->all, x->k, x->op->root, x->recv, x->n, x->large);
}

static kvps_result kvps_ring__coll_reduce_scatter(kvps_ring *r, const kvps_ring__exec *x) {
    int k = x->k, me = x->me;
    size_t n = x->n, bytes = x->bytes, total = bytes * (size_t)k;
    char *recv = x->recv;
    char *buf = x->send ? (char *)kvps_ring__grow(&r->work, &r->work_cap, total) : recv;
    if (!buf) return KVPS_ERR_NOMEM;
    if (x->send && total) memcpy(buf, x->send, total);
    kvps_ring__task t;
    kvps_ring__task_init(&t, r, x->all, k, me, buf, n * (size_t)k, n, 0);
    kvps_result rc = KVPS_OK;
    if (k > 1 && n) rc = kvps_ring__rings(r, &t, 1, 1, 0);
    if (rc == KVPS_OK && x->op->op == KVPS_AVG) kvps_ring__scale(buf + (size_t)me * bytes, n, x->op->dtype, k);
    if (rc == KVPS_OK && bytes && buf + (size_t)me * bytes != recv) {
        rc = kvps_ring__zc_drain(r, -1, r->deadline); /* block 0 may still be going out */
        if (rc == KVPS_OK) memmove(recv, buf + (size_t)me * bytes, bytes);
    }
    return rc;
}

/* The rank's own block into place, when it is not there already (all-gather, gather's root). */
static void kvps_ring__own_block(const kvps_ring__exec *x) {
    size_t bytes = x->cnt[x->me] * x->es;
    char *mine = x->recv + x->dsp[x->me] * x->es;
    if (x->send && x->send != x->recv && x->send != mine && bytes) memcpy(mine, x->send, bytes);
}

/* Ring all-gather of the blocks (even or not): each is forwarded piece by piece. */
static kvps_result kvps_ring__coll_allgather(kvps_ring *r, const kvps_ring__exec *x) {
    size_t total = 0;
    for (int i = 0; i < x->k; i++) total += x->cnt[i];
    if (total) kvps_ring__own_block(x);
    kvps_ring__task t;
    kvps_ring__task_init(&t, r, x->all, x->k, x->me, x->recv, total, 0, 0);
    t.voff = x->dsp;
    t.vlen = x->cnt;
    return x->k > 1 && total ? kvps_ring__rings(r, &t, 1, 0, 1) : KVPS_OK;
}

static kvps_result kvps_ring__coll_gather(kvps_ring *r, const kvps_ring__exec *x) {
    int k = x->k, me = x->me;
    size_t es = x->es;
    uint64_t tag = kvps_ring__tag(KVPS_RING__PH_GATHER, 0, 0, 0);
    if (me != x->op->root) return kvps_ring__send(r, x->op->root, tag, x->send ? x->send : x->recv, x->cnt[me] * es, 0);
    kvps_ring__own_block(x);
    kvps_result rc = KVPS_OK;
    for (int i = 0; i < k && rc == KVPS_OK; i++)
        if (i != me) rc = kvps_ring__recv_copy(r, i, tag, x->recv + x->dsp[i] * es, x->cnt[i] * es);
    return rc;
}

static kvps_result kvps_ring__coll_scatter(kvps_ring *r, const kvps_ring__exec *x) {
    int k = x->k, me = x->me;
    size_t es = x->es, bytes = x->cnt[me] * es;
    char *recv = x->recv;
    uint64_t tag = kvps_ring__tag(KVPS_RING__PH_SCATTER, 0, 0, 0);
    if (me != x->op->root) return kvps_ring__recv_copy(r, x->op->root, tag, recv, bytes);
    const char *src = x->send ? x->send : recv;
    kvps_result rc = KVPS_OK;
    for (int i = 0; i < k && rc == KVPS_OK; i++)
        if (i != me) rc = kvps_ring__send(r, i, tag, src + x->dsp[i] * es, x->cnt[i] * es, 0);
    if (rc == KVPS_OK && src + x->dsp[me] * es != recv && bytes) {
        rc = kvps_ring__zc_drain(r, -1, r->deadline); /* in place: block 0 may still be going out */
        if (rc == KVPS_OK) memmove(recv, src + x->dsp[me] * es, bytes);
    }
    return rc;
}

static kvps_result kvps_ring__coll_alltoall(kvps_ring *r, const kvps_ring__exec *x) {
    int k = x->k, me = x->me;
    size_t es = x->es;
    char *recv = x->recv;
    const char *src = x->send;
    uint64_t tag = kvps_ring__tag(KVPS_RING__PH_A2A, 0, 0, 0);
    if (!src || src == recv) { /* in place: keep a copy of what goes out (the send layout, in recv) */
        size_t end = 0;
        for (int i = 0; i < k; i++)
            if (x->scnt[i] && x->sdsp[i] + x->scnt[i] > end) end = x->sdsp[i] + x->scnt[i];
        char *w = (char *)kvps_ring__grow(&r->work, &r->work_cap, end * es);
        if (!w) return KVPS_ERR_NOMEM;
        if (end) memcpy(w, recv, end * es);
        src = w;
    }
    kvps_result rc = KVPS_OK;
    kvps_ring__ph(r, "send to every rank", -1);
    for (int s = 1; s < k && rc == KVPS_OK; s++) {
        int to = (me + s) % k;
        rc = kvps_ring__send(r, to, tag, src + x->sdsp[to] * es, x->scnt[to] * es, 0);
    }
    if (rc == KVPS_OK && x->cnt[me] && src + x->sdsp[me] * es != recv + x->dsp[me] * es)
        memcpy(recv + x->dsp[me] * es, src + x->sdsp[me] * es, x->cnt[me] * es);
    kvps_ring__ph_end(r);
    kvps_ring__ph(r, "receive from every rank", -1);
    for (int s = 1; s < k && rc == KVPS_OK; s++) {
        int from = (me - s + k) % k;
        rc = kvps_ring__recv_copy(r, from, tag, recv + x->dsp[from] * es, x->cnt[from] * es);
    }
    kvps_ring__ph_end(r);
    return rc;
}

static kvps_result kvps_ring__coll_barrier(kvps_ring *r, const kvps_ring__exec *x) {
    int k = x->k, me = x->me;
    kvps_result rc = KVPS_OK;
    for (int d = 1, s = 0; d < k && rc == KVPS_OK; d <<= 1, s++) {
        uint64_t tag = kvps_ring__tag(KVPS_RING__PH_BARRIER, 0, (uint64_t)s, 0);
        kvps_ring__ph(r, "dissemination", s);
        rc = kvps_ring__send(r, (me + d) % k, tag, "", 0, -1);
        if (rc == KVPS_OK) rc = kvps_ring__recv_copy(r, (me - d + k) % k, tag, NULL, 0);
        kvps_ring__ph_end(r);
    }
    return rc;
}

/* The v-collectives' counts, agreed before any data moves: every rank sends its vector (counts,
   or send then receive counts) to every other, and every rank checks all of them in the same
   order, so a disagreement is KVPS_ERR_MISMATCH on every rank, named alike. A peer that found it
   first aborts with this phase's tag: every rank sent its counts before it looked at any, so
   the rest are on their way, and this rank reads them and finds it too. k * k counts per rank. */
static kvps_result kvps_ring__coll_counts(kvps_ring *r, const kvps_ring__exec *x, int pairs) {
    int k = x->k, me = x->me;
    size_t m = (size_t)k * (pairs ? 2 : 1), bytes = m * sizeof(uint64_t);
    uint64_t *all = (uint64_t *)malloc(bytes * (size_t)k), *mine = all + (size_t)me * m;
    if (!all) return KVPS_ERR_NOMEM;
    for (int i = 0; i < k; i++) {
        mine[i] = pairs ? x->scnt[i] : x->cnt[i];
        if (pairs) mine[k + i] = x->cnt[i];
    }
    uint64_t tag = kvps_ring__tag(KVPS_RING__PH_VCOUNT, 0, 0, 0);
    kvps_result rc = KVPS_OK;
    kvps_ring__ph(r, "agree on the counts", -1);
    for (int s = 1; s < k && rc == KVPS_OK; s++) rc = kvps_ring__send(r, (me + s) % k, tag, mine, bytes, -1);
    for (int s = 1; s < k && rc == KVPS_OK; s++) {
        int from = (me - s + k) % k;
        do rc = kvps_ring__recv_copy(r, from, tag, all + (size_t)from * m, bytes);
        while (rc == KVPS_ERR_PEER && r->abort_rc == KVPS_ERR_MISMATCH && r->abort_tag == tag);
    }
    kvps_ring__ph_end(r);
    const char *coll = kvps_coll_name(x->op->coll), *dt = kvps_dtype_name(x->op->dtype);
    for (int i = 0; i < k && rc == KVPS_OK; i++)
        for (int j = 0; j < k && rc == KVPS_OK; j++) {
            /* pairs: rank i sends all[i][j] to j, which expects all[j][k + i]; else block j is
               rank j's own word, all[j][j], and rank i must say the same */
            uint64_t said = all[(size_t)i * m + (size_t)j], truth = pairs ? all[(size_t)j * m + (size_t)k + (size_t)i]
                                                                         : all[(size_t)j * m + (size_t)j];
            if (said == truth) continue;
            r->cur.tag = tag; /* the abort says where: the count check (see above) */
            if (pairs)
                rc = kvps_ring__fail(r, KVPS_ERR_MISMATCH, "%s counts disagree: rank %d sends %llu %s to rank %d, rank %d "
                                     "expects %llu from rank %d", coll, i, (unsigned long long)said, dt, j, j,
                                     (unsigned long long)truth, i);
            else
                rc = kvps_ring__fail(r, KVPS_ERR_MISMATCH, "%s counts disagree: rank %d says rank %d's block is %llu %s, "
                                     "rank %d says %llu", coll, i, j, (unsigned long long)said, dt, j,
                                     (unsigned long long)truth);
        }
    free(all);
    return rc;
}

static kvps_result kvps_ring__coll_allgatherv(kvps_ring *r, const kvps_ring__exec *x) {
    kvps_result rc = kvps_ring__coll_counts(r, x, 0);
    return rc == KVPS_OK ? kvps_ring__coll_allgather(r, x) : rc;
}
static kvps_result kvps_ring__coll_gatherv(kvps_ring *r, const kvps_ring__exec *x) {
    kvps_result rc = kvps_ring__coll_counts(r, x, 0);
    return rc == KVPS_OK ? kvps_ring__coll_gather(r, x) : rc;
}
static kvps_result kvps_ring__coll_scatterv(kvps_ring *r, const kvps_ring__exec *x) {
    kvps_result rc = kvps_ring__coll_counts(r, x, 0);
    return rc == KVPS_OK ? kvps_ring__coll_scatter(r, x) : rc;
}
static kvps_result kvps_ring__coll_alltoallv(kvps_ring *r, const kvps_ring__exec *x) {
    kvps_result rc = kvps_ring__coll_counts(r, x, 1);
    return rc == KVPS_OK ? kvps_ring__coll_alltoall(r, x) : rc;
}

/* The collectives, one row per kvps_coll (from 1; row 0 names "no collective"). */
static const kvps_ring__coll_row kvps_ring__colls[] = {
    {"none", NULL, 0, 0, 0, "?"},
    {"allreduce", kvps_ring__coll_allreduce, 0, 1, 0, NULL},
    {"reduce", kvps_ring__coll_reduce, 1, 1, 0, NULL},
    {"reduce_scatter", kvps_ring__coll_reduce_scatter, 0, 1, 0, "ring"},
    {"allgather", kvps_ring__coll_allgather, 0, 0, 0, "ring"},
    {"broadcast", kvps_ring__coll_broadcast, 1, 0, 0, NULL},
    {"gather", kvps_ring__coll_gather, 1, 0, 0, "direct"},
    {"scatter", kvps_ring__coll_scatter, 1, 0, 0, "direct"},
    {"alltoall", kvps_ring__coll_alltoall, 0, 0, 0, "pairwise"},
    {"barrier", kvps_ring__coll_barrier, 0, 0, 0, "dissemination"},
    {"allgatherv", kvps_ring__coll_allgatherv, 0, 0, 1, "ring"},
    {"gatherv", kvps_ring__coll_gatherv, 1, 0, 1, "direct"},
    {"scatterv", kvps_ring__coll_scatterv, 1, 0, 1, "direct"},
    {"alltoallv", kvps_ring__coll_alltoallv, 0, 0, 2, "pairwise"},
};
typedef char kvps_ring__colls_check[sizeof kvps_ring__colls / sizeof kvps_ring__colls[0] == KVPS_COLL_COUNT ? 1 : -1];
static const kvps_ring__coll_row *kvps_ring__row(int coll) { return &kvps_ring__colls[coll]; }

/* Packed displacements of counts into d (d[i] = counts[0] + ... + counts[i-1]), or displs. */
static const size_t *kvps_ring__displs(const size_t *counts, const size_t *displs, size_t *d, int k) {
    if (displs) return displs;
    for (int i = 0; i < k; i++) d[i] = i ? d[i - 1] + counts[i - 1] : 0;
    return d;
}

/* Runs a validated operation (kvps_ring__validate). */
static kvps_result kvps_ring__execute(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list) {
    kvps_ring__exec x;
    const kvps_ring__coll_row *row = kvps_ring__row(op->coll);
    int k = r->size;
    size_t *b = r->blocks; /* 4 k: counts, displacements, then (all-to-all-v) the send side's */
    x.op = op;
    x.k = k;
    x.me = r->rank;
    x.es = kvps_dtype_size(op->dtype);
    if (row->counts) {
        x.cnt = op->coll == KVPS_COLL_ALLTOALLV ? op->recv_counts : op->counts;
        x.dsp = kvps_ring__displs(x.cnt, op->coll == KVPS_COLL_ALLTOALLV ? op->recv_displs : op->displs, b + k, k);
        x.scnt = op->counts;
        x.sdsp = op->coll == KVPS_COLL_ALLTOALLV ? kvps_ring__displs(op->counts, op->displs, b + 3 * k, k) : x.dsp;
        x.n = op->coll == KVPS_COLL_ALLTOALLV ? 0 : x.cnt[x.me];
    } else {
        for (int i = 0; i < k; i++) { b[i] = op->count; b[k + i] = (size_t)i * op->count; }
        x.cnt = x.scnt = b;
        x.dsp = x.sdsp = b + k;
        x.n = op->count;
    }
    x.bytes = x.n * x.es;
    x.large = x.bytes > r->desc.small_bytes;
    x.send = (const char *)op->send;
    x.recv = (char *)op->recv;
    x.all = r->view_buf + 2 * r->size;
    x.list = list;
    for (int i = 0; i < x.k; i++) x.all[i] = i;
    return row->run(r, &x);
}

/* A v-collective's arguments: counts given, each and their sum within 2^40 bytes, and the
   buffers that must hold data. */
static kvps_result kvps_ring__validate_v(const kvps_ring *r, const kvps_ring_op *op) {
    size_t lim = ((size_t)1 << 40) / kvps_dtype_size(op->dtype), sum = 0, rsum = 0;
    int a2a = op->coll == KVPS_COLL_ALLTOALLV, root = op->root == r->rank;
    if (!op->counts || (a2a && !op->recv_counts)) return KVPS_ERR_INVALID_ARG;
    for (int i = 0; i < r->size; i++) {
        size_t rc = a2a ? op->recv_counts[i] : 0;
        if (op->counts[i] > lim || rc > lim || (sum += op->counts[i]) > lim || (rsum += rc) > lim) return KVPS_ERR_INVALID_ARG;
    }
    size_t own = op->counts[r->rank];
    switch (op->coll) {
    case KVPS_COLL_ALLGATHERV: return sum && !op->recv ? KVPS_ERR_INVALID_ARG : KVPS_OK;
    case KVPS_COLL_GATHERV: return (root ? sum && !op->recv : own && !op->send) ? KVPS_ERR_INVALID_ARG : KVPS_OK;
    case KVPS_COLL_SCATTERV:
        return (own && !op->recv) || (root && sum && !op->send && !op->recv) ? KVPS_ERR_INVALID_ARG : KVPS_OK;
    default: return (rsum && !op->recv) || (sum && !op->send && !op->recv) ? KVPS_ERR_INVALID_ARG : KVPS_OK;
    }
}

static kvps_result kvps_ring__validate(const kvps_ring *r, const kvps_ring_op *op) {
    if (!op || op->coll < KVPS_COLL_ALLREDUCE || op->coll >= KVPS_COLL_COUNT) return KVPS_ERR_INVALID_ARG;
    if (op->coll == KVPS_COLL_BARRIER) return KVPS_OK;
    if (kvps_dtype_size(op->dtype) == 0 || (unsigned)op->op >= KVPS_REDOP_COUNT || (unsigned)op->algo >= KVPS_ALGO_COUNT)
        return KVPS_ERR_INVALID_ARG;
    if (op->wire && (op->coll != KVPS_COLL_ALLREDUCE || op->dtype != KVPS_FLOAT32 ||
                     (op->wire != KVPS_FLOAT16 && op->wire != KVPS_BFLOAT16)))
        return KVPS_ERR_INVALID_ARG;
    if (op->root < 0 || op->root >= r->size) return KVPS_ERR_INVALID_ARG;
    if (kvps_ring__row(op->coll)->counts) return kvps_ring__validate_v(r, op);
    if (op->count > ((size_t)1 << 40) / (size_t)r->size) return KVPS_ERR_INVALID_ARG;
    if (op->count == 0) return KVPS_OK;
    int root = op->root == r->rank;
    switch (op->coll) {
    case KVPS_COLL_REDUCE: if (root && !op->recv) return KVPS_ERR_INVALID_ARG; if (!op->send && !op->recv) return KVPS_ERR_INVALID_ARG; break;
    case KVPS_COLL_GATHER: if (root ? !op->recv : !op->send) return KVPS_ERR_INVALID_ARG; break;
    case KVPS_COLL_SCATTER: if (!op->recv) return KVPS_ERR_INVALID_ARG; break;
    default: if (!op->recv) return KVPS_ERR_INVALID_ARG;
    }
    return KVPS_OK;
}

// >>queue
/* Runs one operation in the calling thread (which holds the ring). */
/* Whether r may run a call: KVPS_ERR_STATE with the reason when it is broken, its family is
   (a failure on another of its rings closed the sockets), or the family's first ring is gone. */
static kvps_result kvps_ring__usable(kvps_ring *r) {
    if (r->broken) return KVPS_ERR_STATE;
    if (r->fam->closed)
        return kvps_ring__fail(r, KVPS_ERR_STATE, "the ring it was split from (made by kvps_ring_create) was destroyed "
                               "first: destroy sub-rings before it");
    if (r->fam->broken) return kvps_ring__fail(r, KVPS_ERR_STATE, "its family's sockets were closed: %s", r->fam->why);
    if (!r->connected) return kvps_ring__fail(r, KVPS_ERR_STATE, "kvps_ring_connect has not been called");
    return KVPS_OK;
}

/* A failure that may leave the caller's buffers in ZeroMQ's hands: every DEALER of the family
   is closed (dropping what is queued), which breaks the family's other rings too (section 9). */
static void kvps_ring__close_dealers(kvps_ring *r) {
    kvps_ring__fam *f = r->fam;
    for (int i = 0; f->dealers && i < f->size; i++) {
        if (!f->dealers[i]) continue;
        zmq_close(f->dealers[i]);
        f->dealers[i] = NULL;
    }
    if (!f->broken) snprintf(f->why, sizeof f->why, "%.190s", r->errmsg);
    f->broken = 1;
}

/* The family's hosts, before its first collective (which runs on its first ring: a split is a
   collective of its parent): every peer's hello read (each is the first message on its
   connection), so that every rank sees the same hosts. A first ring given no groups gets one per
   host (section 10), so AUTO runs HIER where the ranks span hosts and some share one. */
static kvps_result kvps_ring__topology(kvps_ring *r) {
    kvps_ring__fam *f = r->fam;
    if (f->topo || r->id) return KVPS_OK;
    kvps_result rc = KVPS_OK;
    int64_t hdl = kvps_ring__hello_dl(r, r->deadline);
    for (int p = 0; p < f->size && rc == KVPS_OK; p++) rc = kvps_ring__x_await_hello(r, p, hdl);
    if (rc == KVPS_ERR_TIMEOUT) {
        char missing[160] = "";
        for (int i = 0, n = 0; i < f->size && n < 150; i++)
            if (i != r->rank && !f->peers[i].hello) n += snprintf(missing + n, sizeof missing - (size_t)n, " %d", i);
        return kvps_ring__fail(r, rc, "rank %d: timed out after %d ms waiting for the hello of rank(s)%s (sent when a rank "
                               "connects: they never connected, or cannot reach this rank)", r->rank, kvps_ring__hello_ms(r),
                               missing);
    }
    if (rc != KVPS_OK) return kvps_ring__fail(r, rc, "poll: %s", zmq_strerror(zmq_errno()));
    f->topo = 1;
    f->cma_all = f->size > 1; /* DIRECT: every rank on this host, each saying its memory may be read (hellos) */
    for (int p = 0; p < f->size; p++) f->cma_all &= f->peers[p].cma;
    int hosts = 0;
    for (int i = 0; i < f->size; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) first = f->peers[j].host != f->peers[i].host;
        hosts += first;
    }
    if (r->desc.groups || hosts < 2) return KVPS_OK;
    int *g = (int *)malloc((size_t)f->size * sizeof *g);
    if (!g) return KVPS_ERR_NOMEM;
    for (int i = 0; i < f->size; i++) {
        g[i] = i;
        for (int j = 0; j < i; j++) if (f->peers[j].host == f->peers[i].host) { g[i] = g[j]; break; }
    }
    r->desc.groups = g;
    return KVPS_OK;
}

static kvps_result kvps_ring__join_agree(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list);
static kvps_result kvps_ring__join_check(kvps_ring *r);

/* One collective, as every rank runs it (kvps_ring__run_now adds a join ring's agreement first). */
static kvps_result kvps_ring__run_one(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list) {
    if (kvps_ring__usable(r) != KVPS_OK) return KVPS_ERR_STATE;
    r->seq++;
    memset(&r->cur, 0, sizeof r->cur);
    r->cur.magic = KVPS_RING__MAGIC;
    r->cur.seq = r->seq;
    r->cur.src = (uint16_t)r->rank;
    r->cur.coll = (uint8_t)op->coll;
    r->cur.dtype = (uint8_t)(op->dtype | (op->wire << 4)); /* the wire format is part of the call */
    r->wire = op->coll == KVPS_COLL_ALLREDUCE ? (int)op->wire : 0;
    r->cur.op = (uint8_t)op->op;
    r->cur.root = (uint16_t)op->root;
    r->cur.count = kvps_ring__row(op->coll)->counts ? 0 : op->count; /* (the v-collectives agree on theirs first) */
    r->cur.ring = r->id;
    r->cur.layout = list ? list->layout : r->join_agreeing ? KVPS_RING__JOIN_LAYOUT : 0;
    r->abort_rc = KVPS_OK;
    r->hier = 0;
    r->errmsg[0] = 0;
    r->deadline = kvps_ring__dl(r);
    kvps_ring__x_wait_start(r->fam, r->desc.stall_ms);
    if (r->tl) kvps_ring__tl_start(r);
    kvps_result rc = kvps_ring__topology(r); /* (it reads: a refusal may come with the hellos) */
    if (rc == KVPS_OK) rc = kvps_ring__p2p_refused(r); /* an eager send of this rank was refused: this call says so */
    if (rc == KVPS_OK && r->join_live && !r->join_agreeing) rc = kvps_ring__join_check(r); /* (one verdict everywhere) */
    if (rc == KVPS_OK) rc = kvps_ring__execute(r, op, list);
    if (rc == KVPS_OK) rc = kvps_ring__zc_drain(r, -1, r->deadline);
    if (r->fam->shm_name[0]) kvps_ring__x_maybe_unlink(r->fam); /* (the peers that have mapped it by now) */
    if (r->tl) kvps_ring__tl_finish(r, op, rc);
    r->prev = r->cur;
    /* drop stashed pieces of this collective (none unless a peer sent extra) */
    for (kvps_ring__stash **pp = &r->stash; *pp;) {
        kvps_ring__stash *e = *pp;
        if ((int32_t)(e->h.seq - r->seq) <= 0) { *pp = e->next; zmq_msg_close(&e->payload); free(e); }
        else pp = &e->next;
    }
    if (rc != KVPS_OK) {
        if (rc != KVPS_ERR_PEER) kvps_ring__abort_all(r, rc);
        kvps__log(KVPS_LOG_WARN, "ring %d: %s: %s", r->rank, kvps_result_str(rc), r->errmsg);
        /* ZeroMQ may still hold the caller's buffers (frames sent without a copy): then drop
           everything queued before returning. Else what is queued (the abort notices, a
           v-collective's counts) still goes out, and the family's other rings go on. */
        if (kvps_ring__zc_busy(r, -1)) kvps_ring__close_dealers(r);
        for (int64_t until = kvps__now_ms() + 2000; kvps_ring__zc_busy(r, -1) && kvps__now_ms() < until;) sched_yield();
        if (kvps_ring__zc_busy(r, -1))
            kvps__log(KVPS_LOG_ERROR, "ring %d: a peer still holds frames sent without a copy: keep the buffers "
                                      "of the failed call alive until the peers are gone", r->rank);
        r->broken = 1;
    }
    return rc;
}

/* A collective called by the user: on a ring made with .join, the agreement on who has joined
   first (>>join), which a joined rank shadows. */
static kvps_result kvps_ring__run_now(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list) {
    kvps_result rc = r->desc.join > 0 ? kvps_ring__join_agree(r, op, list) : KVPS_OK;
    return rc == KVPS_OK ? kvps_ring__run_one(r, op, list) : rc;
}

/* The family's thread: runs the operations posted on any of its rings, in the order posted. */
static void *kvps_ring__thread(void *arg) {
    kvps_ring__fam *f = (kvps_ring__fam *)arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->quit && (!f->head || f->busy)) pthread_cond_wait(&f->cv, &f->mu);
        if (f->quit && !f->head) break;
        kvps_ring__job *j = f->head;
        f->head = j->next;
        if (!f->head) f->tail = NULL;
        f->busy = 1;
        f->running_id = j->id;
        pthread_mutex_unlock(&f->mu);
        if (j->ring->tl) j->ring->tl->posted = j->tl_t0;
        kvps_result rc = kvps_ring__run_now(j->ring, &j->op, j->list);
        pthread_mutex_lock(&f->mu);
        f->busy = 0;
        f->running_id = 0;
        j->result = rc;
        j->done = 1;
        j->next = f->finished;
        f->finished = j;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* kvps_ring_post, and (list non-NULL, checked by its maker) an all-reduce over a list of buffers. */
static kvps_result kvps_ring__post_op(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list, kvps_ring_req *out) {
    if (!r || !out) return KVPS_ERR_INVALID_ARG;
    *out = 0;
    kvps_result rc = list ? KVPS_OK : kvps_ring__validate(r, op);
    if (rc != KVPS_OK) return rc;
    kvps_ring__job *j = (kvps_ring__job *)calloc(1, sizeof *j);
    if (!j) return KVPS_ERR_NOMEM;
    kvps_ring__fam *f = r->fam;
    j->op = *op;
    j->list = list;
    j->ring = r;
    if (r->tl) j->tl_t0 = kvps__tl_now();
    pthread_mutex_lock(&f->mu);
    if (!f->thread_started) {
        if (pthread_create(&f->thread, NULL, kvps_ring__thread, f) != 0) {
            pthread_mutex_unlock(&f->mu);
            free(j);
            return KVPS_ERR_NOMEM;
        }
        f->thread_started = 1;
    }
    j->id = ++f->next_id;
    if (f->tail) f->tail->next = j; else f->head = j;
    f->tail = j;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    *out = j->id;
    return KVPS_OK;
}

/* Under the family's mu: unlinks and returns ring r's finished job req; *known says whether req
   is still to come (queued or running). */
static kvps_ring__job *kvps_ring__take(kvps_ring *r, kvps_ring_req req, int *known) {
    kvps_ring__fam *f = r->fam;
    *known = 0;
    for (kvps_ring__job **pp = &f->finished; *pp; pp = &(*pp)->next)
        if ((*pp)->id == req && (*pp)->ring == r) { kvps_ring__job *j = *pp; *pp = j->next; return j; }
    for (kvps_ring__job *j = f->head; j; j = j->next)
        if (j->id == req && j->ring == r) *known = 1;
    *known |= req != 0 && f->running_id == req; /* (ids are the family's: the running job's is unique) */
    return NULL;
}

static kvps_ring__p2p *kvps_ring__p2p_find(kvps_ring *r, kvps_ring_req req);
static kvps_result kvps_ring__p2p_wait(kvps_ring *r, kvps_ring__p2p *q, int timeout_ms, int *done);

KVPS_API kvps_result kvps_ring_wait(kvps_ring *r, kvps_ring_req req, int timeout_ms) {
    if (!r) return KVPS_ERR_INVALID_ARG;
    kvps_ring__p2p *pq = kvps_ring__p2p_find(r, req);
    if (pq) return kvps_ring__p2p_wait(r, pq, timeout_ms, NULL);
    /* (-1: the operation's own deadline, when the ring has one, and a second for its result) */
    int64_t deadline = timeout_ms >= 0 ? kvps__now_ms() + timeout_ms
                     : r->desc.timeout_ms > 0 ? kvps__now_ms() + r->desc.timeout_ms + 1000 : KVPS__NEVER;
    pthread_mutex_lock(&r->fam->mu);
    for (;;) {
        int known;
        kvps_ring__job *j = kvps_ring__take(r, req, &known);
        if (j) {
            pthread_mutex_unlock(&r->fam->mu);
            kvps_result rc = j->result;
            free(j);
            return rc;
        }
        if (!known) { pthread_mutex_unlock(&r->fam->mu); return KVPS_ERR_INVALID_REQ; }
        int64_t left = deadline - kvps__now_ms();
        if (left <= 0) { pthread_mutex_unlock(&r->fam->mu); return KVPS_ERR_TIMEOUT; }
        if (left > 1000) left = 1000; /* (a slice: the loop looks again) */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (left % 1000) * 1000000;
        ts.tv_sec += left / 1000 + ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&r->fam->cv, &r->fam->mu, &ts);
    }
}

KVPS_API kvps_result kvps_ring_test(kvps_ring *r, kvps_ring_req req, int *done) {
    if (!r || !done) return KVPS_ERR_INVALID_ARG;
    *done = 0;
    kvps_ring__p2p *pq = kvps_ring__p2p_find(r, req);
    if (pq) return kvps_ring__p2p_wait(r, pq, 0, done);
    pthread_mutex_lock(&r->fam->mu);
    int known;
    kvps_ring__job *j = kvps_ring__take(r, req, &known);
    pthread_mutex_unlock(&r->fam->mu);
    if (!j) return known ? KVPS_OK : KVPS_ERR_INVALID_REQ;
    *done = 1;
    kvps_result rc = j->result;
    free(j);
    return rc;
}

KVPS_API kvps_result kvps_ring_post(kvps_ring *r, const kvps_ring_op *op, kvps_ring_req *out) {
    return kvps_ring__post_op(r, op, NULL, out);
}

/* kvps_ring_run, and (list non-NULL, checked by its maker) an all-reduce over a list of buffers. */
static kvps_result kvps_ring__run_op(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list) {
    if (!r) return KVPS_ERR_INVALID_ARG;
    kvps_result rc = list ? KVPS_OK : kvps_ring__validate(r, op);
    if (rc != KVPS_OK) return rc;
    pthread_mutex_lock(&r->fam->mu);
    if (!r->fam->head && !r->fam->busy) { /* nothing queued: run here, no thread hand-off */
        r->fam->busy = 1;
        pthread_mutex_unlock(&r->fam->mu);
        rc = kvps_ring__run_now(r, op, list);
        pthread_mutex_lock(&r->fam->mu);
        r->fam->busy = 0;
        pthread_cond_broadcast(&r->fam->cv);
        pthread_mutex_unlock(&r->fam->mu);
        return rc;
    }
    pthread_mutex_unlock(&r->fam->mu);
    kvps_ring_req q;
    rc = kvps_ring__post_op(r, op, list, &q);
    return rc == KVPS_OK ? kvps_ring_wait(r, q, -1) : rc;
}

KVPS_API kvps_result kvps_ring_run(kvps_ring *r, const kvps_ring_op *op) { return kvps_ring__run_op(r, op, NULL); }

// >>p2p
/* Point-to-point (manual section 7). The ring's one ROUTER and its DEALERs carry it, so a p2p
   call holds the sockets as a collective does (kvps_ring__hold): it waits for the posted
   collectives to finish first. Arrived messages are kept in p2p_in by whoever read them
   (kvps_ring__p2p_keep, here or in a collective's receive loop); kvps_ring__p2p_progress, run by
   every p2p call, matches them to this rank's requests: receives in the order started, each
   taking the first kept message of its (rank, tag), so messages between a pair arrive in order
   per tag; answers (ACK, NACK) complete sends. */

/* Takes the family's sockets for the calling thread once the operations posted on any of its
   rings have run (p2p calls, a split, a sub-ring's destroy); kvps_ring__release gives them back. */
static void kvps_ring__hold(kvps_ring__fam *f) {
    pthread_mutex_lock(&f->mu);
    while (f->busy || f->head) pthread_cond_wait(&f->cv, &f->mu);
    f->busy = 1;
    pthread_mutex_unlock(&f->mu);
}

static void kvps_ring__release(kvps_ring__fam *f) {
    pthread_mutex_lock(&f->mu);
    f->busy = 0;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

static void kvps_ring__tok_free(void *data, void *hint) {
    (void)data;
    kvps_ring__tok *t = (kvps_ring__tok *)hint;
    __atomic_store_n(&t->released, 1, __ATOMIC_RELEASE);
    if (__atomic_sub_fetch(&t->refs, 1, __ATOMIC_ACQ_REL) == 0) free(t);
}

static void kvps_ring__tok_unref(kvps_ring__tok **t) {
    if (*t && __atomic_sub_fetch(&(*t)->refs, 1, __ATOMIC_ACQ_REL) == 0) free(*t);
    *t = NULL;
}

static int kvps_ring__p2p_released(const kvps_ring__p2p *q) {
    return !q->tok || __atomic_load_n(&q->tok->released, __ATOMIC_ACQUIRE);
}

/* "recv of 100 float32 from rank 2 tag 7" */
static const char *kvps_ring__p2p_call_text(const kvps_ring__p2p *q, char *buf, size_t cap) {
    snprintf(buf, cap, "%s of %zu %s %s rank %d tag %u", q->is_send ? "send" : "recv", q->count,
             kvps_dtype_name(q->dtype), q->is_send ? "to" : "from", q->peer, q->tag);
    return buf;
}

static void kvps_ring__p2p_end(kvps_ring__p2p *q, kvps_result rc, const char *fmt, ...) {
    q->done = 1;
    q->result = rc;
    if (rc != KVPS_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(q->why, sizeof q->why, fmt, ap);
        va_end(ap);
    }
}

/* Reads every message waiting on the router, without waiting: p2p ones kept, collective ones
   held for the collectives, in order (a collective abort also says its sender's ring broke). */
static void kvps_ring__p2p_pump(kvps_ring *r) {
    kvps_ring__hdr h;
    zmq_msg_t pl;
    while (kvps_ring__read(r, &h, &pl)) kvps_ring__deliver(r, &h, &pl);
}

/* Sends a p2p header and payload (consumed) to rank dst. */
static kvps_result kvps_ring__p2p_post(kvps_ring *r, int dst, const kvps_ring__hdr *h, zmq_msg_t *payload) {
    if (dst == r->rank) return kvps_ring__p2p_keep(r, h, payload) ? KVPS_OK : KVPS_ERR_NOMEM; /* to itself: kept at once */
    kvps_result rc;
    if (kvps_ring__x_post(r, dst, h, payload, &rc)) return rc;
    zmq_msg_t f[2];
    if (kvps__msg_from_buf(&f[0], h, sizeof *h) != 0) { zmq_msg_close(payload); return KVPS_ERR_NOMEM; }
    f[1] = *payload;
    zmq_msg_init(payload);
    void *d = kvps_ring__dealer(r, dst);
    if (!d) { zmq_msg_close(&f[0]); zmq_msg_close(&f[1]); return KVPS_ERR_STATE; }
    r->fam->peers[r->root_rank[dst]].zsent = 1;
    if (kvps__send_frames(d, f, 2) != 0) return zmq_errno() == EAGAIN ? KVPS_ERR_PEER : KVPS_ERR_ZMQ;
    return KVPS_OK;
}

static kvps_ring__hdr kvps_ring__p2p_hdr(const kvps_ring *r, int kind, uint32_t seq, uint32_t tag, int dt, uint64_t count) {
    kvps_ring__hdr h;
    memset(&h, 0, sizeof h);
    h.magic = KVPS_RING__MAGIC;
    h.seq = seq;
    h.tag = tag;
    h.src = (uint16_t)r->rank;
    h.ring = r->id;
    h.coll = KVPS_RING__P2P;
    h.dtype = (uint8_t)dt;
    h.op = (uint8_t)kind;
    h.count = count;
    return h;
}

/* Starts a send: up to p2p_eager bytes (and any to itself) are copied and done at once; larger
   ones go without a copy and are done when the receiver's answer has come and ZeroMQ has let go
   of the buffer. */
static kvps_result kvps_ring__p2p_send_now(kvps_ring *r, kvps_ring__p2p *q) {
    size_t bytes = q->count * kvps_dtype_size(q->dtype);
    int sync = bytes > r->p2p_eager && q->peer != r->rank;
    q->seq = ++r->p2p_sent[q->peer];
    kvps_ring__hdr h = kvps_ring__p2p_hdr(r, sync ? KVPS_RING__P2P_SYNC : KVPS_RING__P2P_EAGER, q->seq, q->tag, q->dtype,
                                          q->count);
    zmq_msg_t m;
    if (sync) {
        q->tok = (kvps_ring__tok *)calloc(1, sizeof *q->tok);
        if (!q->tok) return KVPS_ERR_NOMEM;
        q->tok->refs = 2;
        if (zmq_msg_init_data(&m, q->buf, bytes, kvps_ring__tok_free, q->tok) != 0) {
            free(q->tok);
            q->tok = NULL;
            return KVPS_ERR_NOMEM;
        }
    } else if (kvps__msg_from_buf(&m, q->buf, bytes) != 0) {
        return KVPS_ERR_NOMEM;
    }
    kvps_result rc = kvps_ring__p2p_post(r, q->peer, &h, &m);
    if (rc != KVPS_OK) { /* in the words the transport recorded, when it did (a dead peer named) */
        char call[96], mine[24];
        snprintf(mine, sizeof mine, "rank %d: ", r->rank);
        const char *why = rc == KVPS_ERR_PEER ? "no connection (the peer is gone)" : r->errmsg[0] ? r->errmsg : kvps_result_str(rc);
        if (strncmp(why, mine, strlen(mine)) == 0) why += strlen(mine);
        kvps_ring__p2p_end(q, rc, "rank %d: %s: %s", r->rank, kvps_ring__p2p_call_text(q, call, sizeof call), why);
        return rc;
    }
    if (!sync) kvps_ring__p2p_end(q, KVPS_OK, NULL);
    return KVPS_OK;
}

/* Receive q takes kept message e (its rank and tag): the data, or a refusal to both sides. */
static void kvps_ring__p2p_take(kvps_ring *r, kvps_ring__p2p *q, kvps_ring__stash *e) {
    const kvps_ring__hdr *h = &e->h;
    kvps_ring__hdr a;
    if (h->count != q->count || h->dtype != (uint8_t)q->dtype) {
        char mm[200];
        kvps_ring__p2p_mm_text(mm, sizeof mm, r->rank, q->peer, q->tag, q->count, q->dtype, h->count, h->dtype);
        kvps_ring__p2p_end(q, KVPS_ERR_MISMATCH, "%s", mm);
        a = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_NACK, h->seq, q->tag, q->dtype, q->count);
        zmq_msg_t echo; /* the header refused: the sender names what it sent */
        if (kvps__msg_from_buf(&echo, h, sizeof *h) == 0) kvps_ring__p2p_post(r, q->peer, &a, &echo);
    } else {
        size_t bytes = q->count * kvps_dtype_size(q->dtype);
        if (bytes) memcpy(q->buf, zmq_msg_data(&e->payload), bytes);
        kvps_ring__p2p_end(q, KVPS_OK, NULL);
        if (h->op == KVPS_RING__P2P_SYNC) {
            a = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_ACK, h->seq, q->tag, q->dtype, q->count);
            zmq_msg_t none;
            zmq_msg_init(&none);
            kvps_ring__p2p_post(r, q->peer, &a, &none); /* (a lost answer times the sender out, which names us) */
        }
    }
    zmq_msg_close(&e->payload);
    free(e);
}

/* Matches what is kept with this rank's requests (see the section's top). Returns an error when
   a refusal answers no request still waiting (an eager send that has returned): the call that
   sees it fails with it. */
static kvps_result kvps_ring__p2p_progress(kvps_ring *r) {
    kvps_result rc = KVPS_OK;
    for (kvps_ring__stash **pp = &r->p2p_in; *pp;) {
        kvps_ring__stash *e = *pp;
        int kind = e->h.op;
        if (kind != KVPS_RING__P2P_ACK && kind != KVPS_RING__P2P_NACK) { pp = &e->next; continue; }
        kvps_ring__p2p *q = r->p2p_reqs;
        while (q && !(q->is_send && !q->done && q->peer == e->h.src && q->seq == e->h.seq)) q = q->next;
        if (kind == KVPS_RING__P2P_ACK) {
            if (q) kvps_ring__p2p_end(q, KVPS_OK, NULL);
        } else {
            char t[320];
            kvps_ring__p2p_nack_text(r, e, t, sizeof t);
            if (q) kvps_ring__p2p_end(q, KVPS_ERR_MISMATCH, "%s", t);
            else if (rc == KVPS_OK) rc = kvps_ring__fail(r, KVPS_ERR_MISMATCH, "%s", t);
        }
        kvps_ring__fifo_cut(pp, &r->p2p_in_tail);
        zmq_msg_close(&e->payload);
        free(e);
    }
    for (kvps_ring__p2p *q = r->p2p_reqs; q; q = q->next) {
        if (q->is_send || q->done) continue;
        for (kvps_ring__stash **pp = &r->p2p_in; *pp; pp = &(*pp)->next) {
            const kvps_ring__hdr *h = &(*pp)->h;
            if ((h->op == KVPS_RING__P2P_EAGER || h->op == KVPS_RING__P2P_SYNC) && h->src == q->peer && h->tag == q->tag) {
                kvps_ring__p2p_take(r, q, kvps_ring__fifo_cut(pp, &r->p2p_in_tail));
                break;
            }
        }
    }
    return rc;
}

/* A p2p call failed: the ring is broken, as after any error (section 5), and the peers are told,
   so that one waiting for this rank fails at once rather than at its timeout. Zero-copy sends
   still in ZeroMQ's hands are given up to a second to go out (their buffers are the caller's). */
static void kvps_ring__p2p_break(kvps_ring *r, kvps_result rc) {
    if (rc == KVPS_OK || rc == KVPS_ERR_INVALID_ARG || rc == KVPS_ERR_INVALID_REQ || r->broken) return;
    kvps__log(KVPS_LOG_WARN, "ring %d: %s: %s", r->rank, kvps_result_str(rc), r->errmsg);
    if (rc != KVPS_ERR_PEER) {
        for (int i = 0; i < r->size; i++) {
            if (i == r->rank) continue;
            kvps_ring__hdr h = kvps_ring__p2p_hdr(r, KVPS_RING__P2P_ABORT, 0, 0, 0, (uint64_t)(int64_t)rc);
            h.abort = 1; /* a notice, as a collective's: it waits for no hello, and its failure is not recorded */
            zmq_msg_t m;
            if (kvps__msg_from_buf(&m, r->errmsg, strlen(r->errmsg)) == 0) kvps_ring__p2p_post(r, i, &h, &m);
        }
    }
    r->broken = 1;
    int held = 0;
    for (int64_t until = kvps__now_ms() + 1000;; sched_yield()) {
        held = 0;
        for (kvps_ring__p2p *q = r->p2p_reqs; q; q = q->next) held += !kvps_ring__p2p_released(q);
        if (!held || kvps__now_ms() > until) break;
    }
    if (held) kvps_ring__close_dealers(r); /* drop them: the caller may free its buffers once the calls return */
}

/* Drives q until it is done (and a zero-copy send's buffer is let go of) or deadline. fatal:
   the deadline is the ring's timeout, and missing it fails q; else KVPS_ERR_TIMEOUT leaves q
   to a later wait. */
static kvps_result kvps_ring__p2p_drive(kvps_ring *r, kvps_ring__p2p *q, int64_t deadline, int fatal) {
    for (;;) {
        kvps_ring__p2p_pump(r);
        kvps_result rc = kvps_ring__p2p_progress(r);
        if (rc != KVPS_OK) {
            if (!q->done) kvps_ring__p2p_end(q, rc, "%s", r->errmsg);
            return rc;
        }
        if (q->done && kvps_ring__p2p_released(q)) {
            if (q->result != KVPS_OK) kvps_ring__fail(r, q->result, "%s", q->why);
            return q->result;
        }
        char call[96];
        if (!q->done && r->p2p_gone[q->peer]) {
            kvps_ring__p2p_end(q, KVPS_ERR_PEER, "rank %d: %s: rank %d's ring failed%s%s", r->rank,
                               kvps_ring__p2p_call_text(q, call, sizeof call), q->peer,
                               r->p2p_why_rank == q->peer ? ": " : "", r->p2p_why_rank == q->peer ? r->p2p_why : "");
            return kvps_ring__fail(r, KVPS_ERR_PEER, "%s", q->why);
        }
        int64_t left = deadline - kvps__now_ms();
        if (left <= 0) {
            if (!fatal) return KVPS_ERR_TIMEOUT;
            kvps_ring__p2p_end(q, KVPS_ERR_TIMEOUT, "rank %d: timed out after %d ms waiting for rank %d in %s%s", r->rank,
                               r->desc.timeout_ms, q->peer, kvps_ring__p2p_call_text(q, call, sizeof call),
                               q->done ? " (for ZeroMQ to let go of the buffer)" : q->is_send ? " (for the receiver's answer)" : "");
            return kvps_ring__fail(r, KVPS_ERR_TIMEOUT, "%s", q->why);
        }
        /* done but the frame not let go of: ZeroMQ's I/O thread is about to; look again soon */
        if (kvps_ring__x_wait(r->fam, q->done ? 1 : left) != KVPS_OK)
            return kvps_ring__fail(r, KVPS_ERR_ZMQ, "poll: %s", zmq_strerror(zmq_errno()));
        char gone[320];
        if (!q->done && q->peer != r->rank && kvps_ring__x_gone(r->fam, r->root_rank[q->peer], gone, sizeof gone) &&
            !kvps_ring__x_ready(r->fam)) {
            kvps_ring__p2p_end(q, KVPS_ERR_PEER_LOST, "rank %d: %s: rank %d %s", r->rank,
                               kvps_ring__p2p_call_text(q, call, sizeof call), q->peer, gone);
            return kvps_ring__fail(r, KVPS_ERR_PEER_LOST, "%s", q->why);
        }
        if (!q->done && kvps_ring__x_stall_due(r->fam))
            kvps_ring__x_stall(r->fam, r->root_rank[q->peer], q->is_send ? "waiting for an answer from" : "waiting for",
                               kvps_ring__p2p_call_text(q, call, sizeof call));
    }
}

static void kvps_ring__p2p_unlink(kvps_ring *r, kvps_ring__p2p *q) {
    for (kvps_ring__p2p **pp = &r->p2p_reqs; *pp; pp = &(*pp)->next)
        if (*pp == q) { *pp = q->next; break; }
    kvps_ring__tok_unref(&q->tok);
    if (q->on_heap) free(q);
}

static kvps_ring__p2p *kvps_ring__p2p_find(kvps_ring *r, kvps_ring_req req) {
    kvps_ring__p2p *q = r->p2p_reqs;
    while (q && q->id != req) q = q->next;
    return q;
}

/* The checks of a send's or receive's arguments, with a message. */
static kvps_result kvps_ring__p2p_args(kvps_ring *r, int is_send, const void *buf, size_t count, kvps_dtype dt, int peer) {
    const char *call = is_send ? "send" : "recv", *who = is_send ? "dst" : "src";
    if (kvps_ring__usable(r) != KVPS_OK) return KVPS_ERR_STATE;
    if (peer < 0 || peer >= r->size)
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "rank %d: %s: %s %d is not a rank of this ring (0..%d)", r->rank, call,
                               who, peer, r->size - 1);
    if (kvps_dtype_size(dt) == 0)
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "rank %d: %s: dtype %d is not a kvps_dtype", r->rank, call, (int)dt);
    if (count > ((size_t)1 << 40) / kvps_dtype_size(dt))
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "rank %d: %s: count %zu is too large", r->rank, call, count);
    if (!buf && count)
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "rank %d: %s: buffer NULL with count %zu", r->rank, call, count);
    return KVPS_OK;
}

/* A send or receive: started, then (out NULL) driven to its end, or (out) left as a request. */
static kvps_result kvps_ring__p2p_start(kvps_ring *r, int is_send, const void *buf, size_t count, kvps_dtype dt,
                                        int peer, uint32_t tag, kvps_ring_req *out) {
    if (!r) return KVPS_ERR_INVALID_ARG;
    if (out) *out = 0;
    kvps_ring__hold(r->fam);
    r->errmsg[0] = 0;
    kvps_ring__x_wait_start(r->fam, r->desc.stall_ms);
    kvps_result rc = kvps_ring__p2p_args(r, is_send, buf, count, dt, peer);
    kvps_ring__p2p local, *q = &local;
    if (rc == KVPS_OK && out && !(q = (kvps_ring__p2p *)malloc(sizeof *q))) rc = KVPS_ERR_NOMEM;
    if (rc != KVPS_OK) { kvps_ring__release(r->fam); return rc; }
    memset(q, 0, sizeof *q);
    q->on_heap = out != NULL;
    q->is_send = is_send;
    q->peer = peer;
    q->tag = tag;
    q->dtype = dt;
    q->count = count;
    q->buf = (void *)(uintptr_t)buf;
    pthread_mutex_lock(&r->fam->mu);
    q->id = ++r->fam->next_id;
    pthread_mutex_unlock(&r->fam->mu);
    kvps_ring__p2p **tail = &r->p2p_reqs; /* in the order started: receives match in that order */
    while (*tail) tail = &(*tail)->next;
    *tail = q;
    /* first what has come: a refusal of an earlier eager send fails this call (section 7) */
    kvps_ring__p2p_pump(r);
    rc = kvps_ring__p2p_progress(r);
    if (rc == KVPS_OK && is_send) rc = kvps_ring__p2p_send_now(r, q);
    /* an eager send is done here, and returns KVPS_OK: a refusal arriving from now on, however
       soon, is its next call's (the manual says so; no race decides which call reports it) */
    if (rc == KVPS_OK && !out && !(is_send && q->done))
        rc = kvps_ring__p2p_drive(r, q, kvps_ring__dl(r), 1);
    if (rc != KVPS_OK) {
        if (q->why[0]) kvps_ring__fail(r, rc, "%s", q->why);
        kvps_ring__p2p_break(r, rc);
    }
    if (!out || rc != KVPS_OK) kvps_ring__p2p_unlink(r, q);
    else *out = q->id;
    kvps_ring__release(r->fam);
    return rc;
}

/* kvps_ring_wait (done NULL: up to timeout_ms, < 0 the ring's timeout, which fails the request)
   and kvps_ring_test (done: a look, no wait) of a p2p request. */
static kvps_result kvps_ring__p2p_wait(kvps_ring *r, kvps_ring__p2p *q, int timeout_ms, int *done) {
    kvps_ring__hold(r->fam);
    kvps_result rc;
    if (r->broken || r->fam->broken || r->fam->closed) { /* an answer already kept may still say how q ended */
        kvps_ring__p2p_progress(r);
        rc = q->done && kvps_ring__p2p_released(q) ? q->result : KVPS_ERR_STATE;
        if (rc != KVPS_OK && q->done) kvps_ring__fail(r, rc, "%s", q->why);
    } else {
        r->errmsg[0] = 0;
        int fatal = !done && timeout_ms < 0;
        kvps_ring__x_wait_start(r->fam, r->desc.stall_ms);
        rc = kvps_ring__p2p_drive(r, q, done ? kvps__now_ms() : timeout_ms < 0 ? kvps_ring__dl(r) : kvps__now_ms() + timeout_ms,
                                  fatal);
        if (rc == KVPS_ERR_TIMEOUT && !fatal && !q->done) { /* not done yet: q stays */
            kvps_ring__release(r->fam);
            return done ? KVPS_OK : kvps_ring__fail(r, KVPS_ERR_TIMEOUT, "rank %d: wait: request %llu not done within %d ms",
                                                    r->rank, (unsigned long long)q->id, timeout_ms);
        }
        kvps_ring__p2p_break(r, rc);
    }
    if (done) *done = 1;
    kvps_ring__p2p_unlink(r, q);
    kvps_ring__release(r->fam);
    return rc;
}

KVPS_API kvps_result kvps_ring_send(kvps_ring *r, const void *buf, size_t count, kvps_dtype dt, int dst, uint32_t tag) {
    return kvps_ring__p2p_start(r, 1, buf, count, dt, dst, tag, NULL);
}
KVPS_API kvps_result kvps_ring_recv(kvps_ring *r, void *buf, size_t count, kvps_dtype dt, int src, uint32_t tag) {
    return kvps_ring__p2p_start(r, 0, buf, count, dt, src, tag, NULL);
}
KVPS_API kvps_result kvps_ring_isend(kvps_ring *r, const void *buf, size_t count, kvps_dtype dt, int dst, uint32_t tag,
                                     kvps_ring_req *out) {
    return out ? kvps_ring__p2p_start(r, 1, buf, count, dt, dst, tag, out) : KVPS_ERR_INVALID_ARG;
}
KVPS_API kvps_result kvps_ring_irecv(kvps_ring *r, void *buf, size_t count, kvps_dtype dt, int src, uint32_t tag,
                                     kvps_ring_req *out) {
    return out ? kvps_ring__p2p_start(r, 0, buf, count, dt, src, tag, out) : KVPS_ERR_INVALID_ARG;
}

// >>api
static kvps_result kvps_ring__call(kvps_ring *r, kvps_coll coll, const void *send, void *recv, size_t count,
                                   kvps_dtype dt, kvps_redop op, int root, kvps_dtype wire) {
    kvps_ring_op o;
    memset(&o, 0, sizeof o);
    o.coll = coll;
    o.send = send;
    o.recv = recv;
    o.count = count;
    o.dtype = dt;
    o.op = op;
    o.root = root;
    o.wire = wire;
    return kvps_ring_run(r, &o);
}
KVPS_API kvps_result kvps_ring_allreduce(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, kvps_redop op) {
    return kvps_ring__call(r, KVPS_COLL_ALLREDUCE, send, recv, count, dt, op, 0, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_reduce(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, kvps_redop op, int root) {
    return kvps_ring__call(r, KVPS_COLL_REDUCE, send, recv, count, dt, op, root, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_reduce_scatter(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, kvps_redop op) {
    return kvps_ring__call(r, KVPS_COLL_REDUCE_SCATTER, send, recv, count, dt, op, 0, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_allgather(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt) {
    return kvps_ring__call(r, KVPS_COLL_ALLGATHER, send, recv, count, dt, KVPS_SUM, 0, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_broadcast(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, int root) {
    return kvps_ring__call(r, KVPS_COLL_BROADCAST, send, recv, count, dt, KVPS_SUM, root, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_gather(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, int root) {
    return kvps_ring__call(r, KVPS_COLL_GATHER, send, recv, count, dt, KVPS_SUM, root, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_scatter(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt, int root) {
    return kvps_ring__call(r, KVPS_COLL_SCATTER, send, recv, count, dt, KVPS_SUM, root, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_alltoall(kvps_ring *r, const void *send, void *recv, size_t count, kvps_dtype dt) {
    return kvps_ring__call(r, KVPS_COLL_ALLTOALL, send, recv, count, dt, KVPS_SUM, 0, KVPS_FLOAT32);
}
KVPS_API kvps_result kvps_ring_allreduce_wire(kvps_ring *r, const void *send, void *recv, size_t count,
                                              kvps_redop op, kvps_dtype wire) {
    return kvps_ring__call(r, KVPS_COLL_ALLREDUCE, send, recv, count, KVPS_FLOAT32, op, 0, wire);
}

KVPS_API kvps_result kvps_ring_allreduce_topk(kvps_ring *r, float *buf, size_t count, size_t k, float *residual) {
    if (!r || (!buf && count) || k > count || count > UINT32_MAX) return KVPS_ERR_INVALID_ARG;
    size_t kk = k ? k : 1, n = (size_t)r->size;
    uint32_t *mine = (uint32_t *)malloc(kk * 2 * sizeof *mine), *all = (uint32_t *)malloc(kk * 2 * n * sizeof *all);
    float *val = (float *)malloc(kk * sizeof *val);
    kvps_result rc = mine && all && val ? KVPS_OK : KVPS_ERR_NOMEM;
    if (rc == KVPS_OK) rc = kvps__topk_ef(buf, residual, count, k, mine, val);
    if (rc == KVPS_OK) {
        /* pairs (index, value bits): indices are already in mine[0..k), values after them */
        memcpy(mine + k, val, k * sizeof *val);
        rc = kvps_ring_allgather(r, mine, all, 2 * k, KVPS_INT32);
    }
    /* every index checked before buf changes; every rank got the same pairs, so every rank
       fails alike, and the ring is broken as after any failed collective */
    for (size_t q = 0; rc == KVPS_OK && q < n; q++)
        for (size_t j = 0; j < k; j++)
            if (all[q * 2 * k + j] >= count) {
                rc = kvps_ring__fail(r, KVPS_ERR_MALFORMED, "top-k all-reduce: rank %zu sent index %u (count %zu)", q,
                                     all[q * 2 * k + j], count);
                r->broken = 1;
                break;
            }
    if (rc == KVPS_OK) {
        memset(buf, 0, count * sizeof *buf);
        for (size_t q = 0; q < n; q++) {
            const uint32_t *ix = all + q * 2 * k, *vv = ix + k;
            for (size_t j = 0; j < k; j++) {
                float v;
                memcpy(&v, vv + j, sizeof v);
                buf[ix[j]] += v;
            }
        }
    }
    free(mine); free(all); free(val);
    return rc;
}

KVPS_API kvps_result kvps_ring_barrier(kvps_ring *r) {
    return kvps_ring__call(r, KVPS_COLL_BARRIER, NULL, NULL, 0, KVPS_FLOAT32, KVPS_SUM, 0, KVPS_FLOAT32);
}

static kvps_result kvps_ring__callv(kvps_ring *r, kvps_coll coll, const void *send, const size_t *counts,
                                    const size_t *displs, void *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, kvps_dtype dt, int root) {
    kvps_ring_op o;
    memset(&o, 0, sizeof o);
    o.coll = coll;
    o.send = send;
    o.recv = recv;
    o.dtype = dt;
    o.root = root;
    o.counts = counts;
    o.displs = displs;
    o.recv_counts = recv_counts;
    o.recv_displs = recv_displs;
    return kvps_ring_run(r, &o);
}
KVPS_API kvps_result kvps_ring_allgatherv(kvps_ring *r, const void *send, void *recv, const size_t *counts,
                                          const size_t *displs, kvps_dtype dt) {
    return kvps_ring__callv(r, KVPS_COLL_ALLGATHERV, send, counts, displs, recv, NULL, NULL, dt, 0);
}
KVPS_API kvps_result kvps_ring_gatherv(kvps_ring *r, const void *send, void *recv, const size_t *counts,
                                       const size_t *displs, kvps_dtype dt, int root) {
    return kvps_ring__callv(r, KVPS_COLL_GATHERV, send, counts, displs, recv, NULL, NULL, dt, root);
}
KVPS_API kvps_result kvps_ring_scatterv(kvps_ring *r, const void *send, const size_t *counts, const size_t *displs,
                                        void *recv, kvps_dtype dt, int root) {
    return kvps_ring__callv(r, KVPS_COLL_SCATTERV, send, counts, displs, recv, NULL, NULL, dt, root);
}
KVPS_API kvps_result kvps_ring_alltoallv(kvps_ring *r, const void *send, const size_t *send_counts,
                                         const size_t *send_displs, void *recv, const size_t *recv_counts,
                                         const size_t *recv_displs, kvps_dtype dt) {
    return kvps_ring__callv(r, KVPS_COLL_ALLTOALLV, send, send_counts, send_displs, recv, recv_counts, recv_displs, dt, 0);
}

// >>join
/* Join (manual section 11). On a ring made with .join every collective is preceded by an
   agreement: an all-reduce (RD, int64 max) of [a flag per rank: joined][the collective's
   parameters][their negations]. A joined rank gives its flag and max's identity, every other
   rank its parameters, so every rank learns from the same bits who has joined and what the
   others call (and whether they agree: max == -max of the negations), and decides alike: a
   joined rank runs that collective with op's identity as its input; AVG divides by the ranks
   that have not joined; a collective a joined rank cannot shadow fails on every rank with the
   same words before any of its data moves; once every rank has joined, kvps_ring_join returns
   on every rank. The cost: one small RD all-reduce per collective, only on rings made with .join. */
static const char *const kvps_ring__join_names[KVPS_RING__JOIN_NP] = {"collective", "dtype", "wire", "op", "count", "root",
                                                                     "algorithm", "list layout"};

/* The parameters a joined rank needs to run op as the others do (0 where the collective has none). */
static void kvps_ring__join_params(const kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list, int64_t *p) {
    memset(p, 0, KVPS_RING__JOIN_NP * sizeof *p);
    p[0] = op->coll;
    if (op->coll == KVPS_COLL_BARRIER) return; /* (its other fields are not read) */
    p[1] = op->dtype;
    p[2] = op->coll == KVPS_COLL_ALLREDUCE ? op->wire : 0;
    p[3] = op->op;
    p[4] = (int64_t)op->count;
    p[5] = op->root;
    p[6] = op->coll == KVPS_COLL_ALLREDUCE ? (op->algo ? op->algo : r->desc.algo) : 0;
    p[7] = list ? list->layout : 0;
}

/* The agreement before a collective (op NULL: this rank has joined). Sets join_live and join_vec. */
static kvps_result kvps_ring__join_agree(kvps_ring *r, const kvps_ring_op *op, const kvps_ring__list *list) {
    int k = r->size, np = KVPS_RING__JOIN_NP;
    size_t m = (size_t)k + 2 * (size_t)np;
    if (!r->join_vec && !(r->join_vec = (int64_t *)malloc(m * sizeof *r->join_vec))) return KVPS_ERR_NOMEM;
    int64_t *v = r->join_vec, p[KVPS_RING__JOIN_NP];
    if (op) kvps_ring__join_params(r, op, list, p);
    for (int i = 0; i < k; i++) v[i] = i == r->rank && !op;
    for (int j = 0; j < np; j++) {
        v[k + j] = op ? p[j] : INT64_MIN;
        v[k + np + j] = op ? -p[j] : INT64_MIN;
    }
    kvps_ring_op a;
    memset(&a, 0, sizeof a);
    a.coll = KVPS_COLL_ALLREDUCE;
    a.recv = v;
    a.count = m;
    a.dtype = KVPS_INT64;
    a.op = KVPS_MAX;
    a.algo = KVPS_ALGO_RD;
    r->join_agreeing = 1;
    kvps_result rc = kvps_ring__run_one(r, &a, NULL);
    r->join_agreeing = 0;
    r->join_live = 0;
    for (int i = 0; rc == KVPS_OK && i < k; i++) r->join_live += !v[i];
    return rc;
}

/* Whether the ranks that have not joined passed the same parameters (-1), else the first that differs. */
static int kvps_ring__join_differs(const kvps_ring *r) {
    const int64_t *hi = r->join_vec + r->size, *neg = hi + KVPS_RING__JOIN_NP;
    for (int j = 0; j < KVPS_RING__JOIN_NP; j++)
        if (hi[j] != -neg[j]) return j;
    return -1;
}

/* The verdict, the same on every rank (from the agreement's bits alone): whether the running
   collective can go on with the ranks that have joined shadowing it. */
static kvps_result kvps_ring__join_check(kvps_ring *r) {
    int k = r->size;
    if (r->join_live >= k) return KVPS_OK;
    const int64_t *v = r->join_vec, *hi = v + k;
    char who[128] = "";
    for (int i = 0, n = 0; i < k && n < 110; i++)
        if (v[i]) n += snprintf(who + n, sizeof who - (size_t)n, "%s%d", n ? " " : "", i);
    int j = kvps_ring__join_differs(r);
    if (j >= 0)
        return kvps_ring__fail(r, KVPS_ERR_MISMATCH, "rank %d: the ranks that have not joined called different collectives "
                               "(%s from %lld to %lld) while rank(s) %s had joined", r->rank, kvps_ring__join_names[j],
                               (long long)-hi[KVPS_RING__JOIN_NP + j], (long long)hi[j], who);
    if (hi[0] != KVPS_COLL_ALLREDUCE && hi[0] != KVPS_COLL_BARRIER)
        return kvps_ring__fail(r, KVPS_ERR_STATE, "rank %d: %s called while rank(s) %s had joined (kvps_ring_join): a "
                               "joined rank takes part only in allreduce and barrier", r->rank,
                               kvps_coll_name((kvps_coll)hi[0]), who);
    if (hi[7])
        return kvps_ring__fail(r, KVPS_ERR_STATE, "rank %d: an all-reduce over a list of buffers (kvps_ring_allreduce_many) "
                               "called while rank(s) %s had joined (kvps_ring_join): a joined rank takes part only in "
                               "allreduce of one buffer and barrier", r->rank, who);
    return KVPS_OK;
}

KVPS_API kvps_result kvps_ring_join(kvps_ring *r) {
    if (!r) return KVPS_ERR_INVALID_ARG;
    if (r->desc.join <= 0)
        return kvps_ring__fail(r, KVPS_ERR_INVALID_ARG, "rank %d: kvps_ring_join needs a ring made with .join = 1 (its "
                               "collectives then agree on who has joined)", r->rank);
    kvps_ring__hold(r->fam); /* (posted operations run first) */
    kvps_result rc;
    for (;;) {
        rc = kvps_ring__join_agree(r, NULL, NULL);
        if (rc != KVPS_OK || r->join_live == 0) break; /* an error, or every rank has joined */
        const int64_t *p = r->join_vec + r->size; /* what the others call (the maxima) */
        kvps_ring_op op;
        memset(&op, 0, sizeof op);
        op.coll = (kvps_coll)p[0];
        if (op.coll == KVPS_COLL_ALLREDUCE && kvps_ring__join_differs(r) < 0 && !p[7]) {
            op.dtype = (kvps_dtype)p[1];
            op.wire = (kvps_dtype)p[2];
            op.op = (kvps_redop)p[3];
            op.count = (size_t)p[4];
            op.algo = (kvps_ring_algo)p[6];
            op.recv = &op; /* (a stand-in until the count is known to be sane: validate wants a buffer) */
            if (kvps_ring__validate(r, &op) != KVPS_OK || p[4] < 0) { /* (what the peers sent is checked before use) */
                rc = kvps_ring__fail(r, KVPS_ERR_MALFORMED, "rank %d: the agreement before collective #%u names no valid "
                                     "all-reduce (dtype %lld, wire %lld, op %lld, count %lld, algorithm %lld)", r->rank,
                                     r->seq + 1, (long long)p[1], (long long)p[2], (long long)p[3], (long long)p[4],
                                     (long long)p[6]);
                r->broken = 1;
                break;
            }
            op.recv = kvps_ring__grow(&r->join_buf, &r->join_cap, op.count * kvps_dtype_size(op.dtype));
            if (op.count && !op.recv) { rc = KVPS_ERR_NOMEM; break; }
            kvps_ring__identity(op.recv, op.count, op.dtype, op.op);
        } else if (op.coll != KVPS_COLL_BARRIER) {
            op.coll = KVPS_COLL_BARRIER; /* (refused by the verdict before anything moves: kvps_ring__join_check) */
        }
        rc = kvps_ring__run_one(r, &op, NULL);
        if (rc != KVPS_OK) break;
    }
    kvps_ring__release(r->fam);
    return rc;
}

KVPS_API int kvps_ring_joined(const kvps_ring *r, int *ranks, int max) {
    int n = 0;
    for (int i = 0; r && r->join_vec && i < r->size; i++) {
        if (!r->join_vec[i]) continue;
        if (ranks && n < max) ranks[n] = i;
        n++;
    }
    return n;
}

// >>setup
/* What every ring has of its own, the family's first ring and a sub-ring alike: the zero-copy
   block, the views and blocks, p2p state; size and rank set, desc copied (groups: a copy). */
static kvps_result kvps_ring__init_own(kvps_ring *r, const int *groups) {
    size_t k = (size_t)r->size;
    r->zc = kvps_ring__zc_new();
    r->view_buf = (int *)calloc(k * 3, sizeof *r->view_buf);
    r->blocks = (size_t *)calloc(k * 4, sizeof *r->blocks);
    r->root_rank = (int *)calloc(k, sizeof *r->root_rank);
    r->p2p_in_tail = &r->p2p_in;
    r->held_tail = &r->held;
    r->p2p_eager = KVPS_RING__P2P_EAGER_MAX;
    r->p2p_sent = (uint32_t *)calloc(k, sizeof *r->p2p_sent);
    r->p2p_next = (uint32_t *)malloc(k * sizeof *r->p2p_next);
    r->p2p_gone = (unsigned char *)calloc(k, 1);
    for (size_t i = 0; r->p2p_next && i < k; i++) r->p2p_next[i] = 1; /* messages are numbered from 1 */
    r->desc.groups = NULL;
    if (groups) {
        int *g = (int *)malloc(k * sizeof *g);
        if (g) memcpy(g, groups, k * sizeof *g);
        r->desc.groups = g;
    }
    return !r->zc || !r->view_buf || !r->blocks || !r->root_rank || (groups && !r->desc.groups) || !r->p2p_sent ||
                   !r->p2p_next || !r->p2p_gone
               ? KVPS_ERR_NOMEM
               : KVPS_OK;
}

static kvps_ring__fam *kvps_ring__fam_new(int size, int me) {
    kvps_ring__fam *f = (kvps_ring__fam *)calloc(1, sizeof *f);
    if (!f) return NULL;
    f->dealers = (void **)calloc((size_t)size, sizeof *f->dealers);
    f->mons = (void **)calloc((size_t)size, sizeof *f->mons);
    f->peers = (kvps_ring__peer *)calloc((size_t)size, sizeof *f->peers);
    if (!f->dealers || !f->mons || !f->peers) { free(f->dealers); free(f->mons); free(f->peers); free(f); return NULL; }
    f->me = me;
    f->ready_tail = &f->ready;
    f->bell_rx = f->bell_tx = f->tcp_fd = -1;
    for (int i = 0; i < size; i++) f->peers[i].tfd = -1;
    f->items = (zmq_pollitem_t *)calloc((size_t)size + 4 + KVPS_RING__TCP_PEND, sizeof *f->items);
    f->item_peer = (int *)calloc((size_t)size + 4 + KVPS_RING__TCP_PEND, sizeof *f->item_peer);
    f->pfds = (struct pollfd *)calloc((size_t)size, sizeof *f->pfds);
    if (!f->items || !f->item_peer || !f->pfds) {
        free(f->items); free(f->item_peer); free(f->pfds); free(f->dealers); free(f->mons); free(f->peers); free(f);
        return NULL;
    }
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->size = size;
    f->next_ring = 1;
    f->orphans_tail = &f->orphans;
    return f;
}

static void kvps_ring__fifo_free(kvps_ring__stash **head) {
    while (*head) { kvps_ring__stash *e = *head; *head = e->next; zmq_msg_close(&e->payload); free(e); }
}

/* The failure of a call that has no ring to keep it (kvps_ring_create, kvps_ring_env_read; a
   kvps_ring_connect's too): its words, per thread, for kvps_ring_last_error(NULL), and logged. */
static KVPS__TLS char kvps_ring__errbuf[512];
static kvps_result kvps_ring__noring(kvps_result rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kvps_ring__errbuf, sizeof kvps_ring__errbuf, fmt, ap);
    va_end(ap);
    kvps__log(KVPS_LOG_ERROR, "%s", kvps_ring__errbuf);
    return rc;
}

KVPS_API kvps_result kvps_ring_create(const kvps_ring_desc *desc, kvps_ring **out) {
    if (!desc || !out) return kvps_ring__noring(KVPS_ERR_INVALID_ARG, "kvps_ring_create: %s is NULL", desc ? "out" : "desc");
    *out = NULL;
    kvps_ring__errbuf[0] = 0;
    if (!kvps__io_cpus_ok(desc->zmq_ctx, desc->io_cpus, "ring"))
        return kvps_ring__noring(KVPS_ERR_CONFIG, "kvps_ring_create: io_cpus '%s' cannot be used (the log says why)",
                                 desc->io_cpus ? desc->io_cpus : "");
    if (desc->size < 1 || desc->size > 65535 || desc->rank < 0 || desc->rank >= desc->size)
        return kvps_ring__noring(KVPS_ERR_CONFIG, "kvps_ring_create: rank %d and size %d: need 0 <= rank < size <= 65535",
                                 desc->rank, desc->size);
    if (desc->timeout_ms < 0 || desc->peer_timeout_ms < 0 || desc->stall_ms < -1 || (unsigned)desc->algo >= KVPS_ALGO_COUNT ||
        (!desc->peers && !desc->bind))
        return kvps_ring__noring(KVPS_ERR_CONFIG, "kvps_ring_create: %s", desc->timeout_ms < 0 ? "timeout_ms is negative"
                                 : desc->peer_timeout_ms < 0 ? "peer_timeout_ms is negative"
                                 : desc->stall_ms < -1 ? "stall_ms is below -1 (-1: off)"
                                 : (unsigned)desc->algo >= KVPS_ALGO_COUNT ? "algo is no kvps_ring_algo"
                                                                           : "neither peers nor bind is given");
    kvps__tune_malloc(0);
    kvps_ring *r = (kvps_ring *)calloc(1, sizeof *r);
    if (!r) return kvps_ring__noring(KVPS_ERR_NOMEM, "kvps_ring_create: out of memory");
    r->desc = *desc;
    r->desc.timeout_ms = desc->timeout_ms; /* 0: no deadline (kvps_ring__dl) */
    r->desc.stall_ms = kvps__def(desc->stall_ms, 60000);
    r->desc.peer_timeout_ms = kvps__def(desc->peer_timeout_ms, 5000);
    r->desc.chunk_bytes = kvps__def(desc->chunk_bytes, (size_t)1 << 20);
    r->desc.small_bytes = kvps__def(desc->small_bytes, (size_t)512 << 10);
    r->rank = desc->rank;
    r->size = desc->size;
    r->fam = kvps_ring__fam_new(r->size, r->rank);
    if (!r->fam) { free(r); return kvps_ring__noring(KVPS_ERR_NOMEM, "kvps_ring_create: out of memory"); }
    r->fam->rings = r;
    r->fam->refs = 1;
    if (kvps_ring__init_own(r, desc->groups) != KVPS_OK) {
        kvps_ring_destroy(&r);
        return kvps_ring__noring(KVPS_ERR_NOMEM, "kvps_ring_create: out of memory");
    }
    for (int i = 0; i < r->size; i++) r->root_rank[i] = i;
    r->desc.peers = NULL;
    kvps_ring__fam *f = r->fam;
    kvps_result crc = kvps__ctx_take(desc->zmq_ctx, desc->io_threads, &r->desc.io_cpus, &f->ctx, &f->own_ctx);
    if (crc != KVPS_OK) {
        kvps_ring_destroy(&r);
        return kvps_ring__noring(crc, "kvps_ring_create: no ZeroMQ context: %s", kvps_result_str(crc));
    }
    char **eps = NULL;
    int neps = 0;
    const char *bind = desc->bind;
    if (!bind) {
        neps = kvps__split(desc->peers, &eps);
        if (neps != r->size) {
            kvps__free_strv(eps, neps > 0 ? neps : 0);
            kvps_ring_destroy(&r);
            return kvps_ring__noring(KVPS_ERR_CONFIG, "kvps_ring_create: %d endpoints in peers for %d ranks", neps > 0 ? neps : 0,
                                     desc->size);
        }
        bind = eps[r->rank];
    }
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    int zero = 0;
    kvps_result rc = KVPS_OK;
    if (!f->router) rc = KVPS_ERR_ZMQ;
    else {
        zmq_setsockopt(f->router, ZMQ_RCVHWM, &zero, sizeof zero);
        zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
        if (kvps__zmq_bind(f->router, bind) != 0) {
            rc = kvps_ring__noring(KVPS_ERR_BIND, "kvps_ring_create: ring rank %d cannot bind its endpoint '%s': %s", r->rank,
                                   bind, zmq_strerror(zmq_errno()));
        } else {
            size_t sz = sizeof r->endpoint;
            if (zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, r->endpoint, &sz) != 0)
                snprintf(r->endpoint, sizeof r->endpoint, "%s", bind);
        }
    }
    kvps__free_strv(eps, neps);
    if (rc == KVPS_OK) rc = kvps_ring__tl_create(r, desc);
    f->tl = r->tl;
    if (rc == KVPS_OK && desc->peers) rc = kvps_ring_connect(r, desc->peers);
    if (rc != KVPS_OK && !kvps_ring__errbuf[0])
        kvps_ring__noring(rc, "kvps_ring_create: ring rank %d: %s", desc->rank, kvps_result_str(rc));
    if (rc != KVPS_OK) { kvps_ring_destroy(&r); return rc; }
    *out = r;
    return KVPS_OK;
}

KVPS_API const char *kvps_ring_endpoint(const kvps_ring *r) { return r ? r->endpoint : NULL; }
KVPS_API const char *kvps_ring_last_error(const kvps_ring *r) { return r ? r->errmsg : kvps_ring__errbuf; }
KVPS_API int kvps_ring_rank(const kvps_ring *r) { return r ? r->rank : -1; }
KVPS_API const char *kvps_ring_transport(const kvps_ring *r, int rank) {
    if (!r || rank < 0 || rank >= r->size) return "?";
    if (rank == r->rank) return "self";
    const kvps_ring__fam *f = r->fam;
    const kvps_ring__peer *q = f->peers && !f->closed ? &f->peers[r->root_rank[rank]] : NULL;
    int out = q ? q->out : 0;
    return out == 1 ? "shm" : out == 2 || (q && q->twait) ? "tcp" : "zmq"; /* (twait: its connection is on its way) */
}
KVPS_API int kvps_ring_size(const kvps_ring *r) { return r ? r->size : 0; }

/* Whether a tcp:// endpoint names this host's loopback (its peer is on this machine, no link). */
static int kvps_ring__loopback(const char *ep) {
    if (strncmp(ep, "tcp://", 6) != 0) return 0;
    const char *h = ep + 6;
    return strncmp(h, "127.", 4) == 0 || strncmp(h, "localhost:", 10) == 0 || strncmp(h, "[::1]:", 6) == 0;
}

/* SO_SNDBUF for the connection to a peer at ep (manual section 4); 0: the OS's autotuning. */
static int kvps_ring__sndbuf(const kvps_ring_desc *d, const char *ep) {
    if (d->sndbuf_bytes) return d->sndbuf_bytes > 0 ? d->sndbuf_bytes : 0;
    return kvps_ring__loopback(ep) ? 256 << 10 : 0;
}

KVPS_API kvps_result kvps_ring_connect(kvps_ring *r, const char *peers) {
    if (!r || !peers) return KVPS_ERR_INVALID_ARG;
    if (r->connected || r->id) return KVPS_ERR_STATE; /* (a sub-ring is connected from the start) */
    char **eps = NULL;
    int n = kvps__split(peers, &eps);
    if (n != r->size) {
        kvps__free_strv(eps, n > 0 ? n : 0);
        return kvps_ring__noring(KVPS_ERR_CONFIG, "kvps_ring_connect: ring rank %d: %d endpoints for %d ranks in '%.200s'",
                                 r->rank, n > 0 ? n : 0, r->size, peers);
    }
    kvps_result rc = KVPS_OK;
    for (int i = 0; i < n && rc == KVPS_OK; i++) {
        if (i == r->rank) continue;
        void *s = zmq_socket(r->fam->ctx, ZMQ_DEALER);
        if (!s) { rc = KVPS_ERR_ZMQ; break; }
        int zero = 0, sndbuf = kvps_ring__sndbuf(&r->desc, eps[i]);
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        if (sndbuf > 0) zmq_setsockopt(s, ZMQ_SNDBUF, &sndbuf, sizeof sndbuf);
        r->fam->dealers[i] = s;
        /* liveness: heartbeats, and a monitor that sees the connection drop (inproc has neither) */
        if (strncmp(eps[i], "inproc://", 9) != 0) {
            kvps__heartbeats(s, r->desc.peer_timeout_ms / 5 > 0 ? r->desc.peer_timeout_ms / 5 : 1, r->desc.peer_timeout_ms);
            if (kvps__monitor(r->fam->ctx, s, ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED |
                              ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, &r->fam->mons[i]) != 0)
                r->fam->mons[i] = NULL; /* (only a dead peer's drop goes unseen: its pid or connection may still tell) */
        }
        kvps_ring__peer *q = &r->fam->peers[i]; /* (for its own TCP connection, >>tcp) */
        if (kvps_ring__tcp_host(eps[i], q->thost, sizeof q->thost) != 0) q->thost[0] = 0;
        q->tsndbuf = sndbuf;
        char why[400];
        if (!kvps__endpoint_resolves(eps[i], why, sizeof why))
            kvps__log(KVPS_LOG_WARN, "ring rank %d: rank %d's endpoint '%.200s': %s; trying on (a name that appears later is "
                      "used)", r->rank, i, eps[i], why);
        if (zmq_connect(s, eps[i]) != 0)
            rc = kvps_ring__noring(KVPS_ERR_CONNECT, "kvps_ring_connect: ring rank %d cannot connect to rank %d at '%.200s': %s",
                                   r->rank, i, eps[i], zmq_strerror(zmq_errno()));
    }
    kvps__free_strv(eps, n);
    if (rc == KVPS_OK) r->connected = 1;
    if (rc == KVPS_OK) kvps_ring__x_hello(r); /* its segment and its hello to every peer (>>transport) */
    return rc;
}

/* The family's first ring: its thread stopped (what was posted runs first, on any ring), its
   sockets flushed and closed. Sub-rings still alive answer KVPS_ERR_STATE from now on. */
static void kvps_ring__close_family(kvps_ring *r) {
    kvps_ring__fam *f = r->fam;
    if (f->thread_started) {
        pthread_mutex_lock(&f->mu);
        f->quit = 1;
        pthread_cond_broadcast(&f->cv);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
        f->thread_started = 0;
    }
    /* a healthy ring flushes what it still has queued: a peer may still be connecting, and
       with no linger ZeroMQ would drop its last piece (that peer then times out) */
    int linger = r->broken ? 200 : (r->desc.timeout_ms > 0 && r->desc.timeout_ms < 5000 ? r->desc.timeout_ms : 5000); /* (a broken
       ring still gets its abort notices out, but does not wait long for peers that are gone) */
    for (int i = 0; i < f->size; i++)
        if (f->dealers[i]) {
            int zero = 0; /* a peer sent only the hello (and maybe NOSHM) needs none of it any more */
            zmq_setsockopt(f->dealers[i], ZMQ_LINGER, f->peers[i].zsent ? &linger : &zero, sizeof linger);
            zmq_close(f->dealers[i]);
            f->dealers[i] = NULL;
        }
    if (f->router) zmq_close(f->router);
    f->router = NULL;
    for (int i = 0; i < f->size; i++)
        if (f->mons[i]) { zmq_close(f->mons[i]); f->mons[i] = NULL; }
    if (f->own_ctx && f->ctx) zmq_ctx_term(f->ctx);
    f->ctx = NULL;
    f->closed = 1;
    kvps_ring__x_close(f);
}

KVPS_API void kvps_ring_destroy(kvps_ring **rp) {
    if (!rp || !*rp) return;
    kvps_ring *r = *rp;
    kvps_ring__fam *f = r->fam;
    *rp = NULL;
    if (r->id == 0) kvps_ring__close_family(r);
    else kvps_ring__hold(f); /* its posted operations run first; nobody reads for it after */
    for (kvps_ring **pp = &f->rings; *pp; pp = &(*pp)->fam_next)
        if (*pp == r) { *pp = r->fam_next; break; }
    kvps_ring__fifo_free(&r->stash);
    kvps_ring__fifo_free(&r->p2p_in);
    kvps_ring__fifo_free(&r->held);
    while (r->p2p_reqs) kvps_ring__p2p_unlink(r, r->p2p_reqs);
    pthread_mutex_lock(&f->mu);
    for (kvps_ring__job **pp = &f->finished; *pp;) { /* results never waited for */
        kvps_ring__job *j = *pp;
        if (j->ring == r) { *pp = j->next; free(j); }
        else pp = &j->next;
    }
    if (r->id) f->busy = 0;
    int last = --f->refs == 0;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    if (r->zc) kvps_ring__zc_unref(r->zc);
    free((void *)(uintptr_t)r->desc.groups);
    free(r->view_buf); free(r->blocks); free(r->root_rank); free(r->up); free(r->work); free(r->scratch); free(r->direct);
    free(r->join_vec); free(r->join_buf);
    free(r->p2p_sent); free(r->p2p_next); free(r->p2p_gone);
    free(r);
    if (!last) return;
    if (f->tl) { kvps__tl_close(&f->tl->w); free(f->tl); }
    kvps_ring__fifo_free(&f->orphans);
    while (f->head) { kvps_ring__job *j = f->head; f->head = j->next; free(j); }
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f->dealers);
    free(f->mons);
    free(f->peers);
    free(f->items);
    free(f->item_peer);
    free(f->pfds);
    free(f);
}

/* Sub-ring `id` of r with r's ranks members[0..k) in order (this rank is members[me]): it
   shares r's family, and takes the messages its peers sent before this rank made it. */
static kvps_result kvps_ring__sub_new(kvps_ring *r, const int *members, int k, int me, uint32_t id, int colour,
                                      kvps_ring **out) {
    kvps_ring *s = (kvps_ring *)calloc(1, sizeof *s);
    if (!s) return KVPS_ERR_NOMEM;
    s->desc = r->desc;
    s->rank = me;
    s->size = k;
    s->fam = r->fam;
    s->id = id;
    s->parent_id = r->id;
    s->colour = colour;
    s->tl = r->tl;
    s->connected = 1;
    memcpy(s->endpoint, r->endpoint, sizeof s->endpoint);
    int *groups = NULL;
    if (r->desc.groups && !(groups = (int *)malloc((size_t)k * sizeof *groups))) { free(s); return KVPS_ERR_NOMEM; }
    for (int i = 0; groups && i < k; i++) groups[i] = r->desc.groups[members[i]];
    kvps_result rc = kvps_ring__init_own(s, groups);
    free(groups);
    if (rc == KVPS_OK && !(s->up = (int *)malloc((size_t)k * sizeof *s->up))) rc = KVPS_ERR_NOMEM;
    for (int i = 0; rc == KVPS_OK && i < k; i++) {
        s->up[i] = members[i];
        s->root_rank[i] = r->root_rank[members[i]];
    }
    kvps_ring__fam *f = r->fam;
    pthread_mutex_lock(&f->mu);
    f->refs++;
    pthread_mutex_unlock(&f->mu);
    s->fam_next = f->rings;
    f->rings = s;
    if (rc != KVPS_OK) { kvps_ring__release(f); kvps_ring_destroy(&s); kvps_ring__hold(f); return rc; }
    for (kvps_ring__stash **pp = &f->orphans; *pp;) {
        kvps_ring__stash *e = *pp;
        if (e->h.ring != id) { pp = &e->next; continue; }
        kvps_ring__fifo_cut(pp, &f->orphans_tail);
        if (e->h.src < k) kvps_ring__deliver(s, &e->h, &e->payload);
        else zmq_msg_close(&e->payload);
        free(e);
    }
    *out = s;
    return KVPS_OK;
}

/* Each rank's (colour, key, proposed id) all-gathered over r; the members of this rank's
   colour ordered by (key, rank in r); the id the largest of their proposals, so above every id
   each member has used: messages are never taken for another ring of its family (section 9). */
KVPS_API kvps_result kvps_ring_split(kvps_ring *r, int colour, int key, kvps_ring **out) {
    if (!r || !out) return KVPS_ERR_INVALID_ARG;
    *out = NULL;
    kvps_ring__fam *f = r->fam;
    int k = r->size, n = 0, me = -1;
    int64_t *all = (int64_t *)malloc((size_t)k * 3 * sizeof *all);
    int *members = (int *)malloc((size_t)k * sizeof *members);
    if (!all || !members) { free(all); free(members); return KVPS_ERR_NOMEM; }
    kvps_ring__hold(f); /* one split at a time in a family: ids are proposed and taken under the hold */
    int64_t mine[3] = {colour < 0 ? -1 : colour, key, (int64_t)f->next_ring};
    kvps_ring_op op;
    memset(&op, 0, sizeof op);
    op.coll = KVPS_COLL_ALLGATHER;
    op.send = mine;
    op.recv = all;
    op.count = 3;
    op.dtype = KVPS_INT64;
    kvps_result rc = kvps_ring__run_now(r, &op, NULL);
    uint64_t id = 0;
    for (int i = 0; rc == KVPS_OK && colour >= 0 && i < k; i++) {
        if (all[3 * i] != colour) continue;
        int at = n++; /* insertion by (key, rank): i grows, so equal keys keep rank order */
        while (at > 0 && all[3 * members[at - 1] + 1] > all[3 * i + 1]) { members[at] = members[at - 1]; at--; }
        members[at] = i;
        if ((uint64_t)all[3 * i + 2] > id) id = (uint64_t)all[3 * i + 2];
    }
    if (rc == KVPS_OK && colour >= 0 && (id == 0 || id >= UINT32_MAX)) {
        rc = kvps_ring__fail(r, KVPS_ERR_MALFORMED, "split: a peer proposed sub-ring id %llu", (unsigned long long)id);
        r->broken = 1;
    }
    for (int i = 0; i < n; i++)
        if (members[i] == r->rank) me = i;
    if (rc == KVPS_OK && colour >= 0) {
        f->next_ring = (uint32_t)id + 1;
        if (id > f->max_ring) f->max_ring = (uint32_t)id;
        rc = kvps_ring__sub_new(r, members, n, me, (uint32_t)id, colour, out);
    }
    kvps_ring__release(r->fam);
    free(all);
    free(members);
    return rc;
}

// >>environment
/* The peers a rendezvous found (kvps_ring_env_read's *peers): valid until the next call. */
static char *kvps_ring__env_peers;
static pthread_mutex_t kvps_ring__env_mu = PTHREAD_MUTEX_INITIALIZER;

/* The rendezvous of kvps_launch.h for a ring: this rank's endpoint on the chosen card, a port
   reserved for it, the table joined into *peers. */
static kvps_result kvps_ring__env_meet(const kvps_launch *l, const char **peers) {
    char ip[64], ep[128];
    char **table = NULL;
    kvps_result rc = kvps__launch_bind_ip(l, ip, sizeof ip);
    if (rc == KVPS_OK) rc = kvps__reserve_port(ip, "ring", ep, sizeof ep);
    if (rc == KVPS_OK) rc = kvps__launch_meet(l, "ring", ep, &table);
    if (rc != KVPS_OK) return kvps_ring__noring(rc, "ring env: %s", kvps_launch_last_error());
    size_t len = 1;
    for (int i = 0; i < l->size; i++) len += strlen(table[i]) + 1;
    char *all = (char *)malloc(len);
    if (all) {
        all[0] = 0;
        for (int i = 0; i < l->size; i++) {
            if (!table[i][0]) { free(all); all = NULL; break; } /* every ring rank registers an endpoint */
            if (i) strcat(all, ",");
            strcat(all, table[i]);
        }
    }
    kvps__free_strv(table, l->size);
    if (!all) return kvps_ring__noring(KVPS_ERR_MALFORMED, "ring env: the rendezvous at %s gave a rank no endpoint (or no memory)",
                                       l->rendezvous);
    pthread_mutex_lock(&kvps_ring__env_mu);
    free(kvps_ring__env_peers);
    kvps_ring__env_peers = all;
    pthread_mutex_unlock(&kvps_ring__env_mu);
    *peers = all;
    return KVPS_OK;
}

KVPS_API kvps_result kvps_ring_env_read(int *rank, int *size, const char **peers) {
    if (!rank || !size || !peers) return kvps_ring__noring(KVPS_ERR_INVALID_ARG, "kvps_ring_env_read: a NULL argument");
    kvps_launch l;
    *peers = getenv("KVPS_RING_PEERS");
    if (kvps_launch_read(&l) != KVPS_OK) return kvps_ring__noring(KVPS_ERR_ENV, "ring env: %s", kvps_launch_last_error());
    *rank = l.rank;
    *size = l.size;
    if (*peers && **peers) return KVPS_OK;
    if (l.rendezvous[0]) return kvps_ring__env_meet(&l, peers);
    return kvps_ring__noring(KVPS_ERR_ENV, "ring env: KVPS_RING_PEERS is %s (rank %d of %d read from %s and %s) and no "
                             "rendezvous address is set: list every rank's endpoint in KVPS_RING_PEERS, in rank order, or give "
                             "MASTER_ADDR and MASTER_PORT (or KVPS_RENDEZVOUS=host:port)", *peers ? "empty" : "not set", *rank,
                             *size, l.rank_var, l.size_var);
}

#endif /* KVPS_RING__IMPLEMENTED */
#endif /* KVPS_IMPLEMENTATION */
