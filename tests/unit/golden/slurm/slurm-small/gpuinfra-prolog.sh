#!/bin/sh
# Managed by gpuinfra: changes here are overwritten on the next apply.
# Slurm prolog: slurmd runs it as root on each node of a new allocation (PrologFlags=Alloc), with SLURM_JOB_ID
# and the job's GPU indices on this node in SLURM_JOB_GPUS (and CUDA_VISIBLE_DEVICES).
# For dcgm-exporter's HPC job mapping it writes one file per GPU, named by the GPU index, holding the job id.
# A failing prolog drains the node, so problems are logged and the job goes on; except an unhealthy node.
# Other roles' preparation of the node for this job (each job user's enroot folders, ...).
for hook in /etc/slurm/gpuinfra-prolog.d/*.sh; do
    [ -x "$hook" ] || continue
    "$hook" || logger -t gpuinfra-slurm-prolog "job $SLURM_JOB_ID: $hook failed"
done
dir=/var/lib/dcgm-exporter/job-mapping
[ -n "$dir" ] || exit 0
gpus="${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}"
[ -n "$gpus" ] && [ -n "$SLURM_JOB_ID" ] || exit 0
umask 022
if ! mkdir -p "$dir"; then
    logger -t gpuinfra-slurm-prolog "job $SLURM_JOB_ID: cannot create $dir"
    exit 0
fi
for gpu in $(echo "$gpus" | tr ',' ' '); do
    case "$gpu" in
        *[!0-9]*) logger -t gpuinfra-slurm-prolog "job $SLURM_JOB_ID: skipping GPU '$gpu' (not an index)"; continue ;;
    esac
    # Written beside the final name and renamed, so the exporter never reads half a file.
    if ! { echo "$SLURM_JOB_ID" > "$dir/.$gpu.$SLURM_JOB_ID" && mv -f "$dir/.$gpu.$SLURM_JOB_ID" "$dir/$gpu"; }; then
        logger -t gpuinfra-slurm-prolog "job $SLURM_JOB_ID: cannot write $dir/$gpu"
    fi
done
exit 0
