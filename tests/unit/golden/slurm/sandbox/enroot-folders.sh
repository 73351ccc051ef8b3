#!/bin/sh
# Managed by gpuinfra: changes here are overwritten on the next apply.
# Run as root by the Slurm prolog before each job: the job user's own enroot folders (data, cache, runtime), owned
# by the user and 0700. Their parents are root's and 0755, so no user can make, swap or read another's; anything
# at a folder's place that is not the user's own folder (a link, a file, another owner's folder left from an older
# layout) is removed first.
set -u
uid=${SLURM_JOB_UID:-} gid=${SLURM_JOB_GID:-}
case "$uid$gid" in "" | *[!0-9]*) echo "no numeric SLURM_JOB_UID and SLURM_JOB_GID" >&2; exit 1 ;; esac
for parent in /var/lib/enroot/data /var/lib/enroot/cache /run/enroot; do
    folder="$parent/user-$uid"
    if [ -L "$folder" ] || { [ -e "$folder" ] && { [ ! -d "$folder" ] || [ "$(stat -c %u "$folder")" != "$uid" ]; }; }; then
        rm -rf --one-file-system -- "$folder" || exit 1
    fi
    install -d -o "$uid" -g "$gid" -m 0700 -- "$folder" || exit 1
done
