"""The warm-start snapshot's guards: its file name follows the parameter signature, and a
graph input whose source does not lead back to the very tensor Dynamo saw blocks the snapshot."""

from __future__ import annotations

import torch

from compiled_llm.compile.snapshot import snapshot_name, sources_match
from compiled_llm.worker.loader import load_model
from tests.utils import make_checkpoint


def test_name_follows_parameter_shapes():
    ckpt = make_checkpoint("qwen3")
    cpu = torch.device("cpu")
    a, b = (load_model(ckpt, torch.float32, cpu, n) for n in (1024, 1024))
    assert snapshot_name(a) == snapshot_name(b)
    longer = load_model(ckpt, torch.float32, cpu, 2048)  # a longer rotary buffer
    assert snapshot_name(longer) != snapshot_name(a)
    assert snapshot_name(a.to(torch.bfloat16)) != snapshot_name(b)


def test_sources_must_reach_the_inputs_dynamo_saw():
    ids, weight = torch.zeros(3, dtype=torch.long), torch.ones(2)
    model = torch.nn.Linear(2, 2)
    frame = {"self": model, "input_ids": ids}
    sources = ["L['self']._parameters['weight']", "L['input_ids']", "L['input_ids'].size()[0]"]
    assert sources_match(sources, [model.weight, ids, 3], frame)
    assert not sources_match(sources, [weight, ids, 3], frame)  # another tensor
    assert not sources_match(["G['x']"], [ids], frame)  # not from the call's locals
    assert not sources_match(["L['nope']"], [ids], frame)
