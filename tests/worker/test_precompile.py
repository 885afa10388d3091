"""The cold start's side-by-side Triton compiles: the dry pass's hook hands each kernel to the
compile children once and skips its launch, lets Triton compile elsewhere, and is wanted only
on a cold lone CUDA worker with the switch on."""

import time
from types import SimpleNamespace

import pytest
import torch

from compiled_llm.compile.backend import BackendOptions, CompiledLLMBackend
from compiled_llm.worker import precompile
from compiled_llm.worker.compile_children import CompileChildren
from tests.worker import compile_child_fixture as fixture


def _hook_args(kernel, key: str, spec: str) -> dict:
    info = type("Info", (), {"jit_function": kernel})()
    return {"key": key, "fn": info, "compile": {"specialization_data": spec}}


def test_hook_outside_a_dry_pass_leaves_it_to_the_hook_before(tmp_path):
    args = _hook_args(fixture.kernel, "a", str(tmp_path / "a"))
    assert precompile._chained_hook(None)(**args) is None  # Triton compiles in place
    assert precompile._chained_hook(lambda **kwargs: "before")(**args) == "before"


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_dry_pass_hands_each_specialization_once_to_the_children(tmp_path):
    import triton

    children = CompileChildren(2)
    with precompile.dry_launches(children) as queue:
        hook = triton.knobs.runtime.jit_cache_hook
        for key in ("a", "a", "b"):  # a launch skipped and queued, once per specialization
            assert hook(**_hook_args(fixture.kernel, key, str(tmp_path / key)))
        assert hook(fn=None) is None  # unknown arguments: compile in place
        assert hook(**_hook_args(fixture.broken, "c", str(tmp_path / "c")))
    # compiled, then loaded (Triton builds a kernel's launcher when it loads the kernel)
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text() == "compiled and loaded"
    assert children.submitted == 3 and len(queue.kernels) == 3
    assert queue.errors == ["RuntimeError: cannot compile"]
    # every answer in, the children are killed rather than waited for (their exit is slow)
    assert all(child.proc.wait(timeout=10) is not None for child in children.children)
    assert triton.knobs.runtime.jit_cache_hook is None  # the pass is over


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_an_error_in_the_pass_stops_the_children_and_restores_the_hook():
    import triton

    children = CompileChildren(1)
    with pytest.raises(RuntimeError), precompile.dry_launches(children):
        children.submit(fixture.__name__, "stuck", "unused")
        raise RuntimeError("a dry forward failed")
    assert children.children[0].proc.wait(timeout=10) != 0  # killed
    assert triton.knobs.runtime.jit_cache_hook is None


def test_a_stuck_child_is_stopped_and_its_kernel_reported(tmp_path):
    children = CompileChildren(1)
    children.submit(fixture.__name__, "kernel", str(tmp_path / "a"))
    children.submit(fixture.__name__, "stuck", str(tmp_path / "b"))
    _wait_for_answers(children, 1)  # a loaded host may take long to start the child
    errors = children.wait(timeout_s=1)
    assert (tmp_path / "a").read_text() == "compiled and loaded"  # answered despite the chatter
    assert errors == ["no answer: a compile child exited early or was stopped"]
    assert children.children[0].proc.wait(timeout=10) != 0


def _wait_for_answers(children: CompileChildren, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(children.answers()) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(children.answers()) == count


def test_a_busy_child_gets_no_more_work_while_another_has_none(tmp_path):
    children = CompileChildren(2)
    children.submit(fixture.__name__, "stuck", str(tmp_path / "a"))  # never answers
    children.submit(fixture.__name__, "kernel", str(tmp_path / "b"))
    _wait_for_answers(children, 1)
    children.submit(fixture.__name__, "kernel", str(tmp_path / "c"))
    _wait_for_answers(children, 2)
    errors = children.wait(timeout_s=1)
    # "c" went to the child that had answered (in turn, it waited behind the stuck one)
    assert (tmp_path / "b").read_text() == (tmp_path / "c").read_text() == "compiled and loaded"
    assert [child.sent for child in children.children] == [1, 2]
    assert errors == ["no answer: a compile child exited early or was stopped"]


def _runner(device: str, warm: bool, step_hook=None, backend=None):
    if backend is None:
        backend = CompiledLLMBackend(BackendOptions())
        backend.graphs = ["a snapshot"] if warm else []
    return SimpleNamespace(device=torch.device(device), step_hook=step_hook,
                           forward_fn=SimpleNamespace(backend=backend))


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_wanted_only_on_a_cold_lone_cuda_worker(monkeypatch):
    monkeypatch.delenv(precompile.ENV, raising=False)
    assert precompile.wanted(_runner("cuda", warm=False))
    assert not precompile.wanted(_runner("cpu", warm=False))
    assert not precompile.wanted(_runner("cuda", warm=True))  # the snapshot came from cache
    assert not precompile.wanted(_runner("cuda", warm=False, step_hook=object()))
    assert not precompile.wanted(_runner("cuda", warm=False, backend="inductor"))  # stock
    assert not precompile.precompile_if_cold(_runner("cuda", warm=False), 2, 16, 16)
    monkeypatch.setenv(precompile.ENV, "off")
    assert not precompile.wanted(_runner("cuda", warm=False))


def test_timeline_reads_the_children_wall_clock():
    from compiled_llm.worker.precompile import _timeline

    answers = [{"ok": True, "ready": 102.0, "began": 103.0, "ended": 104.5},
               {"ok": True, "ready": 101.0, "began": 102.5, "ended": 103.0}, {"ok": False}]
    line = _timeline(answers, 100.0)
    assert line == ("children ready by 2.00 s, first compile began at 2.50 s, last ended at "
                    "4.50 s, 2.00 s of compiles (longest 1.50 s)")
    assert _timeline([], 100.0) == "no answers"


def test_spans_set_the_compiling_forward_apart():
    from compiled_llm.worker.precompile import _spans

    line = _spans([("step 8192/4096", 14.0), ("step 1/1", 0.25), ("decode 8", 0.5)])
    assert line == ("step 8192/4096 14.00 s (the compile), then 2 more in 0.75 s (slowest "
                    "decode 8 0.500 s)")
    assert _spans([]) == "none"


def test_the_compile_pool_state_is_one_of_its_words():
    from compiled_llm.compat import inductor_pool_state

    assert inductor_pool_state() in ("ready", "starting", "not started", "not in use")
