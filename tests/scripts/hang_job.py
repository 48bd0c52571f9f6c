"""Two ranks (gloo) where rank 1 never enters the all-reduce that rank 0
waits in: a hang, for `--hang-after` and `gpuprof dump`.

    torchrun --nproc-per-node 2 hang_job.py
"""

import time

import torch
import torch.distributed as dist


def rank1_never_reduces():
    time.sleep(3600)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    print(f"rank {rank} ready", flush=True)
    if rank == 0:
        dist.all_reduce(torch.ones(4))
    else:
        rank1_never_reduces()


if __name__ == "__main__":
    main()
