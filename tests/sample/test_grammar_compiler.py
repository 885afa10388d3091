"""The grammar compiler bounds the work a spec buys: specs over the size limit are refused at
once, compiling runs off the caller's thread, once per spec, and a spec that does not compile
in time is refused (from then on) while a busy compiler refuses only for the moment."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from compiled_llm.sample.grammar_compiler import GrammarManager
from compiled_llm.sampling_params import StructuredOutputsParams
from tests.utils import tokenizer_dir


def optional_properties(count: int) -> StructuredOutputsParams:
    """A JSON schema whose compile time grows about as count**3 (row 2's shape)."""
    props = {f"p{i}": {"type": "string"} for i in range(count)}
    return StructuredOutputsParams(json={"type": "object", "properties": props})


SLOW = optional_properties(2200)  # about 0.5 s to compile with xgrammar 0.2.9, 61 KB


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tokenizer_dir())


def manager(tokenizer, **kw) -> GrammarManager:
    return GrammarManager(tokenizer, len(tokenizer), (tokenizer.eos_token_id,), **kw)


def test_row2_row3_specs_over_the_size_limit_are_refused_at_once(tokenizer):
    grammars = manager(tokenizer)
    with pytest.raises(ValueError, match=r"^structured_outputs.json is \d+ bytes"):
        grammars.prepare(optional_properties(20_000))  # row 2: 589 KB
    choices = StructuredOutputsParams(choice=[f"choice {i}" for i in range(100_000)])
    with pytest.raises(ValueError, match=r"^structured_outputs.choice is \d+ bytes"):
        grammars.prepare(choices)  # row 3: 1.5 MB
    assert grammars.num_cached == 0


def test_row2_compiles_off_the_callers_thread_once_per_spec(tokenizer):
    grammars = manager(tokenizer, timeout_s=120.0)
    first = grammars.prepare(SLOW)
    assert not first.done()  # prepare returned while the compile runs elsewhere
    assert grammars.prepare(SLOW) is first  # a concurrent caller shares the compile
    assert first.result(timeout=120) is not None
    again = grammars.prepare(SLOW)
    assert again.done() and again.result() is first.result()  # cached
    assert grammars.num_cached == 1


def test_row2_a_spec_that_runs_out_of_time_stays_refused(tokenizer):
    grammars = manager(tokenizer, timeout_s=0.1)
    with pytest.raises(ValueError, match="did not compile within 0.1 s"):
        grammars.compile(SLOW)
    with pytest.raises(ValueError, match="did not compile within 0.1 s"):
        grammars.prepare(SLOW)  # refused at once: no second compile is started
    assert grammars.num_cached == 0


def test_a_busy_compiler_refuses_for_the_moment_only(tokenizer):
    grammars = manager(tokenizer, timeout_s=0.1, workers=1)
    slow = grammars.prepare(SLOW)  # holds the one worker past its own deadline
    small = StructuredOutputsParams(regex="[ab]{1,4}")
    with pytest.raises(ValueError, match="compiler is busy"):
        grammars.compile(small)
    with pytest.raises(ValueError, match="did not compile"):
        slow.result()
    grammars.timeout_s = 120.0  # waits for the worker: the small spec was not remembered
    assert grammars.compile(small) is not None


def test_invalid_specs_name_the_field(tokenizer):
    grammars = manager(tokenizer)
    with pytest.raises(ValueError, match="^structured_outputs.grammar is invalid"):
        grammars.compile(StructuredOutputsParams(grammar="root ::= ("))
    assert grammars.compile(StructuredOutputsParams(choice=["yes", "no"])) is not None
