"""vLLM's goodput of `bench serve`: --goodput's service level objectives (TTFT, TPOT, E2EL in
ms) and the count of successful requests that meet all of them."""

from __future__ import annotations

GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """{metric: SLO in ms} of KEY:VALUE pairs (vLLM's --goodput): keys of GOODPUT_METRICS,
    positive values; ValueError naming --goodput else."""
    slos = {}
    for pair in pairs:
        key, colon, value = pair.partition(":")
        if not colon:
            raise ValueError(f"--goodput takes KEY:VALUE pairs, got {pair!r}")
        if key not in GOODPUT_METRICS:
            raise ValueError(f"--goodput: the key must be one of {GOODPUT_METRICS}, got {key!r}")
        try:
            slos[key] = float(value)
        except ValueError:
            slos[key] = 0.0  # refused below, as a value that is not positive
        if not slos[key] > 0:
            raise ValueError(f"--goodput: {key}'s value must be a positive number of ms, got "
                             f"{value!r}")
    return slos


def good_requests(records: list, slos: dict[str, float]) -> int:
    """Successful requests within every SLO (ms) of slos, as vLLM counts them (a one-token
    request's TPOT is 0)."""
    def within(rec) -> bool:
        decode = rec.output_tokens - 1
        values = {"ttft": rec.ttft, "e2el": rec.latency,
                  "tpot": (rec.latency - rec.ttft) / decode if decode > 0 else 0.0}
        return all(values[key] <= ms / 1000 for key, ms in slos.items())

    return sum(within(rec) for rec in records if rec.ok)
