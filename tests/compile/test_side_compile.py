"""Pieces compiled in compile children (side_compile): the whole cold start through warm
children gives eager's tokens, counts its compiles and fusions, and leaves no job file or
child behind; in-process, a piece's pickled job compiles to the same artifact as the backend,
and a failed child's piece compiles in the parent instead."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.bytecode_cache import HINTS_DIRNAME
from compiled_llm.compile import counters, side_compile
from compiled_llm.worker.compile_children import CompileChildren
from tests.utils import make_checkpoint, random_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("qwen3")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(4, 300, lo=2, hi=30, seed=3)]


def _tokens(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


def _eager_tokens(ckpt, prompts):
    """The baseline, on the CPU as every engine here (the side path's CPU form is tested)."""
    return _tokens(LLM(str(ckpt), enforce_eager=True, dtype="float32", device="cpu"), prompts)


def _jobs_left() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), "compiled-llm-*.piece"))


class InProcess:
    """The children's protocol served here: each job runs compile_job now, or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.answers, self.jobs = fail, {}, 0

    def submit_piece(self, path: str) -> int:
        self.jobs += 1
        self.answers[self.jobs] = ({"ok": False, "error": "made to fail"} if self.fail
                                   else {"ok": True, **side_compile.compile_job(path)})
        return self.jobs

    def piece_answer(self, job_id: int, timeout_s: float) -> dict | None:
        return self.answers.get(job_id)


# the fused QK-norm + RoPE + KV write and the small-M GEMMs, as on CUDA: pieces holding our ops
PASSES = {"qk_norm_rope_kv_write_on_cpu": True, "small_m_gemm_on_cpu": True}


def _cold_llm(ckpt, cache_dir, side: InProcess):
    with side_compile.using(side):
        return LLM(str(ckpt), dtype="float32", compile_mode="backend", device="cpu",
                   compile_cache_dir=str(cache_dir), passes=PASSES)


def test_pickled_pieces_compile_to_the_same_tokens(ckpt, prompts, tmp_path, monkeypatch):
    baseline = _eager_tokens(ckpt, prompts)
    # a fresh Inductor cache: a hit there would skip the passes the test counts
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    counters.reset()
    side = InProcess()
    llm = _cold_llm(ckpt, tmp_path / "side", side)
    assert side.jobs == counters.unique_pieces == 3  # every piece went to the "child"
    assert counters.inductor_compiles == 3 and counters.cache_hits == 0
    # the child's passes counted, on pieces that hold our custom ops
    assert counters.pass_matches["QKNormRoPEKVWriteFusionPass"] > 0
    assert counters.pass_matches["SmallMGemmPass"] > 0
    assert counters.pass_matches["AddRMSNormFusionPass"] > 0
    assert _tokens(llm, prompts) == baseline
    assert llm.engine.num_used_blocks == 0
    assert not _jobs_left()


def test_a_failed_child_piece_compiles_here(ckpt, prompts, tmp_path, caplog):
    baseline = _eager_tokens(ckpt, prompts)
    counters.reset()
    side = InProcess(fail=True)
    llm = _cold_llm(ckpt, tmp_path, side)
    assert side.jobs == 3 and counters.inductor_compiles == 3
    assert "compiling it here" in caplog.text
    assert _tokens(llm, prompts) == baseline
    assert not _jobs_left()


def test_warm_children_answer_piece_jobs():
    children = CompileChildren(1, None, warm=1)
    try:
        assert children.piece_answer(999, timeout_s=0.1) is None  # no such job
        job = children.submit_piece("/nonexistent/job.piece")
        answer = children.piece_answer(job, timeout_s=120.0)
    finally:
        children.kill()
    assert answer is not None and answer["id"] == job and not answer["ok"]
    assert "No such file" in answer["error"]
    assert children.answers() == []  # a piece's answer is not a kernel's
    for child in children.children:
        child.proc.wait(timeout=30)


def test_cold_start_through_warm_children(ckpt, prompts, tmp_path, monkeypatch, caplog):
    """The whole path: a CPU start with the switch on, children warm, pieces sent to them."""
    baseline = _eager_tokens(ckpt, prompts)
    monkeypatch.setenv(side_compile.ENV, "1")
    counters.reset()
    with caplog.at_level("INFO"):
        llm = LLM(str(ckpt), dtype="float32", compile_mode="backend", device="cpu",
                  compile_cache_dir=str(tmp_path), passes=PASSES)
    assert caplog.text.count("in a compile child") == 3
    assert counters.inductor_compiles == 3 and counters.cache_hits == 0
    assert _tokens(llm, prompts) == baseline
    assert not _jobs_left()


def _compile_children() -> list[int]:
    """Live processes of this one's running compile_children."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd, open(f"/proc/{pid}/stat") as stat:
                line, state = cmd.read(), stat.read().split(") ")[1]
        except OSError:
            continue
        if b"compile_children" in line and state[0] != "Z" and \
                int(state.split()[1]) == os.getpid():
            found.append(int(pid))
    return found


def test_early_children_are_stopped_on_a_warm_start(ckpt, prompts, tmp_path, monkeypatch):
    """Started before the weights with the switch on (unless a warm-start hint says the
    cache has the model), the warm children are ended on a warm start and after a cold one."""
    import time

    monkeypatch.setenv(side_compile.ENV, "1")
    counters.reset()
    for _ in range(2):  # cold, then warm from the same cache
        shutil.rmtree(tmp_path / HINTS_DIRNAME, ignore_errors=True)  # children started ahead
        llm = LLM(str(ckpt), dtype="float32", compile_mode="backend", device="cpu",
                  compile_cache_dir=str(tmp_path))
        deadline = time.monotonic() + 30
        while _compile_children() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _compile_children()
    assert counters.snapshot_loads == 1  # the second start was warm
    assert len(_tokens(llm, prompts)) == len(prompts)


def test_children_started_ahead_are_taken_by_the_worker(ckpt, monkeypatch):
    """An engine core process (or `compiled-llm compile`) starts them with its arguments,
    before the weights; the worker takes those rather than start more."""
    import torch

    from compiled_llm.config import EngineArgs
    from compiled_llm.worker import compile_children

    args = EngineArgs(model=str(ckpt), compile_mode="backend")
    cpu = torch.device("cpu")
    monkeypatch.setenv(side_compile.ENV, "0")
    compile_children.start_early_children(cpu, args)
    assert compile_children.early_children(cpu, args, None) == []  # switched off
    monkeypatch.setenv(side_compile.ENV, "1")
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")  # the backend would send nothing
    assert compile_children.early_children(cpu, args, None) == []
    monkeypatch.delenv("COMPILED_LLM_DISABLE_CACHE")
    compile_children.start_early_children(cpu, args)
    ahead = [child for _, child in compile_children._started]
    assert ahead and compile_children.early_children(cpu, args, None) == ahead
    assert not compile_children._started
    compile_children.stop_early(ahead)
    for child in ahead:
        assert child.proc.wait(timeout=30) is not None


def test_a_late_piece_answer_stops_its_child():
    """Waited for past the timeout (the piece then compiles in the parent), the child is
    stopped: nothing waits on its late work."""
    children = CompileChildren(1, None, warm=1)
    job = children.submit_piece("/nonexistent/job.piece")
    assert children.piece_answer(job, timeout_s=0.2) is None  # still setting up Inductor
    assert children.children[0].proc.wait(timeout=30) is not None
    children.kill()
