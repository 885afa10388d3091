"""Output processing: incremental detokenization, stop strings, logprob records, and the
RequestOutput objects and stream deltas users see."""
