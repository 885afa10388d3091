"""Streamed n > 1 outputs in vLLM's shape (its ParentRequest.get_outputs): one RequestOutput
per child that moved in a step, carrying that child's CompletionOutput alone, finished only on
the last once every child has finished; FINAL_ONLY still gives one output of all n."""

from __future__ import annotations

from compiled_llm.core.engine_output import EngineCoreOutput
from compiled_llm.output.output_processor import (
    OutputProcessor,
    child_outputs,
    request_output,
)
from compiled_llm.output.outputs import CompletionOutput, RequestOutput, merge_deltas
from compiled_llm.output.request_state import RequestState
from compiled_llm.sampling_params import RequestOutputKind as Kind
from compiled_llm.sampling_params import SamplingParams

PROMPT = [5, 6, 7]


def _children(kind: Kind, n: int = 3, prompt_logprobs: bool = False) -> list[RequestState]:
    params = SamplingParams(n=1, temperature=1.0, output_kind=kind,
                            prompt_logprobs=0 if prompt_logprobs else None)
    children = [RequestState(f"{i}_r", "r", "p", PROMPT, params) for i in range(n)]
    if prompt_logprobs:  # child 0 scores the prompt for all of them, as the engine does
        children[0].prompt_logprobs = [None, {6: None}, {7: None}]
    return children


def _step(children: list[RequestState], news: dict[int, tuple[list[int], str | None]]
          ) -> list[RequestOutput]:
    """Fold one step's core outputs ({index: (tokens, finish_reason)}) in, as LLMEngine does."""
    proc = OutputProcessor(None)
    proc.states = {c.request_id: c for c in children}
    touched, _ = proc.process([EngineCoreOutput(f"{i}_r", tokens, finish_reason=reason)
                               for i, (tokens, reason) in news.items()])
    return child_outputs("r", children, set(touched))


def _only(out: RequestOutput) -> CompletionOutput:
    (completion,) = out.outputs
    return completion


def test_delta_gives_one_output_per_child_that_moved():
    children = _children(Kind.DELTA)
    outs = _step(children, {0: ([1], None), 2: ([3], None)})
    assert [(_only(o).index, _only(o).token_ids) for o in outs] == [(0, [1]), (2, [3])]
    assert all(o.request_id == "r" and o.prompt_token_ids == PROMPT for o in outs)
    assert not any(o.finished for o in outs)
    outs = _step(children, {i: ([10 + i], None) for i in range(3)})
    assert [(_only(o).index, _only(o).token_ids) for o in outs] == [(0, [10]), (1, [11]),
                                                                      (2, [12])]


def test_finished_only_on_the_last_output_once_every_child_finished():
    children = _children(Kind.DELTA)
    outs = _step(children, {0: ([1], "length"), 1: ([2], None), 2: ([3], "stop")})
    assert [(_only(o).index, _only(o).finish_reason, o.finished) for o in outs] == [
        (0, "length", False), (1, None, False), (2, "stop", False)]
    outs = _step(children, {1: ([4], "length")})
    assert [(_only(o).index, o.finished) for o in outs] == [(1, True)]
    assert outs[0].metrics is not None
    # all ending in one step: each child its own output, only the last one finished
    children = _children(Kind.DELTA, n=2)
    outs = _step(children, {0: ([1], "length"), 1: ([2], "length")})
    assert [(_only(o).index, o.finished) for o in outs] == [(0, False), (1, True)]


def test_each_child_first_delta_carries_the_prompt_logprobs():
    children = _children(Kind.DELTA, prompt_logprobs=True)
    outs = _step(children, {0: ([1], None), 1: ([2], None)})
    assert [o.prompt_logprobs for o in outs] == [children[0].prompt_logprobs] * 2
    outs = _step(children, {0: ([3], None), 1: ([4], None), 2: ([5], None)})
    assert [o.prompt_logprobs for o in outs] == [[], [], children[0].prompt_logprobs]
    merged = merge_deltas(outs[0], outs[2])  # a consumer's view keeps them
    assert merged.prompt_logprobs == children[0].prompt_logprobs
    assert [c.index for c in merged.outputs] == [0, 2]
    assert all(o.prompt_logprobs is None
               for o in _step(_children(Kind.DELTA), {0: ([1], None)}))


def test_cumulative_outputs_carry_each_child_whole():
    children = _children(Kind.CUMULATIVE, n=2, prompt_logprobs=True)
    _step(children, {0: ([1], None), 1: ([2], None)})
    outs = _step(children, {0: ([3], "length"), 1: ([4], None)})
    assert [(_only(o).index, _only(o).token_ids) for o in outs] == [(0, [1, 3]), (1, [2, 4])]
    assert all(o.prompt_logprobs == children[0].prompt_logprobs for o in outs)
    outs = _step(children, {1: ([6], "length")})  # the finished child 0 is not sent again
    assert [(_only(o).index, _only(o).token_ids, o.finished) for o in outs] == [
        (1, [2, 4, 6], True)]


def test_a_failed_child_names_its_error_on_its_output_and_the_last():
    children = _children(Kind.DELTA, n=2)
    children[1].finish("error", error="boom")
    outs = child_outputs("r", children, {children[1]})
    assert [(_only(o).index, o.error) for o in outs] == [(1, "boom")]
    outs = _step(children, {0: ([1], "length")})
    assert [(_only(o).index, o.finished, o.error) for o in outs] == [(0, True, "boom")]


def test_final_only_and_aborts_stay_one_output_of_every_child():
    children = _children(Kind.FINAL_ONLY)
    for i, child in enumerate(children):
        child.output_token_ids, child.finish_reason = [i], "length"
    out = request_output("r", children)
    assert out.finished and [(c.index, c.token_ids) for c in out.outputs] == [
        (0, [0]), (1, [1]), (2, [2])]
    children = _children(Kind.DELTA, n=2)
    for child in children:
        child.finish("abort")
    out = request_output("r", children)  # what abort_request returns
    assert out.finished and [c.index for c in out.outputs] == [0, 1]
