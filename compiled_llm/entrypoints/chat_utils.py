"""Chat messages to prompt text, shared by LLM.chat and the server: messages normalised and
checked (content a string, text parts or None), the tokenizer's chat template rendered in its
jinja sandbox under a time limit and an output-size limit."""

from __future__ import annotations

import ctypes
import functools
import inspect
import json
import threading
from collections.abc import Iterable
from typing import Any

from compiled_llm.sampling_params import check_text


def join_text_parts(texts: Iterable[str]) -> str:
    """A message's text parts as one string: joined by newlines, as vLLM's "string" content
    format (chat, LLM.chat and the Responses API's input items alike)."""
    return "\n".join(texts)


def conversation(messages: list) -> list[dict[str, Any]]:
    """The messages as template input: each a dict with a str role and a str content (None
    becomes "", a list of {"type": "text", "text": ...} parts is joined by newlines); an
    assistant's tool_calls with their arguments (OpenAI's JSON string) made dicts, as vLLM and
    the chat templates have them; ValueError naming the field otherwise. Other keys (name,
    tool_call_id ...) are kept."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of messages")
    return [_message(i, message) for i, message in enumerate(messages)]


def _message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be a dict with role and content")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"{where}.role must be a non-empty string, got {role!r}")
    checked = {**message, "role": check_text(f"{where}.role", role),
               "content": check_text(f"{where}.content", _content_text(where, message))}
    calls = message.get("tool_calls")
    if role == "assistant" and calls is not None:
        if not isinstance(calls, list):
            raise ValueError(f"{where}.tool_calls must be a list of tool calls")
        checked["tool_calls"] = [_tool_call(f"{where}.tool_calls[{j}]", call)
                                 for j, call in enumerate(calls)]
    return checked


def _tool_call(where: str, call: Any) -> dict[str, Any]:
    """A tool call of the history with its arguments parsed: templates iterate them
    (`arguments|items`) or encode them (`arguments|tojson`, which a string would encode
    twice). Absent or empty arguments are {} (vLLM's _postprocess_messages)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ValueError(f'{where} must be {{"type": "function", "function": {{"name": ..., '
                         '"arguments": ...}}')
    arguments = function.get("arguments")
    if not arguments:
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}.function.arguments is not valid JSON: {exc}") from None
    return {**call, "function": {**function, "arguments": arguments}}


# OpenAI's and vLLM's non-text content parts: refused by name (multimodal input is not taken)
MEDIA_PARTS = ("image_url", "input_image", "image", "image_embeds", "input_audio", "audio_url",
               "audio", "video_url", "video", "file", "input_file")


def _content_text(where: str, message: dict) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PARTS:
                raise ValueError(f"{where}.content[{j}]: {kind} content parts are not "
                                 "supported (multimodal input: this is a text-only engine)")
        if all(isinstance(part, dict) and part.get("type") == "text"
               and isinstance(part.get("text"), str) for part in content):
            return join_text_parts(part["text"] for part in content)
    raise ValueError(f"{where}.content must be a string, a list of text parts or None")


# vLLM's reasoning_effort values (chat completions' field, the Responses API's reasoning.effort)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def with_reasoning_effort(template_kwargs: dict[str, Any] | None,
                          effort: str | None) -> dict[str, Any] | None:
    """template_kwargs with a request's reasoning effort, as vLLM renders it: a template
    variable `reasoning_effort`, and `enable_thinking` off for "none", on otherwise, unless
    the kwargs set it (a template that reads neither renders as before)."""
    if effort is None:
        return template_kwargs
    merged = {**(template_kwargs or {}), "reasoning_effort": effort}
    merged.setdefault("enable_thinking", effort != "none")
    return merged


@functools.cache
def _reserved(tokenizer_cls: type) -> frozenset[str]:
    """apply_chat_template's own parameters: not template variables a request may set."""
    params = inspect.signature(tokenizer_cls.apply_chat_template).parameters
    return frozenset(name for name, param in params.items()
                     if name != "self" and param.kind is not param.VAR_KEYWORD)


def render(tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
           tools: list | None = None, template_kwargs: dict | None = None,
           chat_template: str | None = None, timeout_s: float = 2.0,
           max_chars: int | None = None, continue_final_message: bool = False) -> str:
    """The chat template (the tokenizer's, or chat_template) applied to messages, as text
    (with continue_final_message, cut after the last message's content). ValueError when
    the template fails, runs past timeout_s (it is interrupted: the calling thread is never
    held longer) or renders more than max_chars characters."""
    extra = dict(template_kwargs or {})
    documents = extra.pop("documents", None)  # the template's RAG documents (vLLM's field)
    if documents is not None and not isinstance(documents, list):
        raise ValueError(f"documents must be a list of dicts, got {type(documents).__name__}")
    clash = sorted(set(extra) & _reserved(type(tokenizer)))
    if clash:
        raise ValueError(f"chat_template_kwargs.{clash[0]}: an argument of the template call "
                         "that a request cannot set")
    try:
        with Deadline(timeout_s):
            text = tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=chat_template, tokenize=False,
                add_generation_prompt=add_generation_prompt, documents=documents,
                continue_final_message=continue_final_message, **extra)
    except (TimeoutError, _Expired):  # _Expired: it fired as the render was returning
        raise ValueError(f"messages: the chat template ran past {timeout_s:g} s") from None
    except Exception as exc:  # jinja raise_exception, undefined names, bad roles ...
        raise ValueError(f"messages: the chat template failed: {exc}") from None
    if max_chars is not None and len(text) > max_chars:
        raise ValueError(f"messages: the chat template rendered {len(text)} characters, "
                         f"more than {max_chars}")
    return text


_PROBE = "\u2063probe\u2063"
_TAKES_PARTS: dict[str, bool] = {}  # template text -> whether it reads content as parts


def resolved_format(tokenizer, chat_template: str | None, content_format: str) -> str:
    """"openai" where contents reach the template as lists of text parts: asked for, or
    content_format "auto" (vLLM's detection) and a template that reads only parts; else
    "string"."""
    if content_format == "openai" or (content_format == "auto"
                                      and takes_parts(tokenizer, chat_template)):
        return "openai"
    return "string"


def takes_parts(tokenizer, chat_template: str | None = None) -> bool:
    """Whether the template drops a string content and renders a list of text parts (a
    multimodal model's, vLLM's "openai" content format): its messages then get their content
    as one text part. Found once per template by rendering a probe message both ways."""
    template = chat_template or getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return False
    if template not in _TAKES_PARTS:
        def shows(content: Any) -> bool:
            try:
                with Deadline(2.0):
                    return _PROBE in tokenizer.apply_chat_template(
                        [{"role": "user", "content": content}], chat_template=template,
                        tokenize=False, add_generation_prompt=True)
            except (Exception, _Expired):  # a template that needs more than one message
                return False

        _TAKES_PARTS[template] = not shows(_PROBE) and shows([{"type": "text", "text": _PROBE}])
    return _TAKES_PARTS[template]


class _Expired(BaseException):
    """Raised inside a render that ran past its deadline; a BaseException so that no
    `except Exception` in the template machinery swallows it."""


class Deadline:
    """Interrupts the thread that entered it if it is still inside after timeout_s, by an
    asynchronous exception (what bounds pure-Python work such as a jinja loop); leaving it
    in time cancels the interrupt, one that is pending included. Raises TimeoutError."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._inside = self._fired = False
        self._thread_id = 0
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Deadline:
        self._thread_id, self._inside = threading.get_ident(), True
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _fire(self) -> None:
        with self._lock:
            if self._inside:
                self._fired = True
                _set_async_exc(self._thread_id, _Expired)

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._timer.cancel()
        with self._lock:
            self._inside = False
            if self._fired and exc_type is not _Expired:
                _set_async_exc(self._thread_id, None)  # finished in time: drop the interrupt
        if exc_type is _Expired:
            raise TimeoutError(f"ran past {self.timeout_s:g} s") from None
        return False


def _set_async_exc(thread_id: int, exc_type: type | None) -> None:
    """Raise exc_type in the thread at its next bytecode (None clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc_type) if exc_type
                                               else ctypes.c_void_p(None))
