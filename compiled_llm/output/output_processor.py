"""Output processing: logprob records, incremental detokenization, stop strings, and the
RequestOutput objects users see. Runs on the host after each step."""

from __future__ import annotations

from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.output.detokenizer import (
    IncrementalDetokenizer,
    find_stop_string,
    held_back_chars,
)
from compiled_llm.output.outputs import CompletionOutput, Logprob, RequestOutput
from compiled_llm.sampling_params import RequestOutputKind
from compiled_llm.worker.model_runner import LogprobRow, StepResult


class OutputProcessor:
    """Turns each step's tokens into a request's text and logprob records (the tokenizer may
    be None: then no text is made)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def start(self, req: Request) -> None:
        """Give a new request its incremental detokenizer, if it wants text."""
        params = req.sampling_params
        if self.tokenizer is not None and params.detokenize:
            req.detokenizer = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, params.skip_special_tokens,
                params.spaces_between_special_tokens)

    def _record(self, row: LogprobRow) -> dict[int, Logprob]:
        token_ids, logprobs, rank = row
        record = {token_ids[0]: Logprob(logprobs[0], rank, self._decode(token_ids[0]))}
        for top_rank, (token_id, logprob) in enumerate(zip(token_ids[1:], logprobs[1:]), start=1):
            record.setdefault(token_id, Logprob(logprob, top_rank, self._decode(token_id)))
        return record

    def _decode(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def add_prompt_logprobs(self, req: Request, rows: list[LogprobRow]) -> None:
        """Append the records of the prompt positions this step scored."""
        req.prompt_logprobs.extend(self._record(r) for r in rows)

    def process_token(self, req: Request, result: StepResult) -> str | None:
        """Record logprobs and text for req's newest token; returns a stop string hit, if any."""
        row = result.logprobs.get(req.request_id)
        if row is not None:
            req.logprobs.append(self._record(row))
            req.cumulative_logprob += row[1][0]
        if req.detokenizer is None:
            return None
        delta = req.detokenizer.add_tokens([req.output_token_ids[-1]])
        params = req.sampling_params
        if delta and params.stop:
            text = req.detokenizer.output_text
            hit = find_stop_string(text, len(delta), params.stop,
                                   params.include_stop_str_in_output)
            if hit is not None:
                req.detokenizer.truncate(hit[1])
                return hit[0]
        return None


def visible_text(req: Request) -> str:
    """Output text minus a tail that may still turn into a stop string (shown once resolved)."""
    text, params = req.output_text, req.sampling_params
    if req.is_finished or not params.stop or params.include_stop_str_in_output:
        return text
    return text[: len(text) - held_back_chars(text, params.stop)]


def completion_of(req: Request, index: int) -> CompletionOutput:
    """Everything req produced so far."""
    return CompletionOutput(
        index=index,
        text=visible_text(req),
        token_ids=list(req.output_token_ids),
        cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None,
        logprobs=req.logprobs,
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
    )


def delta_of(req: Request, index: int) -> CompletionOutput | None:
    """What req produced since its last delta; None if nothing new and not finished."""
    if req.final_sent:
        return None
    text = visible_text(req)
    start_tok, start_chr = req.num_sent_tokens, min(req.num_sent_chars, len(text))
    if start_tok == req.num_output_tokens and start_chr == len(text) and not req.is_finished:
        return None
    req.num_sent_tokens, req.num_sent_chars = req.num_output_tokens, len(text)
    req.final_sent = req.is_finished
    return CompletionOutput(
        index=index,
        text=text[start_chr:],
        token_ids=req.output_token_ids[start_tok:],
        cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None,
        logprobs=None if req.logprobs is None else req.logprobs[start_tok:],
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
    )


def request_output(request_id: str, children: list[Request]) -> RequestOutput | None:
    """One RequestOutput for a (possibly n > 1) request from its child sequences, shaped by
    its output_kind; None when there is nothing to report (a DELTA with no news, or a
    FINAL_ONLY request still running). A finished child's delta is sent only once."""
    first = children[0]
    finished = first.is_finished if len(children) == 1 else all(c.is_finished for c in children)
    kind = first.sampling_params.output_kind
    if kind == RequestOutputKind.FINAL_ONLY and not finished:
        return None
    if kind == RequestOutputKind.DELTA:
        outs = [delta for i, c in enumerate(children) if (delta := delta_of(c, i)) is not None]
        if not outs:
            return None
    else:
        outs = [completion_of(c, i) for i, c in enumerate(children)]
    errors = [c.error for c in children if c.error is not None and
              c.status is RequestStatus.FINISHED_ERROR]
    return RequestOutput(
        request_id=request_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        outputs=outs,
        finished=finished,
        prompt_logprobs=first.prompt_logprobs,
        error=errors[0] if errors else None,
    )
