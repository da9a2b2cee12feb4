#!/usr/bin/env bash
# One command: set up, start the Prefect and MLflow servers (127.0.0.1), serve the deployments, run the
# embedded curriculum through its Prefect deployment and watch it, then stop everything by process group.
# Extra arguments go to `prefect deployment run`, e.g.  -p 'overrides={"iterations": 2}'
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
DEPLOYMENT=${VGRPO_DEPLOYMENT:-embedded-curriculum}
ROOT=${VGRPO_SERVICES:-runs/services}
mkdir -p "$ROOT"
[ -f data/world/train.jsonl ] || dvc repro world_splits   # the world's prompt files (seconds)
python -m flows.services up --root "$ROOT"
eval "$(python -m flows.services env --root "$ROOT")"
setsid python -m flows.deploy > "$ROOT/serve.log" 2>&1 &
SERVE_PGID=$!
cleanup() {
    kill -TERM -- "-$SERVE_PGID" 2>/dev/null || true
    python -m flows.services down --root "$ROOT"
}
trap cleanup EXIT
for _ in $(seq 1 60); do   # the serve process registers the deployments
    prefect deployment inspect "vgrpo/$DEPLOYMENT" >/dev/null 2>&1 && break
    sleep 2
done
prefect deployment run "vgrpo/$DEPLOYMENT" --watch "$@"
echo
# The flow prints its per-stage table in the serving process's log: show the last one here.
awk '/final evaluation of each stage/{p=1; buf=""} p&&/View run|Finished in state/{p=0} p{buf=buf $0 "\n"}
     END{printf "%s", buf}' "$ROOT/serve.log" | sed 's/^.*Flow run .* - //'
if [ "$DEPLOYMENT" = embedded-curriculum ]; then
    # The headline evaluation (every test prompt, 4 images each) of the last stage's adapter, paired with the
    # base's (metrics/base_eval.json: same prompts, seeds and settings), so every gain carries its 95% CI.
    OUT=runs/curriculum/embedded-curriculum
    echo "Before/after on the held-out test split (base: metrics/base_eval.json):"
    python -m vgrpo.cli evaluate models/embedded-base --lora "$OUT/stages/s5-ocr" --prompts data/world/test.jsonl \
        --params params/embedded/evaluate.yaml --baseline metrics/base_eval.json --out "$OUT/eval.json" \
        --grid "$OUT/grid.png"
    echo "Image grid (captioned; green frame = credited by the detector or OCR): $OUT/grid.png"
fi
echo "MLflow runs:   mlflow ui --backend-store-uri sqlite:///$(cd "$ROOT" && pwd)/mlflow/mlflow.db --host 127.0.0.1"
echo "Stage outputs: runs/curriculum/"
