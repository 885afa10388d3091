"""Where a served run's slow inter-token gaps fall: `bench serve`'s result (per-request gaps and
send times) beside the server's log of collections and slow steps ($COMPILED_LLM_GC_DEBUG=1,
$COMPILED_LLM_STEP_DEBUG=MS; one clock). `python -m benchmarks.itl_gaps RESULT.json [--log
SERVER.log] [--factor 3]` prints the gaps over factor x the median: how many, where in their
requests, how many overlap a collection or a slow engine step, and those steps' makeup."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

STEP_LINE = re.compile(r"step: ([\d.]+) ms at monotonic ([\d.]+); landed (\d+) requests, "
                       r"(\d+) tokens, (\d+) of them prefill; ([\d.]+) ms outside"
                       r"(?:[^;\n]*; device ([\d.]+))?")
GC_LINE = re.compile(r"gc: generation (\d) took ([\d.]+) ms, collected \d+ "
                     r"\(pid (\d+), monotonic ([\d.]+)\)")


def gap_events(result: dict) -> list[tuple[float, float, int, int]]:
    """(end time, gap seconds, index in its request, gaps in its request) of every gap."""
    events = []
    for start, ttft, gaps in zip(result["starts"], result["ttfts"], result["itls"]):
        now = start + ttft
        for index, gap in enumerate(gaps):
            now += gap
            events.append((now, gap, index, len(gaps)))
    return events


def collections(log: Path) -> list[tuple[float, float, int, int]]:
    """(start, seconds, generation, pid) of each logged collection."""
    found = []
    for match in GC_LINE.finditer(log.read_text(errors="replace")):
        generation, millis, pid, began = match.groups()
        found.append((float(began), float(millis) / 1e3, int(generation), int(pid)))
    return found


def steps(log: Path) -> list[tuple[float, float, int, int, float, float | None]]:
    """(start, seconds with the time outside steps before it, requests, prefill tokens,
    seconds outside steps, the landed step's device seconds or None) of each slow step."""
    return [(float(began) - float(out) / 1e3, (float(millis) + float(out)) / 1e3, int(reqs),
             int(prefill), float(out) / 1e3, float(device) / 1e3 if device else None)
            for millis, began, reqs, _, prefill, out, device in STEP_LINE.findall(
                log.read_text(errors="replace"))]


def _overlapping(slow: list, windows: list) -> int:
    """How many slow gaps overlap one of the (start, seconds, ...) windows."""
    return sum(any(at - gap <= began + secs and began <= at for began, secs, *_ in windows)
               for at, gap, _, _ in slow)


def step_makeup(slow_steps: list) -> dict:
    """The slow steps: how many, how many carried prefill (their tokens' median), how many
    waited 2 ms or more outside steps (the core loop's own work) before they began."""
    prefill = [step[3] for step in slow_steps if step[3]]
    device = [step[5] for step in slow_steps if len(step) > 5 and step[5] is not None]
    return {"count": len(slow_steps), "with_prefill": len(prefill),
            "median_device_ms": 1e3 * statistics.median(device) if device else None,
            "median_prefill_tokens": statistics.median(prefill) if prefill else 0,
            "median_ms": 1e3 * statistics.median(s[1] for s in slow_steps) if slow_steps else 0,
            "after_2ms_outside_steps": sum(step[4] >= 2e-3 for step in slow_steps)}


def report(result: dict, pauses: list, factor: float, step_list: list = ()) -> dict:
    """The slow gaps' count, share, place in their requests (eighths), their overlap with
    collections and with steps over factor x the median gap, and those steps' makeup."""
    first = min(result["starts"])
    last = max(start + e2el for start, e2el in zip(result["starts"], result["e2els"]))
    pauses = [p for p in pauses if first <= p[0] <= last]  # the run's, not start-up's
    step_list = [s for s in step_list if first <= s[0] <= last]
    events = gap_events(result)
    median = statistics.median(gap for _, gap, _, _ in events)
    slow = [e for e in events if e[1] > factor * median]
    eighths = [0] * 8
    for _, _, index, count in slow:
        eighths[min(7, 8 * index // max(count, 1))] += 1
    during = _overlapping(slow, pauses)
    slow_steps = [s for s in step_list if s[1] > factor * median]
    by_generation: dict[int, list[float]] = {}
    for _, secs, generation, _ in pauses:
        by_generation.setdefault(generation, []).append(secs * 1e3)
    return {"gaps": len(events), "median_ms": median * 1e3, "factor": factor,
            "slow": len(slow), "slow_share": len(slow) / max(len(events), 1),
            "slow_by_eighth": eighths, "slow_during_a_collection": during,
            "slow_during_a_slow_step": _overlapping(slow, slow_steps),
            "slow_steps": step_makeup(slow_steps),
            "collections": {g: {"count": len(ms), "total_ms": sum(ms), "max_ms": max(ms)}
                            for g, ms in sorted(by_generation.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--log", type=Path, help="the server's log (gc lines)")
    parser.add_argument("--factor", type=float, default=3.0)
    opts = parser.parse_args()
    pauses = collections(opts.log) if opts.log else []
    step_list = steps(opts.log) if opts.log else []
    print(json.dumps(report(json.loads(opts.result.read_text()), pauses, opts.factor,
                            step_list)))


if __name__ == "__main__":
    main()
