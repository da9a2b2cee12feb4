#!/usr/bin/env bash
# A Prefect worker on this machine for the team's work pool (docs/cluster.md): it takes the pool's flow runs
# (curricula, sweep cells) up to one per device at once and runs them in this checkout.
#   . /shared/team.env; . ~/.vgrpo/secrets.env  # PREFECT_API_URL, MLFLOW_TRACKING_URI, VGRPO_STORE; credentials
#   VGRPO_DEVICES=0,1,2,3 scripts/worker.sh    # 4 GPUs: 4 flow runs at once, each on its own device
#   VGRPO_DEVICES=cpu:2 scripts/worker.sh      # no GPU: 2 flow runs at once on the CPU
# VGRPO_POOL (default vgrpo) and VGRPO_QUEUE (default gpu; the sweep's own runs go to "control") pick the pool
# and its queue; extra arguments go to `prefect worker start`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. .venv/bin/activate
: "${PREFECT_API_URL:?source the team's environment first (docs/cluster.md)}"
DEVICES=${VGRPO_DEVICES:-cpu:1}
case "$DEVICES" in
    cpu:*) LIMIT=${DEVICES#cpu:} ;;
    *) LIMIT=$(echo "$DEVICES" | tr ',' '\n' | grep -c .) ;;
esac
LIMIT=${VGRPO_LIMIT:-$LIMIT}  # 1 on the workers of stages across machines: each machine one run at a time
# Each flow run sends a heartbeat this often: a run that goes silent is crashed and retried (flows/recovery.py).
export PREFECT_FLOWS_HEARTBEAT_FREQUENCY=${PREFECT_FLOWS_HEARTBEAT_FREQUENCY:-30}
export VGRPO_ROOT=$PWD VGRPO_DEVICES=$DEVICES HF_HUB_OFFLINE=1
exec prefect worker start --pool "${VGRPO_POOL:-vgrpo}" --work-queue "${VGRPO_QUEUE:-gpu}" --type process \
    --limit "$LIMIT" --name "$(hostname)-$(basename "$PWD")" "$@"
