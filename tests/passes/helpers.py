"""Test helpers: run a function or a tiny model through Inductor with a PassManager installed,
returning its output, Inductor's output code and the manager (to read its stats)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch._inductor.config as inductor_config
from torch._inductor.compile_fx import compile_fx
from torch._inductor.utils import run_and_get_code

from compiled_llm.attention import AttentionMetadata
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.compat import mark_tokens_dynamic
from compiled_llm.passes import PassConfig, PassManager


def backend_with(manager: PassManager | None):
    """A torch.compile backend: Inductor with `manager` as the post-grad custom pass."""

    def backend(gm: torch.fx.GraphModule, example_inputs):
        with inductor_config.patch(post_grad_custom_post_pass=manager, fx_graph_cache=False):
            return compile_fx(gm, example_inputs)

    return backend


def token_args(args) -> list[torch.Tensor]:
    """The tensor args whose dim 0 is T (the first tensor's dim 0): those marked dynamic."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return [a for a in tensors if a.dim() and a.shape[0] == tensors[0].shape[0]]


def compile_run(fn, args, config: PassConfig | None, dynamic: bool = True):
    """(output, Inductor output code, manager or None) of fn(*args) compiled with the passes
    of config (None: no custom pass at all)."""
    torch._dynamo.reset()
    manager = PassManager(config) if config is not None else None
    compiled = torch.compile(fn, backend=backend_with(manager), fullgraph=True)
    if dynamic:
        mark_tokens_dynamic(*token_args(args))
    out, codes = run_and_get_code(compiled, *args)
    return out, "\n".join(codes), manager


def kernel_calls(code: str, *needles: str) -> list[str]:
    """Names of the generated C++/Triton kernels called in code whose name holds every needle."""
    calls = re.findall(r"^\s+((?:cpp|triton)_\w+)(?:\.run)?\(", code, flags=re.M)
    return [c for c in calls if all(n in c for n in needles)]


def kernels_with(code: str, text: str) -> list[str]:
    """Calls (one entry per call) of generated kernels whose source contains text."""
    quotes = "'" * 3
    pattern = rf"^(\w+) = async_compile\.\w+\(.*?r{quotes}(.*?){quotes}"
    sources = dict(re.findall(pattern, code, flags=re.M | re.S))
    return [c for c in kernel_calls(code) if text in sources.get(c, "")]


@contextmanager
def scheduled_nodes() -> Iterator[list[list]]:
    """Inductor's scheduler nodes after fusion (each one kernel or loop nest), one list per
    graph compiled inside the block."""
    from torch._inductor.scheduler import Scheduler

    graphs: list[list] = []
    original = Scheduler.codegen

    def codegen(self):
        graphs.append(list(self.nodes))
        return original(self)

    Scheduler.codegen = codegen
    try:
        yield graphs
    finally:
        Scheduler.codegen = original


def reduction_sites(graphs: list[list]) -> list[tuple[int, int]]:
    """Over graphs from scheduled_nodes, for each reduction (in a Llama piece: each norm site)
    the number of other kernels that feed it and that read its result, unfused. (0, 0) is one
    kernel for the site. Inductor's C++ code may hide a split inside one function; Triton
    launches each kernel separately."""
    from torch._inductor.scheduler import NopKernelSchedulerNode

    sites = []
    for nodes in graphs:  # buffer names are per graph
        kernels = [n for n in nodes if not (n.is_extern() or isinstance(n, NopKernelSchedulerNode))]
        for node in nodes:
            for leaf in (x for x in _leaves(node) if x.is_reduction()):
                out = leaf.get_buffer_names()
                reads = {dep.name for dep in leaf.read_writes.reads} - node.get_buffer_names()
                others = [k for k in kernels if k is not node]
                sites.append((sum(bool(k.get_buffer_names() & reads) for k in others),
                              sum(bool({d.name for d in k.read_writes.reads} & out)
                                  for k in others)))
    return sites


def _leaves(node) -> list:
    """The single-op scheduler nodes inside a (possibly nested) fused node."""
    inner = node.get_nodes()
    return [node] if inner == [node] else [leaf for n in inner for leaf in _leaves(n)]


def op_counts(graph: torch.fx.Graph) -> Counter:
    """Calls per op, keyed like "aten.rsqrt" or "compiled_llm.rms_norm" (overload dropped)."""
    return Counter(n.target.name().split(".")[0].replace("::", ".") for n in graph.nodes
                   if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload))


def prefill_context(cfg, num_tokens: int, dtype: torch.dtype) -> ForwardContext:
    """One sequence of num_tokens prefill tokens with small per-layer paged KV caches."""
    bs, blocks = 16, -(-num_tokens // 16)
    caches = [torch.zeros(2, blocks + 1, bs, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype)
              for _ in range(cfg.num_hidden_layers)]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens) + bs, query_start_loc=i32([0, num_tokens]),
        seq_lens=i32([num_tokens]), block_tables=torch.arange(1, blocks + 1)[None].int(),
        num_actual_tokens=num_tokens, max_query_len=num_tokens, max_seq_len=num_tokens,
        query_start_loc_cpu=i32([0, num_tokens]), seq_lens_cpu=i32([num_tokens]))
    return ForwardContext(meta, caches)


def run_model(model, num_tokens: int, config: PassConfig | None, seed: int = 0):
    """Compile model.forward over one prefill of num_tokens tokens; (hidden, code, manager)."""
    ids, pos = model_inputs(model, num_tokens, seed)
    dtype = next(model.parameters()).dtype
    with set_forward_context(prefill_context(model.config, num_tokens, dtype)):
        if config is False:
            return model(ids, pos), "", None
        return compile_run(model, (ids, pos), config)


def capture_run(fn, args, config: PassConfig, dynamic: bool = True):
    """Fast path without code generation: AOT-trace fn with Inductor's decompositions, run the
    passes on the forward graph, then run that graph eagerly. Returns (output, op counts
    before the passes, after them, manager)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    manager, src = PassManager(config), {}

    def fw(gm: torch.fx.GraphModule, example_inputs):
        src["before"] = op_counts(gm.graph)
        manager(gm.graph)
        gm.recompile()
        src["after"] = op_counts(gm.graph)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=fw, decompositions=select_decomp_table())
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    if dynamic:
        mark_tokens_dynamic(*token_args(args))
    out = compiled(*args)
    return out, src["before"], src["after"], manager


def model_inputs(model, num_tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,), generator=g)
    return ids, torch.arange(num_tokens)


def capture_model(model, num_tokens: int, config: PassConfig):
    """capture_run over one prefill of the model; also returns the eager output."""
    ids, pos = model_inputs(model, num_tokens)
    dtype = next(model.parameters()).dtype
    with set_forward_context(prefill_context(model.config, num_tokens, dtype)):
        ref = model(ids, pos)
    with set_forward_context(prefill_context(model.config, num_tokens, dtype)):
        out, before, after, manager = capture_run(model, (ids, pos), config)
    return ref, out, before, after, manager
