"""The proposer registry, n-gram prompt lookup and which requests may take drafts."""

from __future__ import annotations

import numpy as np
import pytest

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.spec_decode.proposers import (
    PROPOSERS,
    NgramProposer,
    make_proposer,
    ngram_propose,
    spec_eligible,
)
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.speculative import SpeculativeConfig


def _ids(*tokens):
    return np.asarray(tokens, dtype=np.int64)


def test_ngram_takes_the_longest_latest_match():
    # suffix (3, 4) occurs twice; the latest occurrence is followed by 9, 9
    assert ngram_propose(_ids(3, 4, 5, 6, 3, 4, 9, 9, 3, 4), 1, 3, 2) == [9, 9]
    # the 3-gram (1, 3, 4) beats the 2-gram (3, 4): its continuation wins
    assert ngram_propose(_ids(1, 3, 4, 7, 8, 2, 3, 4, 5, 1, 3, 4), 2, 3, 3) == [7, 8, 2]
    assert ngram_propose(_ids(1, 2, 3, 4), 1, 3, 2) == []  # nothing repeats
    assert ngram_propose(_ids(5, 6, 5), 1, 2, 4) == [6, 5]  # fewer near the end
    assert ngram_propose(_ids(5, 6, 5, 6), 3, 3, 2) == []  # below prompt_lookup_min


def test_registry_builds_by_method():
    import compiled_llm.worker.draft_model  # noqa: F401  (registers itself)

    assert {"ngram", "draft_model"} <= set(PROPOSERS)
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    proposer = make_proposer(cfg)
    assert isinstance(proposer, NgramProposer)
    req = Request("r", [4, 5, 6, 4, 5], SamplingParams(max_tokens=8))
    drafts = proposer.propose(SchedulerOutput([(req, 1)]), {"r": [6]})
    assert drafts == {"r": [4, 5]}  # after ... 5, 6: the earlier "5 6" was followed by 4, 5
    assert proposer.draft_probs("r", 2) is None  # deterministic drafts: q is one-hot


@pytest.mark.parametrize("params, ok", [
    (dict(), True),
    (dict(temperature=0.7, top_k=5, top_p=0.9, seed=3, logit_bias={1: 2.0}), True),
    (dict(logprobs=2), False),
    (dict(presence_penalty=0.5), False),
    (dict(repetition_penalty=1.2), False),
    (dict(min_tokens=4), False),
])
def test_eligibility(params, ok):
    assert spec_eligible(Request("r", [1, 2], SamplingParams(**params))) is ok
