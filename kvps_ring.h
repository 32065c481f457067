/* kvps_ring.h - v0.0 - collectives among equal peers over ZeroMQ - MIT licence

   STATUS: API plan only. Nothing here is implemented yet (issue 3 fills it); including this
   header declares nothing and costs nothing.

   PLANNED API (see issue 3)
   A communicator made from a rank, a size and the peers' endpoints (desc struct, the KVPS_*
   environment as in kvps.h, or a kvps server acting as rendezvous), over tcp://, ipc:// or
   inproc://. Each operation blocking with a timeout, and non-blocking with a handle:
     kvps_ring_allreduce, _reduce, _reduce_scatter, _allgather, _broadcast, _gather, _scatter,
     _alltoall, _barrier
   dtypes f32, f64, i32, i64, f16/bf16 (reduced in f32); ops sum, prod, min, max, avg.
   Algorithms: pipelined ring (reduce-scatter + all-gather), bidirectional ring, recursive
   doubling for small messages, hierarchical by machine. Results and errors use kvps_result
   from kvps.h.
*/
#ifndef KVPS_RING_H
#define KVPS_RING_H
#include "kvps.h"
#endif
