"""CUDA-graph dispatch on CPU: which graph key a step gets from its shape, and that the wrapper
runs its runnable plainly outside a context, under another mode's key, or without a key."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.forward_context import (
    CUDAGraphKey,
    ForwardContext,
    set_forward_context,
)
from compiled_llm.worker.cudagraph import (
    FULL,
    PIECEWISE,
    CUDAGraphDispatcher,
    CUDAGraphWrapper,
    full_graph_sizes,
    piecewise_graph_sizes,
)


def dispatcher(full=(1, 2, 4, 8), piecewise=(1, 2, 4, 8, 16, 32)) -> CUDAGraphDispatcher:
    made = CUDAGraphDispatcher()
    made.full_sizes, made.piecewise_sizes = list(full), list(piecewise)
    return made


@pytest.mark.parametrize("shape,key", [
    ((3, 3, 1), CUDAGraphKey(FULL, 4)),  # pure decode: the next full size up
    ((8, 8, 1), CUDAGraphKey(FULL, 8)),
    ((9, 9, 1), CUDAGraphKey(PIECEWISE, 16)),  # past the full sizes: piecewise by tokens
    ((2, 5, 4), CUDAGraphKey(PIECEWISE, 8)),  # a prefill chunk: piecewise
    ((1, 33, 33), None),  # past every size: plain
])
def test_dispatch_maps_a_step_shape_to_its_graph(shape, key):
    assert dispatcher().dispatch(*shape) == key


def test_nothing_is_dispatched_before_capture():
    assert CUDAGraphDispatcher().dispatch(1, 1, 1) is None


def test_sizes():
    assert full_graph_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert full_graph_sizes(5) == [1, 2, 4, 5]
    assert piecewise_graph_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert piecewise_graph_sizes(16) == [1, 2, 4, 8, 16]


def test_the_wrapper_runs_plainly_unless_its_mode_is_keyed():
    calls = []

    def runnable(x):
        calls.append(x)
        return x + 1

    wrapper = CUDAGraphWrapper(runnable, PIECEWISE, pool=None)
    x = torch.zeros(2)
    assert wrapper(x).tolist() == [1.0, 1.0]  # no forward context
    for key in (None, CUDAGraphKey(FULL, 2)):
        with set_forward_context(ForwardContext(None, cudagraph_key=key)):
            assert wrapper(x).tolist() == [1.0, 1.0]
    assert len(calls) == 3 and not wrapper.graphs
    with set_forward_context(ForwardContext(None, cudagraph_key=CUDAGraphKey(PIECEWISE, 2))), \
            pytest.raises(RuntimeError, match="no piecewise CUDA graph captured for 2 tokens"):
        wrapper(x)  # a key with nothing captured, outside capture: refused, never run wrong
