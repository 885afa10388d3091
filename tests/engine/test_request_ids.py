"""Request ids at the engine's front door: vLLM's LLMEngine.from_engine_args builds an engine,
and an id that names another request's sequence (n > 1 names its children "{index}_{id}") is
refused instead of mixing two requests' tokens and leaving one unfinished for ever."""

from __future__ import annotations

import pytest

from compiled_llm import EngineArgs, SamplingParams
from compiled_llm.engine.llm_engine import LLMEngine
from compiled_llm.sampling_params import RequestOutputKind
from tests.utils import make_checkpoint

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
# one final output of both sequences (a streamed n > 1 request gives one per sequence)
TWO = SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=4, ignore_eos=True,
                     output_kind=RequestOutputKind.FINAL_ONLY)


@pytest.fixture(scope="module")
def engine():
    args = EngineArgs(model=str(make_checkpoint("llama")), enforce_eager=True, dtype="float32")
    eng = LLMEngine.from_engine_args(args)
    yield eng
    eng.shutdown()


def run_all(eng: LLMEngine) -> dict:
    done, steps = {}, 0
    while eng.has_unfinished_requests():
        steps += 1
        assert steps < 100, "the engine never finished its requests"
        done.update({out.request_id: out for out in eng.step() if out.finished})
    return done


def test_from_engine_args_builds_an_in_process_engine(engine):
    assert not engine.is_shut_down and engine.scheduler is not None  # the core is in-process
    engine.add_request("a", {"prompt_token_ids": [5, 9, 17]}, GREEDY)
    done = run_all(engine)
    assert len(done["a"].outputs[0].token_ids) == 4 and engine.num_used_blocks == 0
    with pytest.raises(ValueError, match="stat_loggers"):
        LLMEngine.from_engine_args(engine.args, stat_loggers=[object()])


@pytest.mark.parametrize("order", ["parent_first", "named_first"])
def test_an_id_naming_another_requests_sequence_is_refused(engine, order):
    first, second = [("a", TWO), ("0_a", GREEDY)][:: 1 if order == "parent_first" else -1]
    engine.add_request(first[0], {"prompt_token_ids": [5, 9, 17]}, first[1])
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request(second[0], {"prompt_token_ids": [4, 6, 8]}, second[1])
    done = run_all(engine)
    assert set(done) == {first[0]}
    assert [len(seq.token_ids) for seq in done[first[0]].outputs] == [4] * first[1].n
    assert engine.num_used_blocks == 0
    # once that request has finished, its sequences' ids are free again
    engine.add_request(second[0], {"prompt_token_ids": [4, 6, 8]}, second[1])
    assert set(run_all(engine)) == {second[0]}
