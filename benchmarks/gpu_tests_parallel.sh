#!/usr/bin/env bash
# Run pytest node ids (or -k expressions' files) in N parallel processes on one GPU, each
# process taking every N-th id, logs under $OUT (or /tmp): for many small GPU test cases whose
# time is mostly compilation on the host's cores. Usage:
#   bash benchmarks/gpu_tests_parallel.sh N ID [ID ...]
set -u
streams=$1; shift
out=${OUT:-/tmp}
ids=("$@")
pids=()
for ((s = 0; s < streams; s++)); do
  mine=()
  for ((i = s; i < ${#ids[@]}; i += streams)); do mine+=("${ids[$i]}"); done
  [ ${#mine[@]} -gt 0 ] || continue
  python3 -m pytest -q -p no:cacheprovider "${mine[@]}" > "$out/gpu_tests_$s.txt" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
grep -h -E "passed|failed|error|FAILED|ERROR" "$out"/gpu_tests_*.txt
exit $rc
