#!/usr/bin/env bash
# Wall time of ./scripts/curriculum.sh at several commits, run in turn (A B A B ...) so that drift in the
# machine's speed falls on every commit alike. Each commit gets its own checkout and .venv under $WORK (set up
# once, before the first timed run); each timed run starts from an empty runs/ (no Prefect cache, no MLflow
# store, no stage outputs), so it does the whole curriculum. The times go to $WORK/times.tsv, one line per run;
# a killed timing resumes at the first run missing from it. At the end: each commit's median, min and max,
# and whether every commit's per-stage table (results.md) is the same to the byte.
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

for commit in "$@"; do
    sha=$(git -C "$ROOT" rev-parse --short=12 "$commit^{commit}")
    tree=$WORK/$sha
    if [ ! -d "$tree" ]; then
        git -C "$ROOT" worktree add --detach "$tree" "$sha" > /dev/null
    fi
    [ -x "$tree/.venv/bin/python" ] || (cd "$tree" && ./scripts/setup.sh)
done

for repeat in $(seq 1 "$REPEATS"); do
    for commit in "$@"; do
        sha=$(git -C "$ROOT" rev-parse --short=12 "$commit^{commit}")
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

echo "commit        runs  median_s  min_s    max_s"
for commit in "$@"; do
    sha=$(git -C "$ROOT" rev-parse --short=12 "$commit^{commit}")
    awk -v s="$sha" '$1 == s {print $3}' "$TIMES" | sort -n | awk -v s="$sha" '
        {t[NR] = $1} END {
            m = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
            printf "%s  %4d  %8.1f  %7.1f  %7.1f\n", s, NR, m, t[1], t[NR]
        }'
done
if [ "$(sha256sum "$WORK"/results/*.md | awk '{print $1}' | sort -u | wc -l)" -eq 1 ]; then
    echo "every run's results.md is the same to the byte"
else
    echo "results.md differs between runs:"
    sha256sum "$WORK"/results/*.md
fi
