"""kvps.torch: kvps for PyTorch trainers, over the same ctypes library as kvps (nothing to compile).

    kvps.torch.ddp   a DDP communication hook that all-reduces each gradient bucket through a
                     kvps ring (kvps.torch.allreduce_hook), and a process group "kvps"
                     (registered on import: torch.distributed.init_process_group("kvps"))
    kvps.torch.ps    servers that hold the weights and run the optimizer
                     (kvps.torch.ServerOptimizer), and embedding bags whose tables live on the
                     servers (kvps.torch.EmbeddingBag)

Tensors go to kvps by their data pointers (contiguous CPU tensors), never copied on the way.
"""

from .ddp import RingState, allreduce_hook, init_process_group, ProcessGroupKvps  # noqa: E402,F401
from .ps import EmbeddingBag, ServerOptimizer  # noqa: E402,F401  (kvps.torch.ps)
