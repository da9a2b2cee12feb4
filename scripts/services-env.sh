# shellcheck shell=bash
# Sourced by scripts/curriculum.sh and scripts/ui.sh (not run): where the local Prefect server and the MLflow
# store live, and how to stop them. MLflow needs no server: clients log straight to the sqlite file; `mlflow ui`
# is only for browsing.
SERVICES=${VGRPO_SERVICES:-runs/services}
mkdir -p "$SERVICES/prefect" "$SERVICES/mlflow"
SERVICES=$(cd "$SERVICES" && pwd)   # absolute: flow runs and DVC stages start in other directories
export PREFECT_HOME=$SERVICES/prefect   # the server's database, pid file and the flows' persisted results
export PREFECT_SERVER_API_HOST=127.0.0.1 PREFECT_SERVER_API_PORT=${PREFECT_SERVER_API_PORT:-4200}
export PREFECT_API_URL=http://127.0.0.1:$PREFECT_SERVER_API_PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_RUNNER_POLL_FREQUENCY=2
export MLFLOW_TRACKING_URI=sqlite:///$SERVICES/mlflow/mlflow.db

# stop_group PGID: SIGTERM the process group, wait up to 15 s, then SIGKILL what is left.
stop_group() {
    kill -TERM -- "-$1" 2>/dev/null || return 0
    for _ in $(seq 1 150); do
        kill -0 -- "-$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$1" 2>/dev/null || true
}

# stop_prefect: Prefect's `prefect server stop` (SIGTERM to the pid in $PREFECT_HOME/server.pid), then wait up to
# 15 s for the server to exit (SIGKILL after), so that its port is free when this script returns.
stop_prefect() {
    local pid
    pid=$(cat "$PREFECT_HOME/server.pid" 2>/dev/null) || return 0
    prefect server stop > /dev/null || true
    for _ in $(seq 1 150); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}
