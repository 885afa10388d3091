"""The dataset files `bench serve` and `bench throughput` read, as vLLM's: ShareGPT (a JSON list
of conversations; the first turn is the prompt, the second's token count the output length)
and custom (JSON lines with a "prompt"), each shuffled with the seed, filtered and sampled."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from compiled_llm.config import check_minimums

FILE_DATASETS = ("sharegpt", "custom")
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048  # vLLM's ShareGPT length filters


@dataclass
class DatasetFileArgs:
    """The options of the file datasets (sharegpt, custom), shared by the bench commands."""

    dataset_path: str | None = None
    """The dataset file: a ShareGPT JSON file (sharegpt) or a JSON-lines file of objects with
    a "prompt" (custom)."""
    sharegpt_output_len: int | None = None
    """Tokens asked for each sharegpt prompt (default: its reply's token count)."""
    custom_output_len: int = 256
    """Tokens asked for each custom prompt."""
    skip_chat_template: bool = False
    """Send custom prompts as they are (default: wrapped in the tokenizer's chat template for
    the completions endpoint and bench throughput, as vLLM's; the chat endpoint always gets
    them bare, the server templates them)."""
    oversample: bool = True
    """When the file has fewer requests than --num-prompts, repeat seeded picks of them up to
    --num-prompts, as vLLM's (--no-oversample: send only those it has)."""
    disable_shuffle: bool = False
    """Take the file's entries in order instead of shuffled with --seed."""

    def check_dataset_file(self, name: str) -> None:
        """ValueError naming the flag when --dataset-path does not fit --dataset-name."""
        check_minimums(self, {"sharegpt_output_len": 1, "custom_output_len": 1})
        if name in FILE_DATASETS and not self.dataset_path:
            raise ValueError(f"--dataset-name {name} reads a file: pass --dataset-path")
        if name not in FILE_DATASETS and self.dataset_path:
            raise ValueError(f"--dataset-path is for --dataset-name sharegpt or custom, not "
                             f"{name} (got --dataset-path {self.dataset_path})")


@dataclass(frozen=True)
class TextRequest:
    """One sampled request: its prompt text, token count and the tokens asked for."""

    prompt: str
    prompt_len: int
    output_len: int


def random_requests(num: int, input_len: int, output_len: int, ratio: float, vocab: int,
                    seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) per request: ids uniform in [1, vocab), lengths uniform
    in [len * (1 - ratio), len * (1 + ratio)], at least 1."""
    rng = random.Random(seed)

    def length(n: int) -> int:
        return max(1, rng.randint(int(n * (1 - ratio)), int(n * (1 + ratio))))

    return [([rng.randrange(1, vocab) for _ in range(length(input_len))], length(output_len))
            for _ in range(num)]


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--dataset-path {path}: cannot read it ({e})") from None


def read_sharegpt(path: str) -> list[tuple[str, str]]:
    """(first turn, second turn) of each conversation of at least two turns in the file."""
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"--dataset-path {path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"--dataset-path {path}: a ShareGPT file is a JSON list of "
                         '{"conversations": [...]} objects')
    pairs = [(turns[0]["value"], turns[1]["value"]) for entry in data
             if isinstance(entry, dict) and isinstance(turns := entry.get("conversations"), list)
             and len(turns) >= 2 and _has_text(turns[0]) and _has_text(turns[1])]
    if not pairs:
        raise ValueError(f"--dataset-path {path}: no conversation of at least two turns")
    return pairs


def _has_text(turn: object) -> bool:
    return isinstance(turn, dict) and isinstance(turn.get("value"), str)


def read_custom(path: str) -> list[str]:
    """The "prompt" of each JSON line of the file (blank lines skipped)."""
    prompts = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--dataset-path {path}: line {number} is not JSON ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f'--dataset-path {path}: line {number} has no "prompt" string')
        prompts.append(row["prompt"])
    if not prompts:
        raise ValueError(f"--dataset-path {path}: no prompt in the file")
    return prompts


def read_dataset(name: str, opts: DatasetFileArgs) -> list | None:
    """The entries of --dataset-path in file order (None for a dataset that reads no file):
    read before any server or engine is waited for, so that a bad file fails first."""
    if name not in FILE_DATASETS:
        return None
    path = str(opts.dataset_path)
    return read_sharegpt(path) if name == "sharegpt" else read_custom(path)


def is_valid_sequence(prompt_len: int, output_len: int, fixed_output: bool = False) -> bool:
    """vLLM's ShareGPT filter: prompt and output (unless fixed) of at least 4 tokens, prompt
    at most 1024 and both together at most 2048."""
    return (prompt_len >= MIN_LEN and (fixed_output or output_len >= MIN_LEN)
            and prompt_len <= MAX_PROMPT_LEN and prompt_len + output_len <= MAX_TOTAL_LEN)


def _token_count(tokenizer, text: str) -> int:
    return len(tokenizer(text).input_ids)


def sample_sharegpt(pairs: list[tuple[str, str]], tokenizer, num: int,
                    output_len: int | None = None) -> list[TextRequest]:
    """The first `num` pairs, in order, that pass is_valid_sequence; a reply's token count is
    its output length unless output_len fixes it."""
    samples = []
    for prompt, reply in pairs:
        if len(samples) >= num:
            break
        prompt_len = _token_count(tokenizer, prompt)
        new_len = _token_count(tokenizer, reply) if output_len is None else output_len
        if is_valid_sequence(prompt_len, new_len, fixed_output=output_len is not None):
            samples.append(TextRequest(prompt, prompt_len, new_len))
    return samples


def sample_custom(prompts: list[str], tokenizer, num: int, output_len: int,
                  template: bool = True) -> list[TextRequest]:
    """The first `num` prompts, each in the tokenizer's chat template if `template`."""
    if template and not getattr(tokenizer, "chat_template", None):
        raise ValueError("--dataset-name custom wraps each prompt in the tokenizer's chat "
                         "template and this tokenizer has none: pass --skip-chat-template")
    samples = []
    for prompt in prompts[:num]:
        if template:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True,
                tokenize=False)
        samples.append(TextRequest(prompt, _token_count(tokenizer, prompt), output_len))
    return samples


def oversample(samples: list[TextRequest], num: int, seed: int) -> list[TextRequest]:
    """samples, then seeded random picks of them up to `num` (vLLM's oversampling)."""
    rng = random.Random(seed)
    return samples + [rng.choice(samples) for _ in range(num - len(samples))]


def sample_dataset(name: str, entries: list, tokenizer, num: int, seed: int,
                   opts: DatasetFileArgs, *, output_len: int | None = None,
                   template: bool = True) -> list[TextRequest]:
    """`num` requests of a file dataset's entries (read_dataset's): shuffled with `seed`
    unless --disable-shuffle, filtered, oversampled unless --no-oversample; output_len
    overrides the dataset's lengths; ValueError naming --dataset-path if none is left."""
    entries = list(entries)
    if not opts.disable_shuffle:
        random.Random(seed).shuffle(entries)
    if name == "sharegpt":
        fixed = output_len if output_len is not None else opts.sharegpt_output_len
        samples = sample_sharegpt(entries, tokenizer, num, fixed)
    else:
        samples = sample_custom(entries, tokenizer, num, output_len or opts.custom_output_len,
                                template and not opts.skip_chat_template)
    if not samples:
        raise ValueError(f"--dataset-path {opts.dataset_path}: no conversation passes the "
                         f"length filters (prompt {MIN_LEN}-{MAX_PROMPT_LEN} tokens, reply at "
                         f"least {MIN_LEN}, both at most {MAX_TOTAL_LEN})")
    return oversample(samples, num, seed) if opts.oversample else samples
