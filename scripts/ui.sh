#!/usr/bin/env bash
# Browse what scripts/curriculum.sh recorded: the Prefect UI (flow runs, from runs/services/prefect) on
# http://127.0.0.1:4200 and the MLflow UI (metrics, images, from runs/services/mlflow/mlflow.db) on
# http://127.0.0.1:5000, until Ctrl-C, which stops both. A Prefect server that is already up is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1
# shellcheck source=scripts/services-env.sh
. scripts/services-env.sh
MLFLOW_PORT=${MLFLOW_PORT:-5000}
PGIDS=()
cleanup() {
    for pgid in "${PGIDS[@]}"; do stop_group "$pgid"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if ! prefect server status > /dev/null 2>&1; then
    setsid prefect server start > "$SERVICES/prefect-ui.log" 2>&1 &
    PGIDS+=($!)
fi
# Its own process group, so that stop_group ends its uvicorn worker too. One worker and no job runner (seven huey
# consumers): browsing needs neither, and a cold start on 2 cores takes half the time.
MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid mlflow ui --backend-store-uri "$MLFLOW_TRACKING_URI" \
    --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 1 > "$SERVICES/mlflow-ui.log" 2>&1 &
PGIDS+=($!)
prefect server status --wait --timeout 180 > /dev/null
echo "Prefect UI: http://127.0.0.1:$PREFECT_SERVER_API_PORT   (log $SERVICES/prefect-ui.log)"
python - "http://127.0.0.1:$MLFLOW_PORT/health" <<'PY'
import sys, time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2)
        break
    except OSError:
        time.sleep(0.5)
PY
echo "MLflow UI:  http://127.0.0.1:$MLFLOW_PORT   (log $SERVICES/mlflow-ui.log)"
echo "Ctrl-C stops both."
wait
