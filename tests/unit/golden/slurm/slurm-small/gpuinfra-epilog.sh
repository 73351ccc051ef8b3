#!/bin/sh
# Managed by gpuinfra: changes here are overwritten on the next apply.
# Slurm epilog: removes the job-mapping files the prolog wrote for this job. A file that names another job is
# left alone. A failing epilog drains the node, so problems are logged and the epilog succeeds.
dir=/var/lib/dcgm-exporter/job-mapping
[ -n "$dir" ] && [ -d "$dir" ] || exit 0
gpus="${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}"
[ -n "$gpus" ] && [ -n "$SLURM_JOB_ID" ] || exit 0
for gpu in $(echo "$gpus" | tr ',' ' '); do
    case "$gpu" in *[!0-9]*) continue ;; esac
    if [ -f "$dir/$gpu" ] && [ "$(cat "$dir/$gpu")" = "$SLURM_JOB_ID" ]; then
        rm -f "$dir/$gpu" || logger -t gpuinfra-slurm-epilog "job $SLURM_JOB_ID: cannot remove $dir/$gpu"
    fi
done
exit 0
