"""The model loaded before the engine is built (on by default; COMPILED_LLM_EARLY_LOAD=0 turns
it off): an engine core process loads it once it has its arguments while a thread imports the
compiler, and its worker takes it when loaded with the worker's settings. Lone workers only; a
failed early load is left to the worker's own load."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch
from torch import nn

from compiled_llm.config import EngineArgs
from compiled_llm.worker.spec import WorkerSpec

logger = logging.getLogger(__name__)


@dataclass
class EarlyModel:
    """A model loaded ahead of its worker, with the settings it was loaded for."""

    key: tuple
    model: nn.Module
    baseline: int  # device memory allocated before it loaded (the KV budget's baseline)
    seconds: float


# what building the core imports besides the loader: the engine, the compiler and its pass
# manager (Inductor's pattern matcher and lowerings), which the runner imports on first use
COMPILER_MODULES = ("compiled_llm.compile", "compiled_llm.engine.core",
                    "compiled_llm.passes.manager", "torch._inductor.compile_fx")
_loaded: list[EarlyModel] = []  # this process's early model until its worker takes it


def load_key(args: EngineArgs, spec: WorkerSpec) -> tuple | None:
    """What load_model is called with for (args, spec) by a lone worker, or None where the
    worker loads otherwise (tensor or pipeline parallel ranks, another executor)."""
    if args.world_size != 1 or args.executor_backend != "uni":
        return None
    return (spec.model_dir, spec.dtype, str(spec.device), spec.scheduler.max_model_len,
            args.load_format, args.quantization)


def import_loader() -> None:
    """Import what load_model imports (no compiler), so that an early load beside
    BackgroundImports imports little more than the model's own module."""
    import safetensors  # noqa: F401

    import compiled_llm.quantization.fp8  # noqa: F401
    import compiled_llm.quantization.loading  # noqa: F401
    import compiled_llm.quantization.w4a16  # noqa: F401
    import compiled_llm.worker.fuse_weights  # noqa: F401
    import compiled_llm.worker.loader  # noqa: F401
    import compiled_llm.worker.shared_overlap  # noqa: F401
    import compiled_llm.worker.weight_reader  # noqa: F401


def load_early(args: EngineArgs, spec: WorkerSpec) -> None:
    """Load args' model now for the worker to take. Any failure is left for the worker's own
    load to raise."""
    from compiled_llm.worker.loader import load_model

    started = time.perf_counter()
    try:
        key = load_key(args, spec)
        if key is None:
            return
        baseline = _allocated(spec.device)
        model = load_model(spec.model_dir, spec.dtype, spec.device,
                           spec.scheduler.max_model_len, args.load_format, args.quantization)
    except Exception as exc:  # the worker loads again and raises it where it belongs
        logger.info("early weight load skipped: %s", str(exc).splitlines()[0] if str(exc)
                    else type(exc).__name__)
        return
    _loaded.append(EarlyModel(key, model, baseline, time.perf_counter() - started))


def take(args: EngineArgs, spec: WorkerSpec) -> EarlyModel | None:
    """The model loaded early for exactly these settings (taken: a second call gets None);
    one loaded for other settings is freed."""
    early = _loaded.pop() if _loaded else None
    if early is not None and early.key != load_key(args, spec):
        logger.info("early weight load unused: loaded for %s", early.key)
        early = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return early


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


class BackgroundImports:
    """Modules imported on a thread (the compiler's, while the weights load); join() waits
    and, if the thread failed, imports them here so that the real error is raised."""

    def __init__(self, *modules: str) -> None:
        self.modules, self.failed = modules, False
        self.thread = threading.Thread(target=self._run, name="imports", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import importlib

        try:
            for name in self.modules:
                importlib.import_module(name)
        except BaseException:  # noqa: BLE001 (join() repeats it where it can be raised)
            self.failed = True

    def join(self) -> None:
        """Wait for the imports; repeat any that failed in this thread."""
        import importlib

        self.thread.join()
        if self.failed:
            for name in self.modules:
                importlib.import_module(name)
