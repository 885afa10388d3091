"""Every sampling feature under async scheduling: the same tokens as step-by-step execution
(greedy and seeded), steps that overlap (the step in flight lands only after the next forward
is launched, and before its sampling when a row needs the token on the host), and no KV block
held afterwards."""

from __future__ import annotations

import json

import pytest
import torch

import compiled_llm.engine.core as engine_core
from compiled_llm import LLM, SamplingParams
from compiled_llm.executor.uniproc_executor import UniProcExecutor
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.utils import HostSyncWatch, make_checkpoint, random_prompts

IN_PROCESS = {"engine_core_process": False}  # these tests reach inside the engine

N = 10  # tokens per request
SCHEMA = {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}


def ban_seen(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
    """A logits processor that reads the output ids on the host: no token twice."""
    if output_ids:
        row[torch.tensor(output_ids)] = float("-inf")
    return row


CASES = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8, seed=1),
    "top_k": dict(temperature=1.0, top_k=5, seed=2),
    "top_p": dict(temperature=1.0, top_p=0.8, seed=3),
    "min_p": dict(temperature=1.0, min_p=0.1, seed=4),
    "seed": dict(temperature=1.5, seed=5),
    "logprobs": dict(temperature=1.0, seed=6, logprobs=3),
    "presence": dict(temperature=0.0, presence_penalty=1.5),
    "frequency": dict(temperature=0.0, frequency_penalty=1.0),
    "repetition": dict(temperature=0.0, repetition_penalty=1.8),
    "penalties_seeded": dict(temperature=1.0, seed=7, presence_penalty=0.5,
                             frequency_penalty=0.5, repetition_penalty=1.3),
    # token 7 would win every step; min_tokens bans it (a stop id) for the first 5 tokens
    "min_tokens": dict(temperature=0.0, logit_bias={7: 100.0}, stop_token_ids=[7],
                       min_tokens=5),
    "logit_bias": dict(temperature=1.0, seed=8, logit_bias={11: 3.0, 12: -5.0}),
    "allowed_token_ids": dict(temperature=1.0, seed=9, allowed_token_ids=[3, 5, 8, 13, 21]),
    "logits_processors": dict(temperature=0.0, logits_processors=[ban_seen]),
    "json": dict(temperature=0.0, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
    "regex": dict(temperature=1.0, seed=10,
                  structured_outputs=StructuredOutputsParams(regex=r"[a-e]{2,30}")),
    "choice": dict(temperature=0.0,
                   structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"])),
}


def params(name: str) -> SamplingParams:
    kw = dict(CASES[name])
    kw.setdefault("ignore_eos", "structured_outputs" not in kw)
    return SamplingParams(max_tokens=N, **kw)


class RecordingExecutor(UniProcExecutor):
    """The real executor, recording the order of its step calls as (call, step)."""

    calls: list

    def launch_forward(self, sched, prev=None):
        step = super().launch_forward(sched, prev)
        self.calls.append(("forward", step))
        return step

    def launch_sampling(self, step):
        self.calls.append(("sampling", step))
        return super().launch_sampling(step)

    def finish(self, step):
        self.calls.append(("finish", step))
        return super().finish(step)


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(6, 300, lo=4, hi=40, seed=11)]


@pytest.fixture(scope="module")
def sync(ckpt):
    return LLM(str(ckpt), **IN_PROCESS, enforce_eager=True, dtype="float32", async_scheduling=False)


@pytest.fixture(scope="module")
def llm(ckpt):
    mp = pytest.MonkeyPatch()
    mp.setattr(engine_core, "make_executor", RecordingExecutor)
    try:
        llm = LLM(str(ckpt), **IN_PROCESS, enforce_eager=True, dtype="float32")
    finally:
        mp.undo()
    assert llm.engine.args.async_scheduling  # the default
    llm.engine.executor.calls = []
    return llm


def run(llm: LLM, prompts, params_list):
    outs = llm.generate(prompts, params_list, use_tqdm=False)
    assert llm.engine.num_used_blocks == 0 and not llm.engine.has_unfinished_requests()
    return outs


def same_outputs(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        ox, oy = x.outputs[0], y.outputs[0]
        assert ox.token_ids == oy.token_ids and ox.finish_reason == oy.finish_reason
        assert (ox.logprobs is None) == (oy.logprobs is None)
        for da, db in zip(ox.logprobs or [], oy.logprobs or [], strict=True):
            assert da.keys() == db.keys()
            for k in da:
                assert da[k].logprob == pytest.approx(db[k].logprob, abs=1e-5)
                assert da[k].rank == db[k].rank


@pytest.mark.parametrize("name", CASES)
def test_async_matches_sync(llm, sync, prompts, name):
    p = params(name)
    got = run(llm, prompts[:3], p)
    same_outputs(got, run(sync, prompts[:3], p))
    if name == "min_tokens":
        assert all(o.outputs[0].token_ids[5:] == [7] for o in got)
    if name in ("json", "choice"):
        for o in got:
            if o.outputs[0].finish_reason == "stop":
                text = o.outputs[0].text
                assert text in ("yes", "no", "maybe") if name == "choice" else json.loads(text)


def test_every_feature_in_one_batch_matches_sync(llm, sync, prompts):
    """All features side by side: each request keeps its own slot, counts and grammar."""
    names = list(CASES)
    batch = [prompts[i % len(prompts)] for i in range(len(names))]
    plist = [params(name) for name in names]
    same_outputs(run(llm, batch, plist), run(sync, batch, plist))
    state = llm.engine.executor.worker.runner.sampler.state
    assert state.num_live > 0  # finished requests are released with the next schedule
    assert llm.engine.step() == []
    assert state.num_live == 0 and not state.penalty_rows.of


def steps_in_order(calls) -> list:
    steps = []
    for call, step in calls:
        if call == "forward":
            steps.append(step)
    return steps


def position(calls, call: str, step) -> int:
    return next(i for i, (c, s) in enumerate(calls) if c == call and s is step)


@pytest.mark.parametrize("names,land_first", [
    (["penalties_seeded", "min_tokens", "temperature", "logprobs"], False),
    (["logits_processors", "json", "greedy"], True),
], ids=["device-side", "host-feedback"])
def test_the_step_in_flight_lands_after_the_next_forward(llm, prompts, names, land_first):
    """Step N is read only once step N+1's forward is launched, for every feature; when a row
    of N+1 needs N's token on the host, N lands before N+1's sampling, else after it."""
    calls = llm.engine.executor.calls
    calls.clear()
    run(llm, prompts[:len(names)], [params(name) for name in names])
    steps = steps_in_order(calls)
    assert len(steps) >= N
    for prev, nxt in zip(steps, steps[1:]):
        landed = position(calls, "finish", prev)
        assert landed > position(calls, "forward", nxt)
        assert (landed < position(calls, "sampling", nxt)) == land_first


def test_sampling_launches_copy_without_blocking_and_read_nothing(llm, sync, prompts):
    """Every launch of a step's sampling (metadata, slots, counts, masks, bitmask, the draw and
    the copies back) is free of blocking copies and device reads; the tokens still match."""
    runner = llm.engine.executor.worker.runner
    real = runner.launch_sampling
    watch = HostSyncWatch()

    def watched(step):
        with watch:
            return real(step)

    names = [n for n in CASES if n != "logits_processors"]  # user code is the user's
    batch = [prompts[i % len(prompts)] for i in range(len(names))]
    plist = [params(name) for name in names]
    runner.launch_sampling = watched
    try:
        got = run(llm, batch, plist)
    finally:
        del runner.launch_sampling
    assert watch.calls == []
    same_outputs(got, run(sync, batch, plist))


def test_penalties_and_seeds_through_preemption_and_chunked_prefill(ckpt):
    """Counts and slots stay with a preempted request (it resumes by recompute) and with a
    prompt chunked over steps: async and sync still agree token for token."""
    kw = dict(enforce_eager=True, dtype="float32", num_gpu_blocks_override=14,
              max_num_batched_tokens=32)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, 300, lo=20, hi=90, seed=3)]
    plist = [SamplingParams(max_tokens=20, ignore_eos=True, temperature=1.0, seed=i,
                            presence_penalty=0.4, frequency_penalty=0.3,
                            repetition_penalty=1.2 if i % 2 else 1.0) for i in range(6)]
    a = LLM(str(ckpt), **IN_PROCESS, **kw)
    got = run(a, prompts, plist)
    assert a.engine.scheduler.num_preemptions > 0
    sync = LLM(str(ckpt), **IN_PROCESS, async_scheduling=False, **kw)
    same_outputs(got, run(sync, prompts, plist))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampling_launches_never_synchronize_on_cuda(ckpt, prompts):
    """On CUDA, torch's sync debug mode raises on any synchronizing call (a blocking or
    pageable copy, a device read) made while a step's sampling is launched."""
    llm = LLM(str(ckpt), **IN_PROCESS, enforce_eager=True, dtype="float32")
    runner = llm.engine.executor.worker.runner
    real = runner.launch_sampling

    def strict(step):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real(step)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    names = [n for n in CASES if n != "logits_processors"]
    runner.launch_sampling = strict
    run(llm, [prompts[i % len(prompts)] for i in range(len(names))],
        [params(name) for name in names])
