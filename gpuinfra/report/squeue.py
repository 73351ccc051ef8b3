"""Running jobs as squeue prints them with `--Format=JobID:0SEPARATOR,UserName:0SEPARATOR,...` (each field at its
full width, followed by sacct.SEPARATOR; the last one, the allocated TRES, by nothing)."""

from __future__ import annotations

from dataclasses import dataclass

from .sacct import SEPARATOR, gpus_of_tres, split_records

# squeue's long format names, in output order. JobID is the job's own number (an array task's too), the one in
# the DCGM job mapping; a width of 0 prints a field whole, unpadded.
FIELDS: tuple[str, ...] = ("JobID", "UserName", "Account", "Partition", "tres-alloc")
FORMAT = ",".join(f"{name}:0{SEPARATOR}" for name in FIELDS[:-1]) + f",{FIELDS[-1]}:0"


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    user: str
    account: str
    partition: str
    gpus: int
    """GPUs allocated (gres/gpu of the allocated TRES)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "account": self.account,
            "partition": self.partition,
            "gpus": self.gpus,
        }


def parse_squeue(text: str) -> dict[str, RunningJob]:
    """Running jobs by job id, from `squeue --noheader --states=RUNNING --Format=FORMAT`."""
    jobs: dict[str, RunningJob] = {}
    for fields in split_records(text, len(FIELDS), "squeue"):
        job_id, user, account, partition, tres = (field.strip() for field in fields)
        jobs[job_id] = RunningJob(job_id, user, account, partition, gpus_of_tres(tres))
    return jobs
