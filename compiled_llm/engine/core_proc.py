"""The engine core's own process: a busy loop of take requests, schedule, launch, collect, send
outputs, over two ZMQ sockets (requests in, outputs out; msgpack frames, pickle only for new
requests and utility results). It exits on a shutdown message, or when its parent is gone.
core_multi is the core that several front ends share."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable

import msgpack
import zmq

from compiled_llm.config import EngineArgs
from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.core.gc_heap import freeze_startup_heap, thaw_heap
from compiled_llm.engine.startup import format_age, process_age_s
from compiled_llm.worker.spec import WorkerSpec

logger = logging.getLogger(__name__)
IDLE_POLL_MS = 1000  # how often an idle core checks that its parent is alive
GRAMMAR_POLL_MS = 1  # while only compiling grammars wait: sleep briefly rather than spin

# message kinds, front end -> core
ADD, ABORT, FINISH, CALL, SHUTDOWN = "add", "abort", "finish", "call", "shutdown"
# core -> front end
READY, FAILED, OUTPUTS, REPLY = "ready", "failed", "outputs", "reply"


def pack(kind: str, payload) -> bytes:
    """One message frame."""
    return msgpack.packb((kind, payload), use_bin_type=True)


def unpack(frame: bytes) -> tuple[str, object]:
    """(kind, payload) of a message frame."""
    kind, payload = msgpack.unpackb(frame, raw=False)
    return kind, payload


def run_engine_core(args: EngineArgs, spec: WorkerSpec, eos_token_ids: tuple[int, ...],
                    addresses: list[tuple[str, str]], parent_pid: int) -> None:
    """The core process's main: build the core, report ready (or the start-up error) to its
    front end (addresses: its one (inbox, outbox) pair), then serve until shut down or
    orphaned."""
    [(in_addr, out_addr)] = addresses
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inbox.connect(in_addr)
    outbox.connect(out_addr)
    try:
        core = build_core(args, spec, eos_token_ids)
    except BaseException:
        outbox.send(pack(FAILED, traceback.format_exc()))
        outbox.close(linger=5000)
        context.term()
        return
    freeze_startup_heap()
    outbox.send(pack(READY, pickle.dumps((core.info, core.get_stats()))))
    try:
        _serve(core, inbox, outbox, parent_pid)
    except BaseException:  # the core is broken: say why before the process goes
        logger.exception("engine core failed")
        outbox.send(pack(FAILED, traceback.format_exc()))
    finally:
        core.shutdown()
        inbox.close(linger=0)
        outbox.close(linger=2000)
        context.term()
        thaw_heap()


def build_core(args: EngineArgs, spec: WorkerSpec | None,
               eos_token_ids: tuple[int, ...] | None):
    """The EngineCore, its grammar compiler built lazily in this process. spec None: derive
    the spec and EOS ids from args here (errors then reach the front ends as a failed start)."""
    from compiled_llm.engine.core import EngineCore

    if spec is None:
        from compiled_llm.engine.core_spec import core_spec_from_args

        spec, eos_token_ids = core_spec_from_args(args)
    grammars = _LazyGrammars(args, spec, eos_token_ids)
    core = EngineCore(args, spec, grammars)  # its worker seeds the sampling, once started
    grammars.vocab_size = core.info.vocab_size
    return core


class _LazyGrammars:
    """The core process's grammar compiler, built (with its tokenizer) on the first grammar."""

    def __init__(self, args: EngineArgs, spec: WorkerSpec,
                 eos_token_ids: tuple[int, ...]) -> None:
        self.args, self.spec, self.manager = args, spec, None
        self.vocab_size = 0  # known once the model is loaded
        self.eos_token_ids = eos_token_ids

    def __call__(self):
        if self.manager is None:
            from transformers import AutoTokenizer

            from compiled_llm.engine.core_spec import with_tokenizer_eos
            from compiled_llm.sample.grammar_compiler import GrammarManager

            args = self.args
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or self.spec.model_dir)
            eos = with_tokenizer_eos(self.eos_token_ids, tokenizer)  # as the front ends'
            self.manager = GrammarManager(tokenizer, self.vocab_size, eos,
                                          args.structured_outputs_max_bytes,
                                          args.structured_outputs_timeout_s)
        return self.manager


def _serve(core, inbox, outbox, parent_pid: int) -> None:
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    sent_stats = None
    while True:
        if not core.has_steps():
            timeout = GRAMMAR_POLL_MS if core.has_unfinished() else IDLE_POLL_MS
            if not poller.poll(timeout) and os.getppid() != parent_pid:
                logger.error("engine core: the front end is gone; exiting")
                return
        while inbox.poll(0):
            if not _handle(core, *unpack(inbox.recv()), outbox):
                return
        outputs = core.step() if core.has_unfinished() else []
        stats = stats_wire(core)
        if outputs or stats != sent_stats:  # an idle core still reports aborts' freed blocks
            outbox.send(pack(OUTPUTS, ([out.to_wire() for out in outputs], stats,
                                       time.monotonic())))
            sent_stats = stats


def stats_wire(core) -> tuple:
    """The core's load as plain values (EngineStats' fields, in order)."""
    stats = core.get_stats()
    return (stats.num_running, stats.num_waiting, stats.num_used_blocks, stats.num_blocks,
            stats.num_preemptions, stats.prefix_cache_queries, stats.prefix_cache_hits,
            stats.spec_num_drafts, stats.spec_num_draft_tokens, stats.spec_num_accepted_tokens,
            list(stats.spec_accepted_per_pos))


def add_requests(core, payload: list[tuple[str, bytes]],
                 send: Callable[[bytes], None]) -> list[str]:
    """Add the requests, each (request id, its own pickle), to the core; the ids of those
    added. One that does not unpickle here (a logits processor this process cannot import) or
    that the core refuses gets its error output sent (send(frame)); the others go on."""
    added = []
    for request_id, blob in payload:
        try:
            req = _loads_request(blob)
            core.add_request(req)
        except ValueError as exc:  # checked by the front end first; refused here anyway
            out = EngineCoreOutput(request_id, [], finish_reason="error", error=str(exc))
            send(pack(OUTPUTS, ([out.to_wire()], stats_wire(core), time.monotonic())))
            continue
        added.append(request_id)
    return added


def _loads_request(blob: bytes):
    """One request as the front end pickled it; ValueError naming logits_processors where
    it does not load in this process."""
    try:
        return pickle.loads(blob)
    except Exception as exc:
        raise ValueError(f"sampling_params: logits_processors do not load in the engine core "
                         f"process ({type(exc).__name__}: {exc}); define them in a module "
                         "it can import") from None


def _handle(core, kind: str, payload, outbox) -> bool:
    """Apply one message; False on shutdown."""
    if kind == ADD:
        add_requests(core, payload, outbox.send)
    elif kind == ABORT:
        core.abort_requests(payload)
    elif kind == FINISH:
        core.finish_requests(payload)
    elif kind == CALL:
        call_id, method, call_args = payload
        outbox.send(pack(REPLY, (call_id, *call_utility(core, method, call_args))))
    elif kind == SHUTDOWN:
        return False
    return True


def call_utility(core, method: str, call_args: list) -> tuple[bool, bytes]:
    """(ok, pickled result or error text) of a utility call on the core."""
    try:
        if method == "reset_prefix_cache":
            result = core.kv.reset_prefix_cache()
        elif method == "num_used_blocks":
            result = core.kv.num_used_blocks
        elif method in ("prefix_cache_stats", "step_stats"):
            result = getattr(core, method)
        else:
            raise ValueError(f"no engine core utility {method!r}")
        return True, pickle.dumps(result)
    except Exception as exc:
        return False, pickle.dumps(f"{type(exc).__name__}: {exc}")


def launch(run: Callable) -> None:
    """What a core process's main does first: logging, then the arguments pickled on stdin,
    the starter's sys.path and its models; then run(args, spec, eos ids, addresses, parent).
    A spec of None (with EOS ids None and no models): build_core derives them from args."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-core %(message)s")
    from compiled_llm.worker import early_load  # torch and the weight loader, no compiler

    early_load.import_loader()
    # what building the core imports, on a thread from the start: a core started ahead
    # (core_prestart) imports it while its front end is still importing its own, and while
    # this thread loads the weights once the arguments are here
    imports = early_load.BackgroundImports(*early_load.COMPILER_MODULES)
    try:
        payload = pickle.load(sys.stdin.buffer)
    except EOFError:  # started ahead, and its front end exited without taking it
        return
    arrived = process_age_s()
    args, spec, eos, addresses, parent_pid, models, path = payload
    sys.path[:] = path  # the front end's: its models' modules import here too
    _register_models(models)
    # on by default since the imports read cached bytecode (bytecode_cache): 8B warm serve on
    # the H200 10.5 s against 11.2 s without it (call 48); while every import compiled its
    # source, the reader's threads lost to the imports' hold on the interpreter (call 43)
    from compiled_llm.engine.core_spec import load_weights_early

    load_weights_early(args, spec)
    loaded = process_age_s()
    imports.join()
    logger.info("interpreter timeline: arguments at %s s, early load done at %s s, imports "
                "done at %s s (bytecode prefix %s)", format_age(arrived), format_age(loaded),
                format_age(process_age_s()), sys.pycache_prefix)
    run(args, spec, eos, addresses, parent_pid)


def main() -> None:
    """`python -m compiled_llm.engine.core_proc`: the core of one front end."""
    launch(run_engine_core)


def _register_models(models: dict[str, str]) -> None:
    """Register the front end's models that this process does not know (registered at
    runtime there), as lazy references."""
    from compiled_llm.models import ModelRegistry

    for arch, ref in models.items():
        if arch not in ModelRegistry.models:
            ModelRegistry.register_model(arch, ref)


if __name__ == "__main__":
    main()
