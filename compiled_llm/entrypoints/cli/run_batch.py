"""`compiled-llm run-batch`: vLLM's offline runner of an OpenAI batch file (JSONL). Each line
goes through the server's own app in this process (httpx over ASGI, no socket), many at once
so the engine batches them; output lines keep the input's order, a bad line gets an error
line of its own."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

from compiled_llm.entrypoints.cli.args import (
    HelpFormatter,
    add_dataclass_args,
    add_engine_args,
    engine_args,
)
from compiled_llm.entrypoints.server.server_config import ServerConfig

if TYPE_CHECKING:  # imported when the command runs: `compiled-llm --help` stays fast
    import httpx
    from fastapi import FastAPI

logger = logging.getLogger(__name__)

# what the app serves (server/serving_pooling.py's POOLING_PATHS after the generation paths);
# a path the engine's runner does not serve answers the app's 400, which the line's entry takes
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/pooling",
              "/classify", "/v1/score", "/score", "/v1/rerank", "/rerank", "/v2/rerank")
# ServerConfig's fields of an HTTP server with clients, which a batch of lines has no use for
HTTP_ONLY = ("model_name", "extra_model_names", "api_key", "max_body_bytes",
             "engine_iteration_timeout_s", "allowed_origins", "allowed_methods",
             "allowed_headers", "allow_credentials", "otlp_traces_endpoint",
             "timeout_graceful_shutdown", "uvicorn_log_level", "enable_request_id_headers",
             "middleware", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `run-batch`: the files, the engine flags, and the request options of serve."""
    parser = subparsers.add_parser(
        "run-batch", formatter_class=HelpFormatter,
        usage="compiled-llm run-batch -i INPUT.jsonl -o OUTPUT.jsonl --model MODEL [options]",
        help="run an OpenAI batch file (JSONL) through the engine, results to a file",
        description="Run the requests of an OpenAI batch file through the engine, as the "
                    "server would answer them, and write one result line per input line.")
    parser.add_argument("-i", "--input-file", required=True,
                        help="the batch file: one JSON request a line, {custom_id, method, "
                             "url, body} (a local path; http(s) URLs are refused)")
    parser.add_argument("-o", "--output-file", required=True,
                        help="where the results go: one JSON line per request, in input order "
                             "(a local path; http(s) URLs are refused)")
    add_engine_args(parser)
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the model's names a line's body.model may give (default: "
                             "--model, or 'demo')")
    add_dataclass_args(parser, ServerConfig, exclude=HTTP_ONLY, title="request options")
    parser.set_defaults(func=run_batch)


def run_batch(ns: argparse.Namespace) -> int:
    """Build the engine and its app, answer every line of the input, free the engine."""
    from compiled_llm.entrypoints.server.app import build_server

    _check_files(ns.input_file, ns.output_file)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    args, cfg = _engine_and_config(ns)
    engine, app = build_server(args, cfg)
    try:
        done, failed = asyncio.run(run_lines(app, ns.input_file, ns.output_file,
                                             2 * (args.max_num_seqs or 256)))
    finally:
        engine.shutdown()
    logger.info("run-batch: %d requests, %d of them failed; results in %s", done, failed,
                ns.output_file)
    return 0


def _check_files(input_file: str, output_file: str) -> None:
    """ValueError, before any engine is built, for a URL or a file that cannot be used."""
    for flag, path in (("input_file", input_file), ("output_file", output_file)):
        if path.startswith(("http://", "https://")):
            raise ValueError(f"{flag}: {path!r}: only local files are supported (vLLM's "
                             "http(s) input and output are not)")
    if not os.path.isfile(input_file):
        raise ValueError(f"input_file: {input_file!r} is not a readable file")
    out_dir = os.path.dirname(os.path.abspath(output_file))
    if not os.path.isdir(out_dir) or os.path.isdir(output_file):
        raise ValueError(f"output_file: {output_file!r} cannot be written (no such directory, "
                         "or a directory)")


def _engine_and_config(ns: argparse.Namespace):
    """(EngineArgs, ServerConfig) of the flags, as serve builds them: serve's token budget for
    a generating engine, the user's own args for a pooling one."""
    from compiled_llm.engine.llm_engine import DEMO_MODEL
    from compiled_llm.engine.pooling_engine import resolve_runner
    from compiled_llm.entrypoints.cli.serve import (
        check_pooling_options,
        named_server_config,
        serving_defaults,
    )

    args = engine_args(ns)
    cfg = named_server_config(ns, args, ns.served_model_name)
    if resolve_runner(args, str(args.model or DEMO_MODEL)) == "pooling":
        check_pooling_options(cfg)
        return args, cfg
    return serving_defaults(args), cfg


async def run_lines(app: FastAPI, input_file: str, output_file: str,
                    concurrency: int) -> tuple[int, int]:
    """Send each request line of input_file to app, at most `concurrency` at once; write the
    entries to output_file in input order. (requests, failed ones)."""
    import httpx

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # a bug: a 500
    slots, tasks, failed = asyncio.Semaphore(concurrency), set(), 0
    with open(input_file, encoding="utf-8") as source, \
            open(output_file, "w", encoding="utf-8") as sink:
        writer = OrderedWriter(sink)

        async def answer(client: httpx.AsyncClient, index: int, number: int, line: str):
            nonlocal failed
            try:
                entry = await answer_line(client, number, line)
                failed += entry["error"] is not None
                writer.add(index, entry)
            finally:
                slots.release()

        async with httpx.AsyncClient(transport=transport, base_url="http://run-batch",
                                     timeout=None) as client:
            index = 0
            for number, line in enumerate(source, start=1):
                if not line.strip():
                    continue  # vLLM skips blank lines
                await slots.acquire()
                task = asyncio.create_task(answer(client, index, number, line))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                index += 1
            await asyncio.gather(*tasks)
    return index, failed


class OrderedWriter:
    """Writes entries as JSON lines in index order, holding those that finish early."""

    def __init__(self, sink) -> None:
        self.sink, self.next, self.held = sink, 0, {}

    def add(self, index: int, entry: dict) -> None:
        """Take entry `index`; write every entry that is next in order."""
        self.held[index] = entry
        while self.next in self.held:
            self.sink.write(json.dumps(self.held.pop(self.next)) + "\n")
            self.next += 1


class BadLine(ValueError):
    """An input line that is not a request this runner can send."""

    def __init__(self, message: str, custom_id: str | None = None) -> None:
        super().__init__(message)
        self.custom_id = custom_id


def parse_line(line: str, number: int) -> tuple[str, str, dict]:
    """(custom_id, url, body) of one input line; BadLine saying what is wrong with it."""
    try:
        request = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadLine(f"line {number}: not valid JSON ({e})") from None
    if not isinstance(request, dict):
        raise BadLine(f"line {number}: not a JSON object")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str):
        raise BadLine(f"line {number}: custom_id must be a string")
    method, url, body = request.get("method"), request.get("url"), request.get("body")
    if method != "POST":
        raise BadLine(f"line {number}: method {method!r}: only POST is supported", custom_id)
    if url not in BATCH_URLS:
        raise BadLine(f"line {number}: URL {url} was used. Supported endpoints: "
                      f"{', '.join(BATCH_URLS)}.", custom_id)
    if not isinstance(body, dict):
        raise BadLine(f"line {number}: body must be a JSON object", custom_id)
    if body.get("stream"):
        raise BadLine("Request must not be sent in stream mode", custom_id)  # vLLM's words
    return custom_id, url, body


async def answer_line(client: httpx.AsyncClient, number: int, line: str) -> dict:
    """The output entry of one input line: the app's answer, or an error entry."""
    request_id = f"batch-req-{uuid.uuid4().hex}"
    try:
        custom_id, url, body = parse_line(line, number)
    except BadLine as e:
        return entry(e.custom_id, request_id, 400, None, str(e))
    # the request id names the request to the engine (its logs) and in the reply's id
    try:
        response = await client.post(url, json=body, headers={"X-Request-Id": request_id})
    except Exception as e:  # one line's failure must not stop the others
        return entry(custom_id, request_id, 500, None, f"{type(e).__name__}: {e}")
    try:
        payload = response.json()
    except ValueError:
        payload = {"error": {"message": response.text, "type": "server_error",
                             "param": None, "code": response.status_code}}
    if response.status_code == 200:
        return entry(custom_id, request_id, 200, payload, None)
    return entry(custom_id, request_id, response.status_code, None, payload)


def entry(custom_id: str | None, request_id: str, status: int, body: Any, error: Any) -> dict:
    """One output line as vLLM writes it: {id, custom_id, response: {status_code, request_id,
    body}, error}; a refused request's error is the server's error object."""
    return {"id": f"batch-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": error}
