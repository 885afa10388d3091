"""Models and tokenizers given by Hugging Face Hub id ("org/name"), as vLLM takes them: read
from the Hub's cache (a cache laid out here; no test reaches the Hub), at a revision, named by
the id at the server; what neither a directory nor the cache holds is a ValueError by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.args import dataclass_from, engine_args
from compiled_llm.entrypoints.cli.main import build_parser
from compiled_llm.entrypoints.cli.serve import ServeArgs, server_config, take_model_tag
from compiled_llm.parallel_config import hub_id_of
from tests.utils import make_checkpoint

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> tuple[Path, Path]:
    """(a Hub cache holding org/tiny at main, the checkpoint directory it copies)."""
    ckpt, cache = make_checkpoint("qwen3"), tmp_path_factory.mktemp("hub")
    repo = cache / "models--org--tiny"
    shutil.copytree(ckpt, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache, ckpt


@pytest.fixture()
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_a_hub_id_loads_its_cached_snapshot(hub_cache):
    cache, ckpt = hub_cache
    args = EngineArgs(model="org/tiny", download_dir=str(cache), revision=COMMIT)
    assert Path(args.model) == cache / "models--org--tiny" / "snapshots" / COMMIT
    assert args.revision is None  # spent: building the args again finds a directory
    assert hub_id_of(args.model) == "org/tiny" and hub_id_of(str(cache)) is None
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    llms = [LLM(model, download_dir=str(cache), enforce_eager=True, dtype="float32")
            for model in ("org/tiny", str(ckpt))]
    outs = [llm.generate(["The quick brown"], params, use_tqdm=False)[0].outputs[0].token_ids
            for llm in llms]
    assert outs[0] == outs[1]
    assert llms[0].llm_engine.model_config.served_model_name == "org/tiny"


def test_the_server_names_the_model_by_its_id(hub_cache):
    cache, _ = hub_cache
    ns = build_parser().parse_args(["serve", "org/tiny", "--download-dir", str(cache)])
    take_model_tag(ns)
    args = engine_args(ns)
    assert server_config(ns, args, dataclass_from(ServeArgs, ns)).model_name == "org/tiny"
    assert Path(args.model).is_dir()


@pytest.mark.parametrize("kwargs, field", [
    ({"model": "org/absent"}, "model"),
    ({"model": "org/tiny", "revision": "v9"}, "model"),  # no such revision in the cache
    ({"tokenizer": "org/absent"}, "tokenizer"),
])
def test_what_the_cache_lacks_is_refused_by_name(hub_cache, offline, kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: 'org/"):
        EngineArgs(download_dir=str(hub_cache[0]), **kwargs)


def test_a_revision_for_a_local_directory_is_refused(hub_cache):
    with pytest.raises(ValueError, match="^revision: 'main' selects a Hub revision"):
        EngineArgs(model=str(hub_cache[1]), revision="main")


def test_a_draft_model_by_hub_id(hub_cache):
    cache, ckpt = hub_cache
    spec = {"model": "org/tiny", "num_speculative_tokens": 2, "revision": "main"}
    args = EngineArgs(model=str(ckpt), download_dir=str(cache), speculative_config=spec)
    assert args.speculative_config["model"].endswith(COMMIT)
    assert spec["model"] == "org/tiny"  # the caller's dict is left as it was
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = [LLM(str(ckpt), download_dir=str(cache), enforce_eager=True, dtype="float32",
                speculative_config=given).generate(["The quick"], params, use_tqdm=False)
            for given in (spec, None)]
    assert outs[0][0].outputs[0].token_ids == outs[1][0].outputs[0].token_ids


def test_revisions_default_as_vllms(hub_cache, offline):
    """tokenizer_revision alone: the model's tokenizer at that revision; a tokenizer by id
    takes the model's revision when it has none of its own."""
    cache, ckpt = hub_cache
    args = EngineArgs(model=str(ckpt), tokenizer="org/tiny", download_dir=str(cache))
    assert args.tokenizer.endswith(COMMIT)
    args = EngineArgs(model="org/tiny", tokenizer_revision=COMMIT, download_dir=str(cache))
    assert args.tokenizer == args.model and args.tokenizer_revision is None
    args = EngineArgs(model="org/tiny", tokenizer="org/tiny", revision=COMMIT,
                      download_dir=str(cache))  # the tokenizer at the model's revision
    assert args.tokenizer == args.model


def test_a_cached_snapshot_without_its_weights_is_not_taken(tmp_path, offline):
    repo = tmp_path / "models--org--bare"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    with pytest.raises(ValueError, match="^model: 'org/bare' .* could not be had"):
        EngineArgs(model="org/bare", download_dir=str(tmp_path))
    assert EngineArgs(tokenizer="org/bare", download_dir=str(tmp_path)).tokenizer.endswith(
        COMMIT)  # a tokenizer needs no weights
