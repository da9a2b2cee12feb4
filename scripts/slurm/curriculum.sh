#!/usr/bin/env bash
# Every stage of a curriculum as a Slurm job (scripts/slurm/stage.sbatch), each starting once the previous one
# succeeded (--dependency=afterok), so each stage holds its nodes only while it trains (docs/cluster.md, "Slurm").
#   scripts/slurm/curriculum.sh params/curricula/embedded.yaml runs/slurm/embedded [SBATCH OPTIONS...]
#   scripts/slurm/curriculum.sh params/curricula/embedded.yaml runs/slurm/embedded --nodes=4 --partition=gpu
# FROM=3 starts at stage 3 (after the earlier ones finished); AFTER=JOBID makes the first job wait for that one.
# Prints one line per stage: its number and job id. Stage N starts from stage N-1's adapter in the run folder.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 2 ]; then
    echo "usage: $0 CURRICULUM RUN_ROOT [SBATCH OPTIONS...]" >&2
    exit 2
fi
CURRICULUM=$1 RUN_ROOT=$2
shift 2
# shellcheck disable=SC1091
. "${VGRPO_VENV:-.venv}/bin/activate"
# The stage count only (the jobs validate the params themselves: an invalid stage fails its job, and the jobs after
# it are cancelled by --kill-on-invalid-dep).
STAGES=$(python -c 'import sys, yaml; print(len(yaml.safe_load(open(sys.argv[1]))["curriculum"]["stages"]))' "$CURRICULUM")
NAME=$(basename "$CURRICULUM" .yaml)
previous=${AFTER:-}
for ((stage = ${FROM:-1}; stage <= STAGES; stage++)); do
    options=(--parsable --job-name="vgrpo-$NAME-$stage")
    [ -n "$previous" ] && options+=(--dependency="afterok:$previous" --kill-on-invalid-dep=yes)
    submitted=$(sbatch "${options[@]}" "$@" scripts/slurm/stage.sbatch \
        --curriculum "$CURRICULUM" --stage "$stage" --run-root "$RUN_ROOT")
    previous=${submitted%%;*}  # --parsable prints "jobid" or "jobid;cluster"
    echo "$stage $previous"
done
