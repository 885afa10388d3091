"""The model loaded early (by an engine core process, beside its compiler imports): taken by a
worker of the same settings only, never for parallel ranks, a failure left to the worker's own
load, and a process core that loaded early generates what an in-process core does."""

from __future__ import annotations

import dataclasses

import torch

from compiled_llm.engine.core_spec import core_spec
from compiled_llm.worker import early_load
from compiled_llm.worker.loader import load_model
from tests.entrypoints.server.inprocess import engine_args


def _spec(args):
    return core_spec(args, None)[0]


def test_the_early_model_is_the_loaded_model_and_is_taken_once():
    args = engine_args()
    spec = _spec(args)
    early_load.load_early(args, spec)
    early = early_load.take(args, spec)
    assert early is not None and early.seconds > 0
    again = load_model(spec.model_dir, spec.dtype, spec.device, spec.scheduler.max_model_len)
    ours = dict(early.model.named_parameters())
    for name, param in again.named_parameters():
        assert torch.equal(ours[name], param), name
    assert early_load.take(args, spec) is None


def test_a_worker_of_other_settings_gets_no_early_model():
    args = engine_args()
    spec = _spec(args)
    early_load.load_early(args, spec)
    other = dataclasses.replace(spec, scheduler=dataclasses.replace(spec.scheduler,
                                                                    max_model_len=64))
    assert early_load.take(args, other) is None
    assert early_load.take(args, spec) is None  # the unused one was dropped


def test_parallel_ranks_load_their_own_shards():
    args = engine_args(tensor_parallel_size=2, distributed_executor_backend="mp")
    assert early_load.load_key(args, _spec(engine_args())) is None
    early_load.load_early(args, _spec(engine_args()))
    assert early_load.take(args, _spec(engine_args())) is None


def test_a_failed_early_load_is_left_to_the_worker(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    args = engine_args()
    spec = dataclasses.replace(_spec(args), model_dir=str(tmp_path))
    early_load.load_early(args, spec)  # no weights there: nothing raised here
    assert early_load._loaded == []


def test_background_imports_repeat_a_failure_where_it_can_be_raised():
    imports = early_load.BackgroundImports("json", "compiled_llm.no_such_module")
    try:
        imports.join()
    except ModuleNotFoundError as err:
        assert "no_such_module" in str(err)
    else:
        raise AssertionError("the failed import was not raised")
