"""`compiled-llm chat` and `compiled-llm complete`: vLLM's clients of a running
OpenAI-compatible server (this one's `serve`, or any other), over httpx. Each streams the
reply to stdout: one message with -q, else one per line of stdin until EOF or Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from compiled_llm.entrypoints.cli.args import HelpFormatter

if TYPE_CHECKING:  # httpx is imported when a command runs: `compiled-llm --help` stays fast
    import httpx

DEFAULT_URL = "http://localhost:8000/v1"
# seconds: a reply may take long (the openai client's default read timeout), a connection not
READ_TIMEOUT_S, CONNECT_TIMEOUT_S = 600.0, 10.0


class RequestFailed(Exception):
    """A request the server refused or could not be sent; its message says why."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `chat` and `complete`, with vLLM's flags."""
    chat = subparsers.add_parser(
        "chat", formatter_class=HelpFormatter, usage="compiled-llm chat [options]",
        help="chat with a running OpenAI-compatible server",
        description="Generate chat completions via the running API server.")
    _add_query_options(chat)
    chat.add_argument("--system-prompt", default=None,
                      help="a system message put first in the conversation")
    chat.add_argument("-q", "--quick", metavar="MESSAGE", default=None,
                      help="send MESSAGE alone, print the reply and exit")
    chat.add_argument("--stats", action="store_true",
                      help="print TTFT and TPS after each reply")
    chat.set_defaults(func=run_chat)
    complete = subparsers.add_parser(
        "complete", formatter_class=HelpFormatter, usage="compiled-llm complete [options]",
        help="complete prompts with a running OpenAI-compatible server",
        description="Generate text completions of prompts via the running API server.")
    _add_query_options(complete)
    complete.add_argument("--max-tokens", type=int, default=None,
                          help="most tokens to generate per completion (default: the "
                               "server's)")
    complete.add_argument("-q", "--quick", metavar="PROMPT", default=None,
                          help="complete PROMPT alone, print the completion and exit")
    complete.add_argument("--stats", action="store_true",
                          help="print TTFT and TPS after each completion")
    complete.set_defaults(func=run_complete)


def _add_query_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=DEFAULT_URL,
                        help="base URL of the running OpenAI-compatible API server")
    parser.add_argument("--model-name", default=None,
                        help="the model to ask (default: the first one GET /models lists)")
    parser.add_argument("--api-key", default=None,
                        help="sent as `Authorization: Bearer KEY` (default: $OPENAI_API_KEY, "
                             "else EMPTY)")


def run_chat(ns: argparse.Namespace) -> int:
    """A conversation: -q's one message, else one per stdin line; replies are streamed."""
    client, model = _connect(ns)
    if client is None:
        return 1
    history: list[dict] = []
    if ns.system_prompt is not None:
        history.append({"role": "system", "content": ns.system_prompt})
    body: dict = {"model": model, "stream": True, **_usage_option(ns.stats)}

    def turn(message: str) -> None:
        history.append({"role": "user", "content": message})
        try:
            reply = _stream(client, "chat/completions", {**body, "messages": history},
                            _chat_text, ns.stats)
        except BaseException:  # the turn did not happen: the next one goes without it
            history.pop()
            raise
        history.append({"role": "assistant", "content": reply})

    return _run(client, turn, ns.quick, "Please enter a message for the chat model:")


def run_complete(ns: argparse.Namespace) -> int:
    """Completions of -q's prompt, else of each stdin line; each is streamed."""
    client, model = _connect(ns)
    if client is None:
        return 1
    body: dict = {"model": model, "stream": True, **_usage_option(ns.stats)}
    if ns.max_tokens:
        body["max_tokens"] = ns.max_tokens

    def turn(prompt: str) -> None:
        _stream(client, "completions", {**body, "prompt": prompt}, _completion_text, ns.stats)

    return _run(client, turn, ns.quick, "Please enter prompt to complete:")


def _connect(ns: argparse.Namespace) -> tuple[httpx.Client | None, str]:
    """The client of ns.url and the model to ask (printed); (None, "") with the error said."""
    import httpx

    key = ns.api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
    # a trailing slash makes paths relative to the URL's own (…/v1/ + chat/completions)
    client = httpx.Client(base_url=ns.url.rstrip("/") + "/",
                          timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
                          headers={"Authorization": f"Bearer {key}"})
    model = ns.model_name
    try:
        model = model or _first_model(client)
    except RequestFailed as e:
        client.close()
        print(f"error: {e}", file=sys.stderr)
        return None, ""
    print(f"Using model: {model}", flush=True)
    return client, model


def _first_model(client: httpx.Client) -> str:
    import httpx

    try:
        response = client.get("models")
    except httpx.HTTPError as e:
        raise RequestFailed(f"cannot reach {client.base_url}: {e}") from None
    if response.status_code != 200:
        raise RequestFailed(f"GET {response.url}: {_error_text(response)}")
    models = response.json().get("data") or []
    if not models:
        raise RequestFailed(f"GET {response.url} lists no model")
    return models[0]["id"]


def _usage_option(stats: bool) -> dict:
    return {"stream_options": {"include_usage": True}} if stats else {}


def _run(client: httpx.Client, turn: Callable[[str], None], quick: str | None,
         intro: str) -> int:
    """quick's one turn, else the stdin loop; the client closed after."""
    try:
        return _loop(intro, turn) if quick is None else _once(turn, quick)
    finally:
        client.close()


def _once(turn: Callable[[str], None], text: str) -> int:
    """-q: one turn; 1 when it failed."""
    try:
        turn(text)
    except RequestFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print()
    return 0


def _loop(intro: str, turn: Callable[[str], None]) -> int:
    """A turn per line of stdin until EOF or Ctrl-C; a failed turn is reported, not fatal."""
    print(intro, flush=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        except KeyboardInterrupt:
            print()
            return 0
        try:
            turn(line)
        except RequestFailed as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:  # a reply cut off: Ctrl-C leaves, as at the prompt
            print()
            return 0


def _chat_text(event: dict) -> str | None:
    choices = event.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content")


def _completion_text(event: dict) -> str | None:
    return (event.get("choices") or [{}])[0].get("text")


def _stream(client: httpx.Client, path: str, body: dict,
            text_of: Callable[[dict], str | None], stats: bool) -> str:
    """POST a streaming request, print its text as it comes (then a newline); the text."""
    import httpx

    start, first, tokens, parts = time.perf_counter(), None, 0, []
    try:
        with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RequestFailed(f"POST {response.url}: {_error_text(response)}")
            for event in _events(response):
                if "error" in event:  # an error after the stream began
                    print(flush=True)
                    raise RequestFailed(_error_text(event))
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
                text = text_of(event)
                if text:
                    first = first if first is not None else time.perf_counter() - start
                    parts.append(text)
                    print(text, end="", flush=True)
    except httpx.HTTPError as e:
        if parts:  # the reply was cut off: its line ends here
            print(flush=True)
        raise RequestFailed(f"{type(e).__name__}: {e}") from None
    print(flush=True)
    if stats and first is not None:
        elapsed = time.perf_counter() - start
        print(f"TTFT: {first * 1000:.2f} ms")
        print(f"TPS:  {tokens / elapsed:.2f} tokens/s ({tokens} tokens in {elapsed:.2f}s)")
    return "".join(parts)


def _events(response: httpx.Response) -> Iterator[dict]:
    """The JSON payloads of an event stream's data lines (serve_client.sse_split's), up to
    [DONE]."""
    from compiled_llm.entrypoints.cli.serve_client import sse_split

    pending = b""
    for chunk in response.iter_bytes():
        lines, pending = sse_split(pending + chunk)
        for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            yield json.loads(data)


def _error_text(source: httpx.Response | dict) -> str:
    """The message of an OpenAI error object (a response's body, or a stream's event)."""
    if isinstance(source, dict):
        payload, prefix = source, ""
    else:
        try:
            payload = source.json()
        except ValueError:
            return f"HTTP {source.status_code}: {source.text[:500]}"
        prefix = f"HTTP {source.status_code}: "
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else error or payload
    return f"{prefix}{message}"
