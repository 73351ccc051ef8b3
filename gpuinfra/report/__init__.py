"""Reports on a running cluster: GPU-hours per account, user and partition (`gpuinfra report usage`), and jobs
whose GPUs sit idle (`gpuinfra report idle`).

The facts come from the cluster itself, read through playbooks/report.yml: Slurm's accounting (sacct) and queue
(squeue) on the controller, and Prometheus's DCGM metrics on the monitoring host. Everything else here is pure:
parsing what those tools print, clipping jobs to the report's window, joining jobs with their GPU metrics,
aggregating, and rendering tables, CSV and JSON.
"""
