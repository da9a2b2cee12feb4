#!/usr/bin/env bash
# One command: set up, start a Prefect server on 127.0.0.1:4200 (Prefect's own `prefect server start --background`,
# home runs/services/prefect), serve the deployments, run the embedded curriculum through its Prefect deployment
# and watch it, print its per-stage table and the before/after evaluation, then stop everything. MLflow logs straight
# to runs/services/mlflow/mlflow.db (no server; browse with scripts/ui.sh).
# The terminal shows one live progress line (flows/watch.py: stage k of n, iteration i of m, s/it, ETA, the last
# rewards); Prefect's event stream goes to runs/services/watch.log, the flow's own log to runs/services/serve.log
# (and both to the Prefect UI). At the end: the wall time by part (flows/time_split.py), also written to
# metrics/curriculum_time.json.
# Extra arguments go to `prefect deployment run`, e.g.  -p 'overrides={"iterations": 2}'; with
#   -p curriculum=params/curricula/embedded-validation.yaml   the recipe's stages evaluated on validation (tuning; no
#   test-split evaluation follows)
# VGRPO_DEPLOYMENT picks another deployment (flows/deploy.py), PREFECT_SERVER_API_PORT another port.
set -euo pipefail
cd "$(dirname "$0")/.."
MARKS=$(mktemp)
mark() { echo "$1 $(date +%s.%N)" >> "$MARKS"; }
mark start
./scripts/setup.sh
mark setup
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
DEPLOYMENT=${VGRPO_DEPLOYMENT:-embedded-curriculum}
# shellcheck source=scripts/services-env.sh
. scripts/services-env.sh
[ -f data/world/validation.jsonl ] || dvc repro world_splits   # the world's prompt files (seconds)

# A pid file whose process is gone (a killed run) would make `prefect server start --background` refuse.
PID_FILE=$PREFECT_HOME/server.pid
if [ -f "$PID_FILE" ] && ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then rm -f "$PID_FILE"; fi
# setsid: the server gets its own process group, so a Ctrl-C reaches it only through the cleanup below,
# after the serve process has stopped.
setsid -w prefect server start --background > "$SERVICES/server.log" 2>&1 || {
    tail -n 20 "$SERVICES/server.log" >&2
    echo "If a server of an earlier run is still up: PREFECT_HOME=$PREFECT_HOME prefect server stop" >&2
    exit 1
}
SERVE_PGID=
WATCH_PID=
cleanup() {
    if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null || true; fi
    if [ -n "$SERVE_PGID" ]; then stop_group "$SERVE_PGID"; fi   # serve first: its flow run reports to the server
    stop_prefect
    rm -f "$MARKS"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
prefect server status --wait --timeout 180 > /dev/null
setsid python -m flows.deploy > "$SERVICES/serve.log" 2>&1 &
SERVE_PGID=$!
until prefect deployment inspect "vgrpo/$DEPLOYMENT" > /dev/null 2>&1; do   # the serve process registers them
    kill -0 "$SERVE_PGID" 2>/dev/null || { tail -n 40 "$SERVICES/serve.log"; exit 1; }
    sleep 2
done
STARTED=$SERVICES/.run-started
touch "$STARTED"
mark services
echo "Running vgrpo/$DEPLOYMENT (Prefect's events: $SERVICES/watch.log, the flow's log: $SERVICES/serve.log)"
prefect deployment run "vgrpo/$DEPLOYMENT" --watch "$@" > "$SERVICES/watch.log" 2>&1 &
WATCH_PID=$!
python -m flows.watch --root runs/curriculum --since "$STARTED" --pid "$WATCH_PID"
if ! wait "$WATCH_PID"; then
    WATCH_PID=
    echo "The flow run failed; the end of its log ($SERVICES/serve.log):" >&2
    tail -n 40 "$SERVICES/serve.log" >&2
    exit 1
fi
WATCH_PID=
mark flow
echo
# The flow writes its final per-stage table to runs/curriculum/<curriculum name>/results.md.
TABLES=0
while IFS= read -r -d '' table; do
    echo "$table:"
    cat "$table"
    echo
    TABLES=$((TABLES + 1))
done < <(find runs/curriculum -name results.md -newer "$STARTED" -print0 2>/dev/null)
[ "$TABLES" -gt 0 ] || echo "(this run wrote no runs/curriculum/*/results.md)"
# A run of another curriculum (-p curriculum=params/curricula/embedded-validation.yaml: tuning, on validation) reads
# no test split: its stage table above is its result.
case " $* " in *curriculum=*) FINAL_REPORT=0 ;; *) FINAL_REPORT=1 ;; esac
if [ "$DEPLOYMENT" = embedded-curriculum ] && [ "$FINAL_REPORT" = 1 ]; then
    # The headline evaluation (every test prompt, 4 images each) of the last stage's adapter, paired with the
    # base's (metrics/base_eval.json: same prompts, seeds and settings), so every gain carries its 95% CI.
    OUT=runs/curriculum/embedded-curriculum
    echo "Before/after on the test split (base: metrics/base_eval.json):"
    python -m vgrpo.cli evaluate models/embedded-base --lora "$OUT/stages/s5-ocr" --prompts data/world/test.jsonl \
        --params params/embedded/evaluate.yaml --baseline metrics/base_eval.json --out "$OUT/eval.json" \
        --grid "$OUT/grid.png"
    echo "The compositional-generalisation probe (held-out colour-shape pairs; base: metrics/base_probe.json):"
    python -m vgrpo.cli evaluate models/embedded-base --lora "$OUT/stages/s5-ocr" --prompts data/world/probe.jsonl \
        --params params/embedded/evaluate.yaml --baseline metrics/base_probe.json --out "$OUT/probe.json"
    python -m tasks.dvc_report side-by-side plots/base_grid.png "$OUT/grid.png" \
        --titles "the base" "after the curriculum" --out "$OUT/base_vs_curriculum.png" > /dev/null
    echo "Image grids (captioned; green frame = credited by the detector or OCR): $OUT/grid.png, and beside the"
    echo "base's: $OUT/base_vs_curriculum.png"
fi
mark evaluations
SPLIT_FLOW=$(find runs/curriculum -name time_split.json -newer "$STARTED" -print 2>/dev/null | head -n 1)
mark end
echo "Wall time by part (training, evaluation, loading and start-up, orchestration: flows/time_split.py):"
python -m flows.time_split --marks "$MARKS" ${SPLIT_FLOW:+--flow "$SPLIT_FLOW"} --out metrics/curriculum_time.json
echo "Stage outputs: runs/curriculum/"
echo "Browse the runs (./scripts/ui.sh starts both):"
echo "  Prefect: PREFECT_HOME=$PREFECT_HOME prefect server start --host 127.0.0.1 --port $PREFECT_SERVER_API_PORT   # http://127.0.0.1:$PREFECT_SERVER_API_PORT"
echo "  MLflow:  mlflow ui --backend-store-uri $MLFLOW_TRACKING_URI --host 127.0.0.1   # http://127.0.0.1:5000"
