"""The bench commands' dataset files and arrivals, without a server or an engine: ShareGPT's
length filters, seeded shuffling and oversampling, custom JSON lines with the chat template,
bad files and flags refused naming the flag, gamma arrival statistics, and goodput."""

from __future__ import annotations

import json
import random
import statistics
from types import SimpleNamespace

import pytest

from compiled_llm.entrypoints.cli.bench_datasets import (
    DatasetFileArgs,
    is_valid_sequence,
    read_custom,
    read_dataset,
    read_sharegpt,
    sample_dataset,
)
from compiled_llm.entrypoints.cli.bench_goodput import good_requests, parse_goodput
from compiled_llm.entrypoints.cli.bench_serve import ServeBenchArgs, print_report, summarize
from compiled_llm.entrypoints.cli.main import main
from compiled_llm.entrypoints.cli.serve_client import RequestRecord, arrival_gap, split
from tests.utils import tokenizer_dir


class WordTokenizer:
    """One token per word, so that the lengths under test are plain to read."""

    chat_template = "<user> ... <assistant>"

    def __call__(self, text: str):
        return SimpleNamespace(input_ids=text.split())

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return f"<user> {messages[0]['content']} <assistant>"


def words(n: int, word: str = "w") -> str:
    return " ".join([word] * n)


def conversation(prompt_len: int, reply_len: int, tag: str = "w") -> dict:
    return {"conversations": [{"from": "human", "value": words(prompt_len, tag)},
                              {"from": "gpt", "value": words(reply_len, tag)}]}


def write_sharegpt(tmp_path, entries: list) -> str:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    return str(path)


def sample(path: str, num: int, name: str = "sharegpt", seed: int = 0, **opts):
    args = DatasetFileArgs(dataset_path=path, **opts)
    entries = read_dataset(name, args)
    return sample_dataset(name, entries, WordTokenizer(), num, seed, args)


# (prompt words, reply words) -> kept by vLLM's filter with the reply's own length
FILTER_CASES = [((3, 10), False), ((4, 3), False), ((4, 4), True), ((1025, 4), False),
                ((1024, 4), True), ((1000, 1049), False), ((1000, 1048), True)]


def test_sharegpt_keeps_what_vllm_keeps(tmp_path):
    entries = [conversation(p, r) for (p, r), _ in FILTER_CASES]
    entries += [{"conversations": [{"from": "human", "value": words(8)}]},  # one turn
                {"id": "no conversations"}, "not an object"]
    path = write_sharegpt(tmp_path, entries)
    reqs = sample(path, 20, disable_shuffle=True, oversample=False)
    assert [(r.prompt_len, r.output_len) for r in reqs] == [
        lens for lens, kept in FILTER_CASES if kept]
    assert reqs[0].prompt == words(4)
    # a fixed output length skips the reply's minimum, not the prompt's nor the total's
    fixed = sample(path, 20, disable_shuffle=True, oversample=False, sharegpt_output_len=2)
    assert [(r.prompt_len, r.output_len) for r in fixed] == [
        (4, 2), (4, 2), (1024, 2), (1000, 2), (1000, 2)]
    assert is_valid_sequence(4, 2, fixed_output=True) and not is_valid_sequence(4, 2)


def test_sharegpt_shuffles_with_the_seed_and_oversamples(tmp_path):
    entries = [conversation(4 + k, 4, tag=f"t{k}") for k in range(10)]
    path = write_sharegpt(tmp_path, entries)
    first = [r.prompt_len for r in sample(path, 4, seed=1)]
    order = list(range(10))
    random.Random(1).shuffle(order)
    assert first == [4 + k for k in order[:4]]  # the seeded shuffle's first four
    assert first == [r.prompt_len for r in sample(path, 4, seed=1)]
    assert first != [r.prompt_len for r in sample(path, 4, seed=2)]
    many = sample(path, 25, seed=1)
    assert len(many) == 25 and sorted(r.prompt_len for r in many[:10]) == list(range(4, 14))
    assert {r.prompt_len for r in many[10:]} <= set(range(4, 14))
    assert len(sample(path, 25, seed=1, oversample=False)) == 10


def test_custom_prompts_in_the_chat_template(tmp_path):
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "one two"}\n\n{"prompt": "three", "extra": 1}\n')
    assert read_custom(str(path)) == ["one two", "three"]
    reqs = sample(str(path), 2, name="custom", disable_shuffle=True)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in reqs] == [
        ("<user> one two <assistant>", 4, 256), ("<user> three <assistant>", 3, 256)]
    bare = sample(str(path), 3, name="custom", disable_shuffle=True, skip_chat_template=True,
                  custom_output_len=7)
    assert [(r.prompt, r.output_len) for r in bare[:2]] == [("one two", 7), ("three", 7)]
    assert len(bare) == 3 and bare[2] in bare[:2]  # oversampled


def test_custom_with_the_test_tokenizer(tmp_path):
    """The real tiny tokenizer's chat template and counts; the chat endpoint's prompts bare."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    path = tmp_path / "custom.jsonl"
    path.write_text('{"prompt": "The quick brown fox"}\n')
    args = DatasetFileArgs(dataset_path=str(path))
    entries = read_dataset("custom", args)
    [req] = sample_dataset("custom", entries, tok, 1, 0, args)
    assert req.prompt == "<user>The quick brown fox\n<assistant>"
    assert req.prompt_len == len(tok(req.prompt).input_ids) > 0
    [bare] = sample_dataset("custom", entries, tok, 1, 0, args, template=False,
                            output_len=9)
    assert (bare.prompt, bare.output_len) == ("The quick brown fox", 9)
    tok.chat_template = None
    with pytest.raises(ValueError, match="--skip-chat-template"):
        sample_dataset("custom", entries, tok, 1, 0, args)


@pytest.mark.parametrize("name, text, match", [
    ("sharegpt", "{not json", "not JSON"),
    ("sharegpt", '{"conversations": []}', "JSON list"),
    ("sharegpt", json.dumps([conversation(4, 4)["conversations"][:1]]), "two turns"),
    ("sharegpt", json.dumps([{"conversations": [{"value": 1}, {"value": "x"}]}]), "two turns"),
    ("custom", '{"prompt": "a"}\n{"text": "b"}\n', "line 2"),
    ("custom", "[1]\n", "line 1"),
    ("custom", "\n\n", "no prompt"),
    ("custom", '{"prompt": "a"\n', "line 1 is not JSON")])
def test_bad_dataset_files_are_refused(tmp_path, name, text, match):
    path = tmp_path / "data"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"--dataset-path {path}: .*{match}"):
        read_dataset(name, DatasetFileArgs(dataset_path=str(path)))


def test_unreadable_and_filtered_out_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match="--dataset-path .*cannot read"):
        read_sharegpt(str(tmp_path))  # a directory
    with pytest.raises(ValueError, match="--dataset-path .*cannot read"):
        read_custom(str(tmp_path / "missing.jsonl"))
    path = write_sharegpt(tmp_path, [conversation(2, 8), conversation(2000, 8)])
    with pytest.raises(ValueError, match="--dataset-path .*length filters"):
        sample(path, 4)


@pytest.mark.parametrize("argv, match", [
    (["--dataset-name", "sharegpt"], "pass --dataset-path"),
    (["--dataset-name", "custom"], "pass --dataset-path"),
    (["--dataset-path", "x.json"], "--dataset-path is for"),
    (["--dataset-name", "custom", "--dataset-path", "/no/such.jsonl"], "cannot read"),
    (["--burstiness", "0"], "--burstiness must be > 0"),
    (["--burstiness", "-1.5"], "--burstiness must be > 0"),
    (["--goodput", "ttft:100", "itl:5"], "--goodput: the key"),
    (["--goodput", "ttft:0"], "--goodput: ttft's value must be a positive"),
    (["--goodput", "e2el:-3"], "--goodput: e2el's value"),
    (["--goodput", "tpot"], "--goodput takes KEY:VALUE"),
    (["--sharegpt-output-len", "0"], "sharegpt_output_len")])
def test_bench_serve_refuses_bad_flags(capsys, argv, match):
    """Refused before any server is waited for (port 1 has none)."""
    assert main(["bench", "serve", "--port", "1", "--ready-check-timeout-sec", "0",
                 *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["--dataset-name", "sharegpt"], "pass --dataset-path"),
    (["--dataset-name", "nano-vllm", "--dataset-path", "x.json"], "--dataset-path is for"),
    (["--dataset-name", "sharegpt", "--dataset-path", "/no/such.json"], "cannot read")])
def test_bench_throughput_refuses_bad_dataset_flags(capsys, argv, match):
    """Refused before the engine is built."""
    assert main(["bench", "throughput", "--device", "cpu", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrival_gaps_are_gamma_with_mean_one_over_rate(burstiness):
    """vLLM's arrivals: mean 1/rate whatever the burstiness, squared coefficient of variation
    1/burstiness (1: exponential gaps, a Poisson process)."""
    rng, rate = random.Random(3), 20.0
    gaps = [arrival_gap(rng, rate, burstiness) for _ in range(40_000)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert statistics.pvariance(gaps) / mean**2 == pytest.approx(1 / burstiness, rel=0.08)
    assert arrival_gap(rng, float("inf"), burstiness) == 0.0


def test_split_gives_every_share_the_burstiness():
    shares = split([{}] * 4, 2, None, 8.0, 0, url="u", burstiness=0.5)
    assert [(s.rate, s.burstiness) for s in shares] == [(4.0, 0.5), (4.0, 0.5)]


def record(ttft: float, latency: float, tokens: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(prompt_len=3, output_tokens=tokens, ttft=ttft, latency=latency,
                         ok=ok, itl=[0.01] * max(tokens - 1, 0))


def test_goodput_counts_requests_within_every_slo(capsys):
    records = [record(0.05, 0.50, 10),   # tpot 50 ms
               record(0.20, 0.40, 5),    # ttft 200 ms, tpot 50 ms
               record(0.05, 1.05, 11),   # tpot 100 ms, e2el 1050 ms
               record(0.30, 0.30, 1),    # one token: tpot 0
               record(0.01, 0.02, 2, ok=False)]
    assert parse_goodput(["ttft:100", "tpot:60.5"]) == {"ttft": 100.0, "tpot": 60.5}
    assert good_requests(records, {"ttft": 100}) == 2
    assert good_requests(records, {"tpot": 50}) == 3
    assert good_requests(records, {"ttft": 250, "tpot": 60}) == 2
    assert good_requests(records, {"e2el": 1000}) == 3
    assert good_requests(records, {"ttft": 1000, "tpot": 1000, "e2el": 2000}) == 4
    result = summarize(records, 2.0, slos={"ttft": 100})
    assert result["request_goodput"] == 1.0 and result["request_throughput"] == 2.0
    print_report(result, None)
    assert "Request goodput (req/s):                 1.00" in capsys.readouterr().out
    plain = summarize(records, 2.0)
    assert plain["request_goodput"] is None
    print_report(plain, None)
    assert "goodput" not in capsys.readouterr().out
    assert ServeBenchArgs(goodput=["e2el:5"]).slos() == {"e2el": 5.0}
