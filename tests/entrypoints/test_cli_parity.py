"""vLLM's command-line and EngineArgs spellings: abbreviated flags refused, `serve MODEL`,
several --served-model-name, --chat-template, human-readable --max-model-len, and vLLM's
model-source and logging options accepted where they change nothing, refused where they would."""

from __future__ import annotations

import logging

import httpx
import pytest

from compiled_llm.config import EngineArgs
from compiled_llm.config_fields import human_readable_int
from compiled_llm.entrypoints.cli.args import dataclass_from, engine_args
from compiled_llm.entrypoints.cli.main import build_parser, main
from compiled_llm.entrypoints.cli.serve import (
    ServeArgs,
    check_pooling_options,
    server_config,
    take_model_tag,
)
from compiled_llm.entrypoints.server.app import uvicorn_config
from compiled_llm.entrypoints.server.server_config import ServerConfig, load_chat_template
from tests.entrypoints.server.inprocess import MODEL, serving
from tests.entrypoints.server.inprocess import engine_args as tiny_args

TEMPLATE = "{% for m in messages %}[{{ m.content }}]{% endfor %}"


def _serve_ns(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def _serve_cfg(*argv: str) -> ServerConfig:
    ns = _serve_ns(*argv)
    take_model_tag(ns)
    return server_config(ns, engine_args(ns), dataclass_from(ServeArgs, ns))


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


# abbreviations


def test_chat_template_is_not_taken_for_its_timeout():
    ns = _serve_ns("--chat-template", "5")
    assert ns.chat_template == "5" and ns.chat_template_timeout_s == 2.0


@pytest.mark.parametrize("argv", [
    ["serve", "--chat-templ", "t.jinja"], ["serve", "--max-model", "8"],
    ["serve", "--gpu-mem", "0.5"], ["generate", "--max-tok", "4", "hi"],
    ["compile", "--output-js", "x.json"], ["bench", "latency", "--batch", "4"],
    ["bench", "throughput", "--num-prom", "4"], ["bench", "serve", "--num-prom", "4"]])
def test_every_subcommand_refuses_abbreviated_flags(argv, capsys):
    assert "unrecognized arguments" in _refused(argv, capsys)


def test_short_flags_with_attached_values_still_parse():
    assert engine_args(_serve_ns("-O0", "-tp", "1")).optimization_level == 0


# vLLM's other spellings of a flag


def test_underscored_flags_are_taken():
    args = engine_args(_serve_ns("--max_model_len", "64", "--enable_prefix_caching",
                                 "--max_num_seqs=4"))
    assert (args.max_model_len, args.enable_prefix_caching, args.max_num_seqs) == (64, True, 4)


def test_dotted_keys_build_a_json_flag():
    ns = _serve_ns("--speculative-config.method", "ngram",
                   "--speculative_config.num_speculative_tokens=3",
                   "--speculative-config.prompt_lookup_max", "4")
    assert engine_args(ns).speculative_config == {"method": "ngram", "num_speculative_tokens": 3,
                                                  "prompt_lookup_max": 4}
    ns = _serve_ns("--hf-overrides", '{"rope_scaling": {"factor": 2.0}}',
                   "--hf-overrides.rope_scaling.type", "linear")
    assert ns.hf_overrides == {"rope_scaling": {"factor": 2.0, "type": "linear"}}


def test_a_dotted_key_without_its_value_is_refused(capsys):
    assert "--speculative-config.method" in _refused(["serve", "--speculative-config.method"],
                                                     capsys)


def test_values_keep_their_underscores():
    ns = _serve_ns("--served-model-name", "my_model", "--chat-template=a_b.jinja")
    assert ns.served_model_name == ["my_model"] and ns.chat_template == "a_b.jinja"


# serve MODEL


def test_serve_takes_the_model_positionally():
    assert _serve_cfg("/m").model_name == "/m"
    ns = _serve_ns("--port", "9000", "/m", "--max-model-len", "1k")
    take_model_tag(ns)
    assert (engine_args(ns).model, ns.port, engine_args(ns).max_model_len) == ("/m", 9000, 1000)
    ns = _serve_ns("/m", "--model", "/m")
    take_model_tag(ns)
    assert engine_args(ns).model == "/m"


def test_serve_refuses_two_different_models(capsys):
    assert main(["serve", "/a", "--model", "/b"]) == 2
    assert "model: the positional MODEL '/a' and --model '/b' differ" in capsys.readouterr().err


# --served-model-name


def test_several_served_model_names():
    cfg = _serve_cfg("--model", "/m", "--served-model-name", "a", "b", "a")
    assert (cfg.model_name, cfg.extra_model_names, cfg.model_names) == ("a", ["b"], ["a", "b"])
    assert _serve_cfg("/m", "--served-model-name=x").model_names == ["x"]
    assert _serve_cfg("/m").model_names == ["/m"]


# --max-model-len


@pytest.mark.parametrize("text, value", [
    ("2048", 2048), ("1k", 1000), ("1K", 1024), ("1.5k", 1500), ("25.6k", 25600),
    ("1m", 10**6), ("1M", 1 << 20), ("2g", 2 * 10**9), ("1G", 1 << 30), (" 32K ", 32768)])
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text, value", [("1k", 1000), ("1K", 1024), ("1.5k", 1500),
                                         ("auto", None), ("-1", None), ("4096", 4096)])
def test_max_model_len_spellings(text, value):
    assert engine_args(_serve_ns("--max-model-len", text)).max_model_len == value
    assert EngineArgs(max_model_len=text).max_model_len == value


def test_max_model_len_string_bounds_the_scheduler():
    assert EngineArgs(max_model_len="1K").scheduler_config(4096).max_model_len == 1024


@pytest.mark.parametrize("text", ["1.5K", "k", "1kb", "abc", "0"])
def test_bad_max_model_len_is_refused_naming_it(text, capsys):
    with pytest.raises(ValueError, match="max_model_len"):
        EngineArgs(max_model_len=text)
    if text != "0":  # 0 parses; EngineArgs refuses it (above)
        assert "--max-model-len" in _refused(["serve", "--max-model-len", text], capsys)


def test_binary_suffix_with_decimals_says_why(capsys):
    err = _refused(["serve", "--max-model-len", "1.5K"], capsys)
    assert "decimals are not allowed" in err and "1.5k" in err


# vLLM's options that change nothing here, or are refused


def test_accepted_vllm_options():
    ns = _serve_ns("--trust-remote-code", "--tokenizer-mode", "auto", "--download-dir", "/d",
                   "--hf-overrides", "{}", "--disable-log-stats", "--no-disable-sliding-window",
                   "--uvicorn-log-level", "debug", "--disable-log-requests",
                   "--enable-log-requests")
    args = engine_args(ns)
    assert (args.trust_remote_code, args.download_dir, args.disable_log_stats) == (
        True, "/d", True)
    assert EngineArgs(trust_remote_code=True, tokenizer_mode="auto", download_dir="/d",
                      hf_overrides={}, logprobs_mode="raw_logprobs").trust_remote_code


@pytest.mark.parametrize("kwargs, field", [
    ({"revision": "main"}, "revision"), ({"tokenizer_revision": "v1"}, "tokenizer_revision"),
    ({"hf_overrides": lambda config: config}, "hf_overrides"),
    ({"disable_sliding_window": True}, "disable_sliding_window"),
    ({"tokenizer_mode": "slow"}, "tokenizer_mode"),
    ({"logprobs_mode": "processed_logprobs"}, "logprobs_mode")])
def test_unsupported_vllm_options_are_refused_naming_them(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineArgs(**kwargs)


def test_cli_refuses_unsupported_values(capsys):
    assert "invalid choice" in _refused(["serve", "--tokenizer-mode", "mistral"], capsys)
    assert main(["serve", "--revision", "main"]) == 2
    assert "error: revision:" in capsys.readouterr().err


def test_log_requests_flags():
    assert _serve_cfg("--enable-log-requests").enable_log_requests
    assert not _serve_cfg().enable_log_requests
    assert not _serve_cfg("--enable-log-requests", "--disable-log-requests").enable_log_requests


def test_uvicorn_log_level_reaches_uvicorn():
    cfg = _serve_cfg("--uvicorn-log-level", "trace")
    assert uvicorn_config(None, "127.0.0.1", 0, cfg, "warning").log_level == "trace"
    assert uvicorn_config(None, "127.0.0.1", 0, _serve_cfg(), "warning").log_level == "warning"


def test_pooling_server_refuses_what_it_cannot_do():
    check_pooling_options(ServerConfig(model_name="m"))
    for cfg, field in ((ServerConfig("m", chat_template=TEMPLATE), "chat_template"),
                       (ServerConfig("m", extra_model_names=["n"]), "served_model_name"),
                       (ServerConfig("m", enable_log_requests=True), "enable_log_requests")):
        with pytest.raises(ValueError, match=f"^{field}"):
            check_pooling_options(cfg)


# --chat-template


def test_chat_template_from_a_file_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert load_chat_template(str(path)) == TEMPLATE
    assert load_chat_template(TEMPLATE) == TEMPLATE
    assert ServerConfig("m", chat_template=str(path)).chat_template == TEMPLATE
    assert _serve_cfg("--chat-template", str(path)).chat_template == TEMPLATE
    with pytest.raises(ValueError, match="^chat_template: '5' looks like a file path"):
        _serve_cfg("--chat-template", "5")


def test_chat_template_needs_a_tokenizer():
    with pytest.raises(ValueError, match="^chat_template: needs a tokenizer"):
        _serve_cfg("--chat-template", TEMPLATE, "--skip-tokenizer-init")


# served


@pytest.fixture(scope="module")
def srv():
    # the engine takes vLLM's no-op options as LLM(...) would
    args = tiny_args(trust_remote_code=True, disable_log_stats=True, download_dir="/nowhere",
                     tokenizer_mode="auto", max_model_len="128")
    with serving(args, chat_template=TEMPLATE, extra_model_names=["alias"],
                 enable_log_requests=True) as server:
        yield server


def test_the_server_template_renders_chats_that_send_none(srv):
    chat = srv.post("/tokenize", {"messages": [{"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "yo"}]})
    text = srv.post("/tokenize", {"prompt": "[hi][yo]", "add_special_tokens": False})
    assert chat.status_code == 200 and chat.json()["tokens"] == text.json()["tokens"]
    reply = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == len(
        srv.post("/tokenize", {"prompt": "[hi]", "add_special_tokens": False}).json()["tokens"])


def test_a_request_template_is_still_refused_untrusted(srv):
    reply = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                              "chat_template": TEMPLATE, "max_tokens": 1})
    assert reply.status_code == 400 and "chat_template" in reply.text


def test_every_served_name_is_listed_and_accepted(srv):
    ids = [card["id"] for card in httpx.get(f"{srv.url}/v1/models").json()["data"]]
    assert ids[:2] == [MODEL, "alias"]
    reply = srv.post("/v1/completions", {"model": "alias", "prompt": "hi", "max_tokens": 1})
    assert reply.status_code == 200 and reply.json()["model"] == MODEL
    assert srv.post("/v1/completions", {"model": "other", "prompt": "hi",
                                        "max_tokens": 1}).status_code == 404


def test_max_model_len_string_reaches_the_engine(srv):
    assert srv.engine.max_model_len == 128


def test_requests_are_logged(srv, caplog):
    caplog.set_level(logging.INFO, logger="compiled_llm.entrypoints.server.serving")
    srv.post("/v1/completions", {"prompt": "hi", "max_tokens": 1, "temperature": 0})
    assert any(r.getMessage().startswith("Received request cmpl-") and "params:" in
               r.getMessage() for r in caplog.records)


def test_vllm_api_server_module_path_runs_serve(tmp_path, capsys):
    """`python -m compiled_llm.entrypoints.openai.api_server --model M`, vLLM's module
    command, is `serve` with the same flags."""
    import subprocess
    import sys

    from compiled_llm.entrypoints.openai import api_server

    assert api_server.main(["--model", str(tmp_path)]) == 2  # serve's own refusal
    assert "no config.json" in capsys.readouterr().err
    shown = subprocess.run([sys.executable, "-m", "compiled_llm.entrypoints.openai.api_server",
                            "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--max-model-len" in shown.stdout
    assert "--api-key" in shown.stdout
