"""Out-of-tree models: `ModelRegistry.register_model` (a class or a lazy "module:Class"), and
general plugins found by entry point and filtered by COMPILED_LLM_PLUGINS."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest

from compiled_llm import LLM, ModelRegistry, SamplingParams
from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.plugins import load_general_plugins, reset_plugins
from tests.utils import make_checkpoint, random_prompts

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PLUGIN = "myplugin"


class MyLlamaForCausalLM(LlamaForCausalLM):
    """An out-of-tree architecture: Llama under a name of its own."""


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Each test registers into a copy of the registry and sees the plugins load afresh."""
    monkeypatch.setattr(ModelRegistry, "models", dict(ModelRegistry.models))
    monkeypatch.delenv("COMPILED_LLM_PLUGINS", raising=False)
    reset_plugins()
    yield
    reset_plugins()
    sys.modules.pop(PLUGIN, None)


def renamed_checkpoint(tmp_path: Path, arch: str) -> Path:
    """The tiny Llama checkpoint with config.json's `architectures` rewritten to [arch]."""
    out = tmp_path / arch
    shutil.copytree(make_checkpoint("llama"), out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": [arch]}))
    return out


def greedy(llm: LLM) -> list[list[int]]:
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=20, seed=5)]
    return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference_tokens() -> list[list[int]]:
    return greedy(LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32"))


def make_plugin(root: Path, arch: str, entries: dict[str, str]) -> None:
    """An installed-looking package under root: myplugin/ and its dist-info with entry points."""
    (root / PLUGIN).mkdir(parents=True)
    (root / PLUGIN / "__init__.py").write_text(
        "from compiled_llm import ModelRegistry\n"
        "from compiled_llm.models.llama import LlamaForCausalLM\n\n\n"
        "class PluginLlama(LlamaForCausalLM):\n    pass\n\n\n"
        f"def register():\n    ModelRegistry.register_model({arch!r}, PluginLlama)\n\n\n"
        "def broken():\n    raise RuntimeError('this plugin is broken')\n")
    info = root / f"{PLUGIN}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0.1\n")
    lines = [f"{name} = {PLUGIN}:{func}" for name, func in entries.items()]
    (info / "entry_points.txt").write_text("[compiled_llm.general_plugins]\n" + "\n".join(lines))


def test_registered_class_generates_like_the_builtin(tmp_path, reference_tokens):
    ModelRegistry.register_model("MyLlamaForCausalLM", MyLlamaForCausalLM)
    assert "MyLlamaForCausalLM" in ModelRegistry.get_supported_archs()
    llm = LLM(model=str(renamed_checkpoint(tmp_path, "MyLlamaForCausalLM")), enforce_eager=True,
              dtype="float32")
    assert type(llm.engine.executor.worker.runner.model) is MyLlamaForCausalLM
    assert greedy(llm) == reference_tokens


def test_lazy_reference_imports_on_first_use(tmp_path, monkeypatch):
    (tmp_path / "lazy_llama_models.py").write_text(
        "from compiled_llm.models.llama import LlamaForCausalLM\n\n\n"
        "class LazyLlama(LlamaForCausalLM):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_llama_models", raising=False)
    ModelRegistry.register_model("LazyLlamaForCausalLM", "lazy_llama_models:LazyLlama")
    assert "lazy_llama_models" not in sys.modules
    cls = ModelRegistry.resolve_model_cls(["LazyLlamaForCausalLM"])
    assert cls.__name__ == "LazyLlama" and issubclass(cls, LlamaForCausalLM)
    assert sys.modules["lazy_llama_models"].LazyLlama is cls


def test_reregistering_overrides_with_a_warning(caplog):
    ModelRegistry.register_model("MyLlamaForCausalLM", LlamaForCausalLM)
    with caplog.at_level(logging.WARNING, logger="compiled_llm.models"):
        ModelRegistry.register_model("MyLlamaForCausalLM", MyLlamaForCausalLM)
    assert "already registered" in caplog.text
    assert ModelRegistry.resolve_model_cls("MyLlamaForCausalLM") is MyLlamaForCausalLM


@pytest.mark.parametrize(("arch", "model_cls", "names"), [
    (None, MyLlamaForCausalLM, "arch"),
    ("", MyLlamaForCausalLM, "arch"),
    ("MyLlamaForCausalLM", "tests.models.test_plugins.MyLlamaForCausalLM", "model_cls"),
    ("MyLlamaForCausalLM", "a:b:c", "model_cls"),
    ("MyLlamaForCausalLM", object(), "model_cls"),
])
def test_invalid_registration_names_the_argument(arch, model_cls, names):
    with pytest.raises(ValueError, match=names):
        ModelRegistry.register_model(arch, model_cls)
    assert "MyLlamaForCausalLM" not in ModelRegistry.get_supported_archs()


def test_plugin_by_entry_point_loads_through_llm(tmp_path, monkeypatch, caplog, reference_tokens):
    make_plugin(tmp_path, "PluginLlamaForCausalLM", {"broken": "broken", "mine": "register"})
    ckpt = renamed_checkpoint(tmp_path, "PluginLlamaForCausalLM")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.ERROR, logger="compiled_llm.models.plugins"):
        llm = LLM(model=str(ckpt), enforce_eager=True, dtype="float32")
    assert "plugin broken raised" in caplog.text  # logged and skipped, the others still load
    assert type(llm.engine.executor.worker.runner.model) is sys.modules[PLUGIN].PluginLlama
    assert greedy(llm) == reference_tokens


@pytest.mark.parametrize(("allowed", "loads"), [("mine", True), ("other,broken", False),
                                                ("", False), (" mine , other", True)])
def test_plugins_env_var_filters_by_name(tmp_path, monkeypatch, allowed, loads):
    make_plugin(tmp_path, "PluginLlamaForCausalLM", {"mine": "register"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("COMPILED_LLM_PLUGINS", allowed)
    load_general_plugins()
    assert ("PluginLlamaForCausalLM" in ModelRegistry.get_supported_archs()) is loads


def test_plugins_load_once_per_process(tmp_path, monkeypatch):
    make_plugin(tmp_path, "PluginLlamaForCausalLM", {"mine": "register"})
    monkeypatch.syspath_prepend(str(tmp_path))
    load_general_plugins()
    ModelRegistry.models.pop("PluginLlamaForCausalLM")
    load_general_plugins()  # already done: the plugin does not run again
    assert "PluginLlamaForCausalLM" not in ModelRegistry.get_supported_archs()


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    with pytest.raises(ValueError, match=r"NopeForCausalLM.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        ModelRegistry.resolve_model_cls(["NopeForCausalLM"])
    ckpt = renamed_checkpoint(tmp_path, "NopeForCausalLM")
    with pytest.raises(ValueError, match=r"NopeForCausalLM.*supported: \[.*'LlamaForCausalLM'"):
        LLM(model=str(ckpt), enforce_eager=True, dtype="float32")
