"""Where a served run's slow inter-token gaps fall: `bench serve`'s result (per-request gaps
and send times) beside the server's collector log ($COMPILED_LLM_GC_DEBUG=1 lines, one clock).
    python -m benchmarks.itl_gaps RESULT.json [--log SERVER.log] [--factor 3]
Prints the gaps over factor x the median: how many, where in their requests, and how many
fall while one of the server's collections ran (each collection stalls its process)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

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


def report(result: dict, pauses: list, factor: float) -> dict:
    """The slow gaps' count, share, place in their requests (eighths) and overlap with pauses."""
    events = gap_events(result)
    median = statistics.median(gap for _, gap, _, _ in events)
    slow = [e for e in events if e[1] > factor * median]
    eighths = [0] * 8
    for _, _, index, count in slow:
        eighths[min(7, 8 * index // max(count, 1))] += 1
    during = sum(any(at - gap <= began + secs and began <= at for began, secs, _, _ in pauses)
                 for at, gap, _, _ in slow)
    by_generation: dict[int, list[float]] = {}
    for _, secs, generation, _ in pauses:
        by_generation.setdefault(generation, []).append(secs * 1e3)
    return {"gaps": len(events), "median_ms": median * 1e3, "factor": factor,
            "slow": len(slow), "slow_share": len(slow) / max(len(events), 1),
            "slow_by_eighth": eighths, "slow_during_a_collection": during,
            "collections": {g: {"count": len(ms), "total_ms": sum(ms), "max_ms": max(ms)}
                            for g, ms in sorted(by_generation.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("--log", type=Path, help="the server's log (gc lines)")
    parser.add_argument("--factor", type=float, default=3.0)
    opts = parser.parse_args()
    pauses = collections(opts.log) if opts.log else []
    print(json.dumps(report(json.loads(opts.result.read_text()), pauses, opts.factor)))


if __name__ == "__main__":
    main()
