"""A follower rank's process (`python -m compiled_llm.executor.mp_worker`): its arguments come
pickled on stdin from the engine's process (no re-import of the user's __main__, as
multiprocessing's spawn would do); it joins the group, loads its shard, reports on the status
pipe, then follows the driver's steps until told to stop."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import traceback

import torch

from compiled_llm.compat import forget_inherited_compile_pools
from compiled_llm.core.gc_heap import freeze_startup_heap, thaw_heap
from compiled_llm.distributed.parallel_state import destroy_tp_group, init_tp_group
from compiled_llm.worker.tp_follower import follow
from compiled_llm.worker.worker import WorkerSpec, build_runner


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank r's device: cuda:r on CUDA (one GPU per rank), the CPU otherwise."""
    return torch.device("cuda", rank) if device.type == "cuda" else device


def rank_spec(spec: WorkerSpec, rank: int) -> WorkerSpec:
    """spec on rank r's device."""
    return WorkerSpec(spec.model_dir, spec.dtype, rank_device(spec.device, rank), spec.scheduler)


def run_worker(args, spec: WorkerSpec, rank: int, init_method: str, status_fd: int) -> None:
    """Join, load, report "ready" (or the error) on status_fd, then follow the driver."""
    forget_inherited_compile_pools()  # forked on CPU: the parent's compile threads are gone
    with os.fdopen(status_fd, "wb", buffering=0) as status:
        try:
            spec = rank_spec(spec, rank)
            tp = init_tp_group(rank, args.world_size, init_method, spec.device,
                                pipeline_size=args.pipeline_parallel_size)
            torch.manual_seed(args.seed)
            runner = build_runner(args, spec, tp)
        except BaseException:
            status.write(pickle.dumps(("error", traceback.format_exc())))
            raise
        freeze_startup_heap()
        status.write(pickle.dumps(("ready", None)))
    try:
        follow(tp, runner)
    except RuntimeError as exc:  # the driver's process went away without a stop message
        logging.getLogger(__name__).warning("rank %d: the driver is gone (%s)", rank, exc)
        sys.exit(1)
    runner.shutdown()
    destroy_tp_group()
    thaw_heap()


def main() -> None:
    """The process's entry: arguments from stdin, then run_worker."""
    args, spec, rank, init_method, status_fd, path = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s tp-rank-{rank} %(message)s")
    sys.path[:] = path
    run_worker(args, spec, rank, init_method, status_fd)


if __name__ == "__main__":
    main()
