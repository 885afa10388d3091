"""vLLM's serve flags and attributes that launch scripts and clients rely on: the key on /v1
alone, --host's all-interfaces default, -dp, --max-log-len, the structured-outputs backend,
--disable-frontend-multiprocessing, --enable-request-id-headers, --limit-mm-per-prompt,
--ssl-*, --middleware; SamplingParams.all_stop_token_ids / bad_words_token_ids and
RequestOutput.multi_modal_placeholders."""

from __future__ import annotations

import datetime
import logging
import socket
import ssl
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.cli.args import dataclass_from, engine_args
from compiled_llm.entrypoints.cli.main import build_parser, main
from compiled_llm.entrypoints.cli.serve import ServeArgs, in_process_core
from compiled_llm.entrypoints.server.api_server import reuse_port_socket
from compiled_llm.entrypoints.server.app import uvicorn_config
from compiled_llm.entrypoints.server.server_config import ServerConfig
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import SamplingParams
from tests.entrypoints.server.conftest import _free_port
from tests.entrypoints.server.inprocess import MODEL, serving

HERE = __name__  # the middleware below, by import path


class StampMiddleware:
    """An ASGI middleware class, as --middleware takes it."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        async def stamped(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"x-stamp", b"class")]}
            await send(message)

        await self.app(scope, receive, send if scope["type"] != "http" else stamped)


async def stamp_function(request, call_next):
    """An `async def (request, call_next)` middleware, as --middleware takes it."""
    response = await call_next(request)
    response.headers["x-stamp-fn"] = "function"
    return response


def _ns(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def _cfg(*argv: str) -> ServerConfig:
    return dataclass_from(ServerConfig, _ns(*argv), model_name="m")


# flags accepted at parse time, with their values checked


def test_vllm_flags_parse():
    ns = _ns("-dp", "1", "--max-log-len", "5", "--structured-outputs-config",
             '{"backend": "xgrammar"}', "--guided-decoding-backend", "auto",
             "--disable-frontend-multiprocessing", "--enable-request-id-headers",
             "--limit-mm-per-prompt", '{"image": 0, "video": 0}', "--middleware",
             f"{HERE}.StampMiddleware", "--middleware", f"{HERE}.stamp_function",
             "--ssl-cert-reqs", "0")
    args, opts = engine_args(ns), dataclass_from(ServeArgs, ns)
    assert (args.data_parallel_size, args.limit_mm_per_prompt) == (1, {"image": 0, "video": 0})
    assert args.structured_outputs_config == {"backend": "xgrammar"}
    assert opts.disable_frontend_multiprocessing and opts.host is None
    cfg = dataclass_from(ServerConfig, ns, model_name="m")
    assert (cfg.max_log_len, cfg.enable_request_id_headers) == (5, True)
    assert cfg.middleware == [f"{HERE}.StampMiddleware", f"{HERE}.stamp_function"]
    dotted = engine_args(_ns("--structured-outputs-config.backend", "auto"))
    assert dotted.structured_outputs_config == {"backend": "auto"}


@pytest.mark.parametrize("kwargs, field", [
    ({"data_parallel_size": 2}, "data_parallel_size"),
    ({"structured_outputs_config": {"backend": "outlines"}}, "structured_outputs_config"),
    ({"structured_outputs_config": {"disable_additional_properties": True}},
     "structured_outputs_config"),
    ({"guided_decoding_backend": "guidance"}, "guided_decoding_backend"),
    ({"guided_decoding_backend": "lm-format-enforcer"}, "guided_decoding_backend"),
    ({"limit_mm_per_prompt": {"image": -1}}, "limit_mm_per_prompt"),
    ({"limit_mm_per_prompt": {"image": "2"}}, "limit_mm_per_prompt"),
    ({"limit_mm_per_prompt": [1]}, "limit_mm_per_prompt")])
def test_values_we_cannot_follow_are_refused_naming_the_flag(kwargs, field):
    """EngineArgs is what LLM(...) builds too: the same keys, the same refusals."""
    with pytest.raises(ValueError, match=f"^{field}"):
        EngineArgs(**kwargs)


def test_accepted_values_through_engine_args():
    args = EngineArgs(structured_outputs_config={"backend": "auto", "disable_fallback": True,
                                                 "disable_any_whitespace": True},
                      guided_decoding_backend="xgrammar", limit_mm_per_prompt={"image": 0},
                      data_parallel_size=1)
    assert args.limit_mm_per_prompt == {"image": 0}


def test_cli_refuses_data_parallelism_by_name(capsys):
    assert main(["serve", "-dp", "2"]) == 2
    assert "data_parallel_size 2" in capsys.readouterr().err


def test_disable_frontend_multiprocessing_runs_the_core_in_process():
    args = EngineArgs()
    opts = ServeArgs(disable_frontend_multiprocessing=True)
    assert in_process_core(args, opts).engine_core_process is False
    assert in_process_core(args, ServeArgs()) is args
    with pytest.raises(ValueError, match="^disable_frontend_multiprocessing"):
        in_process_core(EngineArgs(engine_core_process=True), opts)


@pytest.mark.parametrize("argv, field", [
    (("--max-log-len", "-1"), "max_log_len"), (("--middleware", "nodots"), "middleware"),
    (("--ssl-cert-reqs", "3"), "ssl_cert_reqs"),
    (("--ssl-keyfile", "/no/such.key"), "ssl_keyfile"),
    (("--ssl-certfile", "/no/such.pem"), "ssl_certfile")])
def test_bad_server_values_are_refused_naming_them(argv, field):
    with pytest.raises(ValueError, match=f"^{field}"):
        _cfg(*argv)


# --host


def test_host_defaults_to_every_interface():
    assert ServeArgs().host is None
    assert uvicorn_config(None, None, 0, ServerConfig("m")).host == "0.0.0.0"
    assert uvicorn_config(None, "127.0.0.1", 0, ServerConfig("m")).host == "127.0.0.1"
    sock = reuse_port_socket(None, 0)  # what each of several API servers binds
    try:
        assert sock.getsockname()[0] == "0.0.0.0"
        sock.listen()
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=5):
            pass  # local clients (bench serve, tests) still reach it
    finally:
        sock.close()


# --ssl-*


def _self_signed(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    keyfile, certfile = tmp_path / "key.pem", tmp_path / "cert.pem"
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(keyfile), str(certfile)


def test_ssl_flags_serve_https(tmp_path):
    pytest.importorskip("cryptography")
    keyfile, certfile = _self_signed(tmp_path)
    cfg = _cfg("--ssl-keyfile", keyfile, "--ssl-certfile", certfile)
    app = FastAPI()
    app.get("/ok")(lambda: {"ok": True})
    port = _free_port()
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, cfg, "warning"))
    assert server.config.ssl_certfile == certfile and server.config.ssl_cert_reqs == 0
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        verify = ssl.create_default_context(cafile=certfile)
        r = httpx.get(f"https://localhost:{port}/ok", verify=verify, timeout=10)
        assert r.json() == {"ok": True}
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
            httpx.get(f"http://127.0.0.1:{port}/ok", timeout=5)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# one in-process server: auth scope, request-id headers, middleware, request logging


@pytest.fixture(scope="module")
def srv():
    with serving(api_key="k", enable_request_id_headers=True, enable_log_requests=True,
                 max_log_len=2, middleware=[f"{HERE}.StampMiddleware",
                                            f"{HERE}.stamp_function"]) as s:
        yield s


def test_the_key_guards_v1_alone(srv):
    assert httpx.post(f"{srv.url}/tokenize", json={"prompt": "hi"}).status_code == 200
    assert httpx.post(f"{srv.url}/detokenize", json={"tokens": [5]}).status_code == 200
    assert httpx.get(f"{srv.url}/v1/models").status_code == 401
    assert httpx.get(f"{srv.url}/v1/models", headers=srv.headers).status_code == 200


def test_request_id_header_is_echoed_or_made(srv):
    r = httpx.get(f"{srv.url}/v1/models", headers={**srv.headers, "X-Request-Id": "abc-1"})
    assert r.headers["x-request-id"] == "abc-1"
    made = httpx.get(f"{srv.url}/health").headers["x-request-id"]
    assert len(made) == 32 and int(made, 16) >= 0
    assert httpx.get(f"{srv.url}/v1/models").headers["x-request-id"]  # a 401 carries one too
    stream = httpx.post(f"{srv.url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True},
        headers={**srv.headers, "X-Request-Id": "s-2"})
    assert stream.status_code == 200 and stream.headers["x-request-id"] == "s-2"


def test_user_middleware_class_and_function(srv):
    r = httpx.get(f"{srv.url}/health")
    assert (r.headers["x-stamp"], r.headers["x-stamp-fn"]) == ("class", "function")


def test_max_log_len_truncates_logged_prompt_ids(srv, caplog):
    caplog.set_level(logging.INFO, logger="compiled_llm.entrypoints.server.serving")
    r = srv.post("/v1/completions", {"prompt": [11, 12, 13, 14, 15], "max_tokens": 1})
    assert r.status_code == 200, r.text
    logged = [rec.getMessage() for rec in caplog.records if "Received request" in
              rec.getMessage()]
    assert logged and "prompt_token_ids: [11, 12]," in logged[-1]


def test_multimodal_input_stays_refused_with_limit_mm_per_prompt(srv):
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": [image]}],
                                          "max_tokens": 1})
    assert r.status_code == 400, r.text


# vLLM's attributes


def test_all_stop_token_ids_and_bad_words_token_ids(srv):
    """Filled on the engine's copy as vLLM's processor fills them; the caller's own is left
    as it was (stop_token_ids alone, no bad-word ids before the engine tokenizes them)."""
    params = SamplingParams(stop_token_ids=[7], bad_words=["hello"], max_tokens=1)
    assert params.all_stop_token_ids == {7} and params.bad_words_token_ids is None
    inputs = srv.engine.engine.inputs
    child = inputs.process("rid", {"prompt_token_ids": [1, 2]}, params)[0]
    engine_params = child.sampling_params
    assert engine_params.all_stop_token_ids == {7, *inputs.eos_token_ids}
    assert inputs.eos_token_ids and engine_params.bad_words_token_ids
    assert all(isinstance(t, int) for seq in engine_params.bad_words_token_ids for t in seq)
    assert params.all_stop_token_ids == {7} and params.bad_words_token_ids is None
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({"eos_token_id": [2, 3]}, 2)
    assert ignoring.all_stop_token_ids == {2, 3} and ignoring.stop_token_ids == []


def test_request_output_multi_modal_placeholders():
    out = RequestOutput("r", "p", [1], None, [], True)
    assert out.multi_modal_placeholders == {}
    assert RequestOutput("r", "p", [1], None, [], True, multi_modal_placeholders={}) == out
