"""OpenTelemetry request spans as vLLM emits them (`--otlp-traces-endpoint`): one `llm_request`
span (kind SERVER) per engine request, from its admission to its end, a child of the caller's
W3C trace context (traceparent/tracestate headers), with vLLM's gen_ai.* attributes; exported
over OTLP, gRPC or http/protobuf as OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says (gRPC unset)."""

from __future__ import annotations

import os
import time
from contextvars import ContextVar
from typing import Any

from compiled_llm.sampling_params import RequestOutputKind, SamplingParams

TRACE_HEADERS = ("traceparent", "tracestate")
SPAN_NAME = "llm_request"
# the trace headers of the HTTP request being handled (set by TraceHeadersMiddleware)
_trace_headers: ContextVar[dict[str, str] | None] = ContextVar("trace_headers", default=None)
_TRACERS: dict[tuple[str, str], RequestTracer] = {}


class TraceHeadersMiddleware:
    """ASGI: keeps the request's trace headers where the handler's spans find them."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        wanted = {name.encode() for name in TRACE_HEADERS}
        headers = {key.decode("latin-1").lower(): value.decode("latin-1")
                   for key, value in scope["headers"] if key.lower() in wanted}
        token = _trace_headers.set(headers)
        try:
            await self.app(scope, receive, send)
        finally:
            _trace_headers.reset(token)


class RequestTracer:
    """Makes the span of each traced request; `provider` is an OpenTelemetry TracerProvider."""

    def __init__(self, provider: Any, model_name: str) -> None:
        self.provider, self.model_name = provider, model_name
        self.tracer = provider.get_tracer("compiled_llm.entrypoints.server")

    def traced(self, stream, request_id: str, params: SamplingParams, started_ns: int):
        """stream, whose outputs (and abort) also record and end its span, which started at
        started_ns (time.time_ns() when the request arrived)."""
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(_trace_headers.get() or {})
        span = self.tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.SERVER,
                                      start_time=started_ns)
        span.set_attributes({
            "gen_ai.response.model": self.model_name, "gen_ai.request.id": request_id,
            "gen_ai.request.temperature": params.temperature, "gen_ai.request.n": params.n,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.max_tokens": params.max_tokens or 0})
        return TracedStream(stream, span, params.output_kind == RequestOutputKind.DELTA,
                            started_ns)


class TracedStream:
    """A request's stream that records its span: the first token's time (known when the
    request streams deltas), the token counts, and the end, once."""

    def __init__(self, stream, span: Any, streams_deltas: bool, started_ns: int) -> None:
        self.stream, self.span, self.streams_deltas = stream, span, streams_deltas
        self.started_ns = started_ns
        self.first_token_s: float | None = None
        self.prompt_tokens = self.completion_tokens = self.sequences = 0
        self.ended = False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        try:
            async for out in self.stream:
                self._record(out)
                yield out
        finally:
            self._end()

    def _record(self, out) -> None:
        new = sum(len(completion.token_ids) for completion in out.outputs)
        if new and self.first_token_s is None and self.streams_deltas:
            self.first_token_s = self._elapsed_s()
        self.prompt_tokens = len(out.prompt_token_ids)
        self.completion_tokens += new
        # a streamed n > 1 output may carry only the sequences that moved: count by index
        self.sequences = max([self.sequences, *(c.index + 1 for c in out.outputs)])

    def _elapsed_s(self) -> float:
        return (time.time_ns() - self.started_ns) / 1e9

    def abort(self) -> None:
        """Abort the request and end its span."""
        self.stream.abort()
        self._end()

    def _end(self) -> None:
        if self.ended:
            return
        self.ended = True
        attributes = {"gen_ai.usage.prompt_tokens": self.prompt_tokens,
                      "gen_ai.usage.completion_tokens": self.completion_tokens,
                      "gen_ai.usage.num_sequences": self.sequences,
                      "gen_ai.latency.e2e": self._elapsed_s()}
        if self.first_token_s is not None:
            attributes["gen_ai.latency.time_to_first_token"] = self.first_token_s
        self.span.set_attributes(attributes)
        self.span.end()


def request_tracer(endpoint: str | None, model_name: str) -> RequestTracer | None:
    """The tracer exporting to endpoint (one per endpoint and model, shared by the
    handlers), or None when tracing is off."""
    if endpoint is None:
        return None
    key = (endpoint, model_name)
    if key not in _TRACERS:
        _TRACERS[key] = RequestTracer(_provider(endpoint), model_name)
    return _TRACERS[key]


def _provider(endpoint: str) -> Any:
    """A TracerProvider batching spans to an OTLP exporter for endpoint."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ValueError("otlp_traces_endpoint needs OpenTelemetry: pip install "
                         f"'compiled-llm[otel]' ({exc})") from None
    provider = TracerProvider(resource=Resource.create({"service.name": "compiled-llm"}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
    return provider


def _exporter(endpoint: str) -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        elif protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            raise ValueError(f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL must be grpc or "
                             f"http/protobuf, got {protocol!r}")
    except ImportError as exc:
        raise ValueError(f"otlp_traces_endpoint over {protocol} needs its OTLP exporter: pip "
                         f"install 'compiled-llm[otel]' ({exc})") from None
    return OTLPSpanExporter(endpoint=endpoint)
