"""Fuzzing: schemathesis against the app's own OpenAPI spec (in process, over ASGI, a bounded
number of cases per operation, derandomized for CI): no answer is a 5xx and every answer
matches the spec (status, content type, schema); hypothesis over the request models: a body
is a 4xx or makes SamplingParams. The tally is in docs/hardening.md."""

from __future__ import annotations

from collections import Counter

import pydantic
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks

from compiled_llm import SamplingParams
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.server.app import build_app
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.params import sampling_params
from compiled_llm.entrypoints.server.protocol import ChatCompletionRequest, CompletionRequest
from compiled_llm.entrypoints.server.server_config import ServerConfig
from tests.entrypoints.server.inprocess import MODEL, engine_args

KEY = "sk-fuzz"
AUTH = {"Authorization": f"Bearer {KEY}"}
CASES_PER_OPERATION = 100
TALLY: Counter = Counter()


@pytest.fixture(scope="module")
def fuzzed():
    """The app over a small engine: short contexts and low caps keep each case cheap."""
    metrics = ServerMetrics(MODEL)
    engine = AsyncLLM(engine_args(max_model_len=48, max_n_sequences=4, max_logprobs=4),
                      observer=metrics)
    cfg = ServerConfig(model_name=MODEL, api_key=KEY, max_completion_prompts=4,
                       max_body_bytes=1 << 20)
    yield build_app(engine, cfg, metrics), engine
    engine.shutdown()


@pytest.fixture(scope="module")
def api_schema(fuzzed):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzzed[0], headers=AUTH)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=CASES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_item6_no_case_is_a_5xx_and_every_answer_matches_the_spec(case):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # past the 404, into the engine (a str stays a str)
    response = case.call(headers=AUTH)
    TALLY["cases"] += 1
    TALLY[f"{response.status_code // 100}xx"] += 1
    # schema-valid is not valid: ranges, vocabularies and grammars are checked past the spec
    case.validate_response(response, excluded_checks=[checks.positive_data_acceptance])


def test_item6_the_tally_has_no_5xx_and_the_engine_is_idle(fuzzed):
    _, engine = fuzzed
    print(f"\nschemathesis: {dict(TALLY)}")
    assert TALLY["cases"] >= CASES_PER_OPERATION and TALLY["5xx"] == 0, TALLY
    assert engine.engine.num_used_blocks == 0


JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.integers(-2, 40),
              st.floats(allow_nan=False), st.text(max_size=6), st.just("\ud800")),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "robot"]),
     "content": st.one_of(st.none(), st.text(max_size=5), JSON)}), max_size=2)
REQUIRED = {CompletionRequest: {"prompt": st.one_of(st.text(max_size=5), JSON)},
            ChatCompletionRequest: {"messages": st.one_of(MESSAGES, JSON)}}


@pytest.mark.parametrize("model", list(REQUIRED), ids=lambda model: model.__name__)
def test_item6_request_bodies_are_a_4xx_or_sampling_params(model):
    fields = sorted(set(model.model_fields) - set(REQUIRED[model]))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(body=st.fixed_dictionaries(REQUIRED[model], optional=dict.fromkeys(fields, JSON)))
    def check(body):
        try:
            req = model.model_validate(body)
        except pydantic.ValidationError:
            return
        try:
            params = sampling_params(req, 4, None, req.stream)
        except OpenAIError as exc:
            assert 400 <= exc.status < 500, exc.message
            return
        except ValueError:
            return
        assert isinstance(params, SamplingParams)

    check()
