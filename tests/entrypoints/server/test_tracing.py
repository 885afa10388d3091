"""`serve --otlp-traces-endpoint`: each request's `llm_request` span reaches an OTLP/HTTP
receiver run here (the protobuf the exporter posts, decoded), a child of the caller's
traceparent, with vLLM's gen_ai.* attributes."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from tests.entrypoints.server.conftest import _free_port, start_server, stop_server
from tests.utils import make_checkpoint

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class _Receiver(http.server.BaseHTTPRequestHandler):
    spans: list = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                _Receiver.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", _free_port()), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}/v1/traces"
    patch = pytest.MonkeyPatch()
    patch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    try:
        proc, srv = start_server(make_checkpoint("llama"), "--otlp-traces-endpoint", endpoint)
    finally:
        patch.undo()
    yield srv
    stop_server(proc)
    receiver.shutdown()


def _span_of(request_id_prefix: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for span in _Receiver.spans:
            attrs = _attributes(span)
            if attrs.get("gen_ai.request.id", "").startswith(request_id_prefix):
                return span, attrs
        time.sleep(0.05)
    raise AssertionError(f"no span for {request_id_prefix} in {len(_Receiver.spans)} spans")


def _attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_chat_span_is_a_child_of_the_callers_trace(traced):
    import openai

    client = openai.OpenAI(base_url=f"{traced.url}/v1", api_key="none", max_retries=0)
    header = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    chat = client.chat.completions.create(
        model=traced.model, messages=[{"role": "user", "content": "The quick"}], max_tokens=4,
        temperature=0.5, top_p=0.9, extra_headers=header)
    span, attrs = _span_of(chat.id)
    assert span.name == "llm_request" and span.kind == span.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT_ID
    assert attrs["gen_ai.response.model"] == traced.model
    assert attrs["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert attrs["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert attrs["gen_ai.request.max_tokens"] == 4 and attrs["gen_ai.request.n"] == 1
    assert attrs["gen_ai.usage.prompt_tokens"] == chat.usage.prompt_tokens
    assert attrs["gen_ai.usage.completion_tokens"] == chat.usage.completion_tokens
    assert "gen_ai.latency.time_to_first_token" not in attrs  # not streamed: not seen
    e2e = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
    assert 0 < attrs["gen_ai.latency.e2e"] == pytest.approx(e2e, abs=0.5)


def test_streamed_completion_span_has_time_to_first_token(traced):
    import openai

    client = openai.OpenAI(base_url=f"{traced.url}/v1", api_key="none", max_retries=0)
    chunks = list(client.completions.create(
        model=traced.model, prompt="The quick", max_tokens=5, n=2, stream=True,
        extra_body={"ignore_eos": True}))
    span, attrs = _span_of(chunks[0].id)
    assert span.parent_span_id == b""  # no traceparent: a root span
    assert attrs["gen_ai.usage.completion_tokens"] == 10
    assert attrs["gen_ai.usage.num_sequences"] == 2 and attrs["gen_ai.request.n"] == 2
    assert 0 < attrs["gen_ai.latency.time_to_first_token"] <= attrs["gen_ai.latency.e2e"]


def test_unknown_otlp_protocol_is_refused(monkeypatch):
    from compiled_llm.entrypoints.server.tracing import request_tracer

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        request_tracer("http://127.0.0.1:1/v1/traces", "refused-model")
