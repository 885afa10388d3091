"""Output processing on the front end: each step's EngineCoreOutputs become a request's tokens,
logprob records and text (incremental detokenization only where text is read while the request
runs; else one decode at the finish), stop strings, and the RequestOutput objects users see."""

from __future__ import annotations

import logging
import time

from compiled_llm.core.engine_output import EngineCoreOutput, LogprobRow
from compiled_llm.core.request import Request
from compiled_llm.output.detokenizer import find_stop_string, held_back_chars
from compiled_llm.output.fast_detokenizer import make_detokenizer
from compiled_llm.output.final_decode import decode_outputs
from compiled_llm.output.outputs import (
    CompletionOutput,
    Logprob,
    RequestOutput,
    RequestStateStats,
)
from compiled_llm.output.request_state import RequestState
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)
Finish = tuple[str, str, int | str | None]  # (request id, "stop" | "error", stop str or error)


class OutputProcessor:
    """Keeps a RequestState per live child sequence and folds the core's outputs into them
    (the tokenizer may be None: then no text is made). Invariant: a state is dropped once its
    finished output is built, or when its request is aborted."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self._to_decode: list[RequestState] = []  # finished this step, text not yet made

    def start(self, req: Request, arrival_time: float | None = None) -> RequestState:
        """The front-end state of a new child request (with its detokenizer, if it wants text
        while it runs); arrival_time: its time.time() when added (None: now)."""
        params = req.sampling_params
        state = RequestState(req.request_id, req.parent_id, req.prompt,
                             req.prompt_token_ids, params, lora_request=req.lora_request)
        if arrival_time is not None:
            state.arrival_time = arrival_time
        if self.tokenizer is not None and params.detokenize and state.text_while_running:
            state.detokenizer = make_detokenizer(
                self.tokenizer, req.prompt_token_ids, params.skip_special_tokens,
                params.spaces_between_special_tokens)
        self.states[req.request_id] = state
        return state

    def drop(self, request_id: str) -> None:
        """Forget a child's state (aborted or reported finished)."""
        self.states.pop(request_id, None)

    def finish_aborted(self, states: list[RequestState]) -> None:
        """Finish each state still running as "abort", its text made, and drop them all."""
        self._to_decode = []
        for state in states:
            self.drop(state.request_id)
            if state.finish("abort"):
                self._finish_text(state)
        if self._to_decode:
            self._decode_final(self._to_decode)

    def process(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestState],
                                                                list[Finish]]:
        """Fold one step's outputs in: the states that changed, and the finishes the core must
        learn of (stop strings found here, errors in processing a request's output)."""
        touched, finishes, self._to_decode = [], [], []
        now = time.monotonic()
        for out in outputs:
            state = self.states.get(out.request_id)
            if state is None or state.is_finished:  # aborted, or ended here already
                continue
            if state.token_steps is not None and out.new_token_ids:
                # the core's stamp: outputs of several steps may arrive together
                state.token_steps.append((out.timestamp or now, len(out.new_token_ids)))
            if out.scheduled_ts is not None:
                state.scheduled_ts = out.scheduled_ts
            if out.new_token_ids and state.first_token_latency is None:
                state.first_token_latency = time.time() - state.arrival_time
            try:
                finish = self._apply(state, out)
            except Exception as e:  # one request's output processing: fail it alone
                logger.exception("request %s failed in output processing", out.request_id)
                error = f"output processing failed: {type(e).__name__}: {e}"
                state.finish("error", error=error)
                finish = (out.request_id, "error", error)
            if finish is not None:
                finishes.append(finish)
            touched.append(state)
        if self._to_decode:
            self._decode_final(self._to_decode)
        return touched, finishes

    def _apply(self, state: RequestState, out: EngineCoreOutput) -> Finish | None:
        if out.prompt_logprobs:
            decode = state.sampling_params.detokenize
            state.prompt_logprobs.extend(self._record(row, decode) for row in out.prompt_logprobs)
        if state.detokenizer is None and out.new_logprobs is None:  # no per-token work (hot)
            state.output_token_ids.extend(out.new_token_ids)
        else:
            stop = self._apply_tokens(state, out)
            if stop is not None:
                return stop
        if out.finish_reason is not None:
            state.finish(out.finish_reason, out.stop_reason, out.error)
            self._finish_text(state)
        return None

    def _apply_tokens(self, state: RequestState, out: EngineCoreOutput) -> Finish | None:
        """Add the new tokens one by one (logprob records, text, stop strings)."""
        # The EOS or stop token id that ends the request adds no text (vLLM's detokenizer).
        textless = len(out.new_token_ids) - 1 if stop_terminated(
            state.sampling_params, out.finish_reason, out.stop_reason) else -1
        for index, token in enumerate(out.new_token_ids):
            state.output_token_ids.append(token)
            if out.new_logprobs is not None:
                self._add_logprobs(state, out.new_logprobs[index])
            if index == textless:
                break
            stop = self._detokenize(state, token)
            if stop is not None:  # a stop string beats the core's verdict on this token
                state.finish("stop", stop)
                self._finish_text(state)
                return state.request_id, "stop", stop
        return None

    def _add_logprobs(self, state: RequestState, row: LogprobRow) -> None:
        if state.logprobs is not None:
            state.logprobs.append(self._record(row, state.sampling_params.detokenize))
            state.cumulative_logprob += row[1][0]

    def _detokenize(self, state: RequestState, token: int) -> str | None:
        """Add the token's text; the stop string it completes, if any."""
        if state.detokenizer is None:
            return None
        delta = state.detokenizer.add_tokens([token])
        params = state.sampling_params
        # vLLM: no stop string ends a request within min_tokens, nor ends in their text
        if delta and params.stop and len(state.output_token_ids) > params.min_tokens:
            hit = find_stop_string(state.detokenizer.output_text, len(delta), params.stop,
                                   params.include_stop_str_in_output)
            if hit is not None:
                state.detokenizer.truncate(hit[1])
                return hit[0]
        return None

    def _finish_text(self, state: RequestState) -> None:
        """Queue, for one batched decode at the end of the step, the text of a request that
        needed none while it ran."""
        params = state.sampling_params
        if state.detokenizer is None and self.tokenizer is not None and params.detokenize:
            self._to_decode.append(state)

    def _decode_final(self, states: list[RequestState]) -> None:
        """The text of each finished state, from one batched decode (the same text the
        incremental detokenizer would have made). A failure fails those requests alone."""
        try:
            texts = decode_outputs(
                self.tokenizer, [s.prompt_token_ids for s in states],
                [_text_token_ids(s) for s in states],
                [s.sampling_params.skip_special_tokens for s in states],
                [s.sampling_params.spaces_between_special_tokens for s in states])
        except Exception as e:
            logger.exception("final decode failed for %d requests", len(states))
            for state in states:
                state.finish_reason = "error"
                state.error = f"output processing failed: {type(e).__name__}: {e}"
            return
        for state, text in zip(states, texts):
            state.final_text = text

    def _record(self, row: LogprobRow, decode: bool) -> dict[int, Logprob]:
        """One position's logprob record; decoded tokens only where the request detokenizes
        (vLLM: detokenize=False leaves decoded_token None)."""
        token_ids, logprobs, rank = row
        tokenizer = self.tokenizer if decode else None
        record = {token_ids[0]: Logprob(logprobs[0], rank, _decode(tokenizer, token_ids[0]))}
        for top_rank, (token_id, logprob) in enumerate(zip(token_ids[1:], logprobs[1:]), start=1):
            record.setdefault(token_id, Logprob(logprob, top_rank, _decode(tokenizer, token_id)))
        return record


def _decode(tokenizer, token_id: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([token_id])


def stop_terminated(params: SamplingParams, finish_reason: str | None,
                    stop_reason: int | str | None) -> bool:
    """Whether the request ended on an EOS or stop token id whose text stays out of the output
    (vLLM: unless include_stop_str_in_output). The core's "stop" always ends on such a token
    (a grammar terminates on one too); a stop string (a str stop_reason) is found in text."""
    return (finish_reason == "stop" and not isinstance(stop_reason, str)
            and not params.include_stop_str_in_output)


def _text_token_ids(state: RequestState) -> list[int]:
    """The output tokens that carry the finished state's text (its stop token left out)."""
    ids = state.output_token_ids
    if ids and stop_terminated(state.sampling_params, state.finish_reason, state.stop_reason):
        return ids[:-1]
    return ids


def visible_text(req: RequestState) -> str:
    """Output text minus a tail that may still turn into a stop string (shown once resolved)."""
    text, params = req.output_text, req.sampling_params
    if req.is_finished or not params.stop or params.include_stop_str_in_output:
        return text
    return text[: len(text) - held_back_chars(text, params.stop)]


def completion_of(req: RequestState, index: int) -> CompletionOutput:
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


def delta_of(req: RequestState, index: int) -> CompletionOutput | None:
    """What req produced since its last delta; None if nothing new and not finished."""
    if req.final_sent:
        return None
    text = visible_text(req)
    start_tok, start_chr = req.num_sent_tokens, min(req.num_sent_chars, len(text))
    if start_tok == req.num_output_tokens and start_chr == len(text) and not req.is_finished:
        return None
    req.num_sent_tokens, req.num_sent_chars = req.num_output_tokens, len(text)
    req.final_sent, req.delta_sent = req.is_finished, True
    return CompletionOutput(
        index=index,
        text=text[start_chr:],
        token_ids=req.output_token_ids[start_tok:],
        cumulative_logprob=req.cumulative_logprob if req.logprobs is not None else None,
        logprobs=None if req.logprobs is None else req.logprobs[start_tok:],
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
    )


def request_output(request_id: str, children: list[RequestState]) -> RequestOutput | None:
    """One RequestOutput for a request from all its child sequences, shaped by its
    output_kind: each step's output of an n = 1 request, the final one of an n > 1 FINAL_ONLY
    request, an aborted request's last (streamed n > 1 outputs come from child_outputs); None
    when there is nothing to report (a DELTA with no news, or a FINAL_ONLY request still
    running). A finished child's delta is sent only once."""
    first = children[0]
    finished = first.is_finished if len(children) == 1 else all(c.is_finished for c in children)
    kind = first.sampling_params.output_kind
    if kind == RequestOutputKind.FINAL_ONLY and not finished:
        return None
    prompt_logprobs = first.prompt_logprobs
    if kind == RequestOutputKind.DELTA:
        unsent = {i for i, c in enumerate(children) if not c.delta_sent}
        outs = [delta for i, c in enumerate(children) if (delta := delta_of(c, i)) is not None]
        if not outs:
            return None
        # vLLM: a sequence's first delta carries the prompt logprobs, later ones an empty list
        if prompt_logprobs is not None and not any(o.index in unsent for o in outs):
            prompt_logprobs = []
    else:
        outs = [completion_of(c, i) for i, c in enumerate(children)]
    return RequestOutput(
        request_id=request_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        outputs=outs,
        finished=finished,
        prompt_logprobs=prompt_logprobs,
        error=first_error(children),
        metrics=timeline_of(children) if finished else None,
        lora_request=first.lora_request,
    )


def child_outputs(request_id: str, children: list[RequestState],
                  moved: set[RequestState]) -> list[RequestOutput]:
    """vLLM's streamed (DELTA or CUMULATIVE) n > 1 outputs: one per child in `moved` with news,
    in index order, each with that child's CompletionOutput alone; only the last is finished,
    and only once every child has (vLLM's ParentRequest.get_outputs)."""
    first = children[0]
    delta = first.sampling_params.output_kind == RequestOutputKind.DELTA
    outs = []
    for index, child in enumerate(children):
        if child not in moved or child.final_sent:  # a finished child is reported once
            continue
        # child 0 computes the prompt's logprobs for all: vLLM gives them to each child's
        # first delta (later ones an empty list), and to every CUMULATIVE output
        prompt_logprobs = first.prompt_logprobs
        if delta:
            if child.delta_sent and prompt_logprobs is not None:
                prompt_logprobs = []
            completion = delta_of(child, index)
            if completion is None:
                continue
        else:
            child.final_sent = child.is_finished
            completion = completion_of(child, index)
        error = child.error if child.finish_reason == "error" else None
        outs.append(RequestOutput(request_id, first.prompt, first.prompt_token_ids,
                                  prompt_logprobs, [completion], False, error=error,
                                  lora_request=first.lora_request))
    if outs and all(child.is_finished for child in children):
        last = outs[-1]
        last.finished, last.metrics = True, timeline_of(children)
        # the request's end names its first failed sequence, as the FINAL_ONLY output does
        last.error = last.error or first_error(children)
    return outs


def first_error(children: list[RequestState]) -> str | None:
    """The error of the first sequence that failed, if any."""
    return next((c.error for c in children if c.error is not None
                 and c.finish_reason == "error"), None)


def timeline_of(children: list[RequestState]) -> RequestStateStats:
    """A finished request's timings: its arrival, its first token's latency and when the core
    first admitted a child, and (FINAL_ONLY only) the children's token timeline, merged."""
    admitted = [child.scheduled_ts for child in children if child.scheduled_ts is not None]
    latencies = [child.first_token_latency for child in children
                 if child.first_token_latency is not None]
    stats = RequestStateStats(scheduled_ts=min(admitted, default=None),
                              arrival_time=min(child.arrival_time for child in children),
                              first_token_latency=min(latencies, default=0.0),
                              queued_ts=min(child.queued_ts for child in children))
    if children[0].token_steps is None:
        return stats
    steps = stats.token_steps = sorted(step for child in children for step in child.token_steps)
    if steps:
        stats.num_generation_tokens = sum(tokens for _, tokens in steps)
        stats.first_token_ts, stats.last_token_ts = steps[0][0], steps[-1][0]
    return stats
