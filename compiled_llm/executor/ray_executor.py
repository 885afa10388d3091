"""The Ray executor: the multiprocess executor's group with its follower ranks as Ray actors (a
local Ray cluster is started if none is connected; RAY_ADDRESS names one). Rank 0 stays in the
engine's process; each actor joins, loads its shard (or stage) and follows the driver's steps in
one long call; ranks use cuda:<rank> as with mp. A Ray connection made here ends with the last
engine on it (a local cluster's processes too); one the user made is kept."""

from __future__ import annotations

import os

from compiled_llm.config import EngineArgs
from compiled_llm.distributed.pipeline_parallel import ENV_PARTITION
from compiled_llm.executor.mp_executor import MultiprocExecutor, _kind
from compiled_llm.worker.worker import WorkerSpec

_LIVE: set[int] = set()  # the RayExecutors (ids) that started or hold actors
_CONNECTED_HERE: list[bool] = [False]  # whether ray.init was this module's call


class RankActor:
    """A follower rank inside a Ray actor: `start` joins and loads (returns the pid), then
    `follow` runs until the driver says stop."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, rank: int, init_method: str) -> None:
        self.args, self.spec, self.rank, self.init_method = args, spec, rank, init_method
        self.runner = self.tp = None

    def start(self) -> int:
        """Join the group and build this rank's runner; the process id."""
        import torch

        from compiled_llm.distributed.parallel_state import init_tp_group
        from compiled_llm.executor.mp_worker import rank_spec
        from compiled_llm.worker.worker import build_runner

        spec = rank_spec(self.spec, self.rank)
        self.tp = init_tp_group(self.rank, self.args.world_size, self.init_method, spec.device,
                                pipeline_size=self.args.pipeline_parallel_size)
        torch.manual_seed(self.args.seed)
        self.runner = build_runner(self.args, spec, self.tp)
        return os.getpid()

    def follow(self) -> None:
        """The driver's steps until stop; then free the rank and leave the group."""
        from compiled_llm.distributed.parallel_state import destroy_tp_group
        from compiled_llm.worker.tp_follower import follow

        follow(self.tp, self.runner)
        self.runner.shutdown()
        destroy_tp_group()


class _RayRank:
    """One follower as a Ray actor, with _Rank's interface (pid, exitcode, wait_ready, stop)."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec, rank: int, init_method: str) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
            _CONNECTED_HERE[0] = True
        self.name, self.pid, self._exit = f"rank {rank}", None, None
        self.kind = _kind(args)
        # an actor's process need not inherit this one's environment: the stages' split must
        # be the driver's
        env = {ENV_PARTITION: os.environ[ENV_PARTITION]} if ENV_PARTITION in os.environ else {}
        actor_cls = ray.remote(num_cpus=0)(RankActor).options(runtime_env={"env_vars": env})
        self.actor = actor_cls.remote(args, spec, rank, init_method)
        self.started = self.actor.start.remote()
        self.done = self.actor.follow.remote()  # runs once start has returned

    def wait_ready(self) -> None:
        """Block until the rank has loaded; RuntimeError with its error if it failed."""
        import ray

        try:
            self.pid = ray.get(self.started)
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"{self.kind} worker {self.name} failed to start: "
                               f"{exc}") from None

    @property
    def exitcode(self) -> int | None:
        """None while the actor follows; 0 once it stopped, 1 if it failed or died."""
        import ray

        if self._exit is None and ray.wait([self.done], timeout=0)[0]:
            try:
                ray.get(self.done)
                self._exit = 0
            except ray.exceptions.RayError:
                self._exit = 1
        return self._exit

    def stop(self, seconds: float) -> None:
        """Wait for the actor's loop to end, then end the actor."""
        import ray

        ray.wait([self.done], timeout=seconds)
        ray.kill(self.actor)


class RayExecutor(MultiprocExecutor):
    """MultiprocExecutor with Ray actors for ranks 1..N-1."""

    rank_cls = _RayRank

    def __init__(self, args: EngineArgs, spec: WorkerSpec) -> None:
        _LIVE.add(id(self))
        try:
            super().__init__(args, spec)
        except BaseException:  # super() stopped what it started; a refusal before that too
            _leave_ray(self)
            raise

    def shutdown(self) -> None:
        """MultiprocExecutor's shutdown (actors ended), then leave a Ray instance this module
        connected to once no other engine uses it: a local one started for the engine would
        otherwise keep its raylet, GCS and dashboard processes until the interpreter exits."""
        super().shutdown()
        _leave_ray(self)


def _leave_ray(executor: RayExecutor) -> None:
    """Forget executor; the last one out shuts down the Ray connection made here."""
    _LIVE.discard(id(executor))
    if _LIVE or not _CONNECTED_HERE[0]:
        return
    import ray

    _CONNECTED_HERE[0] = False
    ray.shutdown()
