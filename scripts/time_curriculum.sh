#!/usr/bin/env bash
# Wall time of ./scripts/curriculum.sh at several commits, run in turn (A B A B ...) so that drift in the
# machine's speed falls on every commit alike. Each commit gets its own checkout and .venv under $WORK (set up
# once, before the first timed run); each timed run starts from an empty runs/ (no Prefect cache, no MLflow
# store, no stage outputs), so it does the whole curriculum. The times go to $WORK/times.tsv, one line per run;
# a killed timing resumes at the first run missing from it. At the end: each commit's runs, mean and range, for
# two commits the difference with its 95% Welch interval, and whether every run's per-stage table (results.md) is
# the same to the byte.
#   scripts/time_curriculum.sh [-r REPEATS] COMMIT...      (default 2 repeats; WORK=/tmp/vgrpo-timing)
# The checkouts stay for a later resume; `git worktree remove --force $WORK/<sha>` drops one.
set -euo pipefail
REPEATS=2
if [ "${1:-}" = -r ]; then REPEATS=$2; shift 2; fi
[ $# -ge 1 ] || { echo "usage: $0 [-r REPEATS] COMMIT..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/vgrpo-timing}
mkdir -p "$WORK"
TIMES=$WORK/times.tsv
touch "$TIMES"

SHAS=()
for commit in "$@"; do
    SHAS+=("$(git -C "$ROOT" rev-parse --short=12 "$commit^{commit}")")
done
for sha in "${SHAS[@]}"; do
    tree=$WORK/$sha
    if [ ! -d "$tree" ]; then
        git -C "$ROOT" worktree add --detach "$tree" "$sha" > /dev/null
    fi
    [ -x "$tree/.venv/bin/python" ] || (cd "$tree" && ./scripts/setup.sh)
done

for repeat in $(seq 1 "$REPEATS"); do
    for sha in "${SHAS[@]}"; do
        if awk -v s="$sha" -v r="$repeat" '$1 == s && $2 == r {found = 1} END {exit !found}' "$TIMES"; then
            continue
        fi
        tree=$WORK/$sha
        rm -rf "$tree/runs"
        log=$WORK/$sha-$repeat.log
        echo "$(date -u +%FT%TZ) $sha repeat $repeat: ./scripts/curriculum.sh (log $log)"
        start=$(date +%s.%N)
        (cd "$tree" && ./scripts/curriculum.sh) > "$log" 2>&1
        end=$(date +%s.%N)
        mkdir -p "$WORK/results"
        find "$tree/runs/curriculum" -name results.md -exec cp {} "$WORK/results/$sha-$repeat.md" \;
        printf '%s\t%s\t%.1f\t%s\n' "$sha" "$repeat" "$(echo "$end - $start" | bc)" \
            "$(cut -d' ' -f1 /proc/loadavg)" >> "$TIMES"
    done
done

"$WORK/${SHAS[0]}/.venv/bin/python" - "$TIMES" "${SHAS[@]}" <<'PY'
import statistics
import sys

from scipy import stats

times_path, shas = sys.argv[1], sys.argv[2:]
rows = [line.split("\t") for line in open(times_path).read().splitlines()]
times = {s: [float(r[2]) for r in rows if r[0] == s] for s in shas}
print("commit        runs   mean_s    min_s    max_s")
for s, t in times.items():
    print(f"{s}  {len(t):4d}  {statistics.mean(t):7.1f}  {min(t):7.1f}  {max(t):7.1f}")
if len(shas) == 2 and all(len(t) >= 2 for t in times.values()):
    a, b = times[shas[0]], times[shas[1]]
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    diff, half = statistics.mean(b) - statistics.mean(a), stats.t.ppf(0.975, df) * (va + vb) ** 0.5
    rel = 100 / statistics.mean(a)
    print(
        f"{shas[1]} minus {shas[0]}: {diff:+.1f} s ({diff * rel:+.1f}%), 95% Welch interval "
        f"[{diff - half:+.1f}, {diff + half:+.1f}] s ([{(diff - half) * rel:+.0f}%, {(diff + half) * rel:+.0f}%])"
    )
PY
if [ "$(sha256sum "$WORK"/results/*.md | awk '{print $1}' | sort -u | wc -l)" -eq 1 ]; then
    echo "every run's results.md is the same to the byte"
else
    echo "results.md differs between runs:"
    sha256sum "$WORK"/results/*.md
fi
