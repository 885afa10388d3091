"""The cold start's side-by-side Triton compiles: the dry pass's hook hands each kernel to the
compile children once and skips its launch, lets Triton compile elsewhere, and is wanted only
on a cold lone CUDA worker with the switch on."""

from types import SimpleNamespace

import pytest
import torch

from compiled_llm.worker import precompile
from compiled_llm.worker.compile_children import CompileChildren
from tests.worker import compile_child_fixture as fixture


def _hook_args(kernel, key: str, spec: str) -> dict:
    info = type("Info", (), {"jit_function": kernel})()
    return {"key": key, "fn": info, "compile": {"specialization_data": spec}}


def test_hook_compiles_in_place_outside_a_dry_pass(tmp_path):
    assert precompile._hook(**_hook_args(fixture.kernel, "a", str(tmp_path / "a"))) is None


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_dry_pass_hands_each_specialization_once_to_the_children(tmp_path):
    children = CompileChildren(2, None)
    with precompile.dry_launches(children) as queue:
        for key in ("a", "a", "b"):  # a launch skipped and queued, once per specialization
            assert precompile._hook(**_hook_args(fixture.kernel, key, str(tmp_path / key)))
        assert precompile._hook(fn=None) is None  # unknown arguments: compile in place
        assert precompile._hook(**_hook_args(fixture.broken, "c", str(tmp_path / "c")))
    assert (tmp_path / "a").read_text() == (tmp_path / "b").read_text() == "compiled"
    assert children.submitted == 3 and len(queue.kernels) == 3
    assert queue.errors == ["RuntimeError: cannot compile"]
    assert all(child.returncode == 0 for child in children.children)
    assert precompile._hook(**_hook_args(fixture.kernel, "d", str(tmp_path / "d"))) is None


def test_a_stuck_child_is_stopped_and_its_kernel_reported(tmp_path):
    children = CompileChildren(1, None)
    children.submit(fixture.__name__, "kernel", str(tmp_path / "a"))
    children.submit(fixture.__name__, "stuck", str(tmp_path / "b"))
    errors = children.wait(timeout_s=20)
    assert (tmp_path / "a").read_text() == "compiled"  # answered despite the chatter
    assert errors == ["no answer: a compile child exited early or was stopped"]
    assert children.children[0].returncode != 0


def _runner(device: str, warm: bool, step_hook=None):
    backend = SimpleNamespace(graphs=["snapshot"] if warm else [])
    return SimpleNamespace(device=torch.device(device), step_hook=step_hook,
                           forward_fn=SimpleNamespace(backend=backend))


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_wanted_only_on_a_cold_lone_cuda_worker(monkeypatch):
    monkeypatch.delenv(precompile.ENV, raising=False)
    assert precompile.wanted(_runner("cuda", warm=False))
    assert not precompile.wanted(_runner("cpu", warm=False))
    assert not precompile.wanted(_runner("cuda", warm=True))  # the snapshot came from cache
    assert not precompile.wanted(_runner("cuda", warm=False, step_hook=object()))
    monkeypatch.setenv(precompile.ENV, "off")
    assert not precompile.wanted(_runner("cuda", warm=False))
