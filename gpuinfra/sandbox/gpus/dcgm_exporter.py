#!/usr/bin/python3
"""The sandbox's stand-in for NVIDIA's DCGM exporter, which needs real GPUs and DCGM. It takes the exporter's own
arguments and publishes the counters its counters file (-f) names, in the exporter's format and with its labels,
made from the same answers as the stand-in nvidia-smi (the state `gpuinfra-sandbox-gpu` set on this node); the XID
counter holds the last XID the sandbox's kernel log shows for the GPU since that state was set (a state is the
driver loaded anew). The GPU-to-job files of --hpc-job-mapping-dir give an allocated GPU's series an hpc_job label,
one series per job, as the exporter's.

It serves nothing itself: the node's real node exporter does, with only a textfile collector of this program's
output and the exporter's --web-config-file (TLS, basic auth checked against bcrypt hashes), so Prometheus scrapes it
as it scrapes the exporter. The answers are read again each second, where DCGM samples every -c milliseconds."""

import argparse
import contextlib
import glob
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable

HERE = os.path.dirname(os.path.realpath(__file__))
FOLDER = "/var/lib/gpuinfra-sandbox"
STATE = os.path.join(FOLDER, "gpu-state")
KERNEL_LOG = os.path.join(FOLDER, "kern.log")
OUTPUT = "/run/gpuinfra-sandbox-dcgm"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
NVML = ("/usr/lib/*-linux-gnu/libnvidia-ml.so.1", "/usr/lib/*-linux-gnu/nvidia/current/libnvidia-ml.so.1")
XID = re.compile(r"^(\S+) \S+ kernel: NVRM: Xid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):[0-9a-fA-F]{2}\): (\d+)")

# The clock event reasons NVML reports as a bit mask (nvmlClocksEventReason*), by nvidia-smi's names.
EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


def number(gpu: ET.Element, path: str) -> float | None:
    """The leading number of an answer ("69.40 W", "32 C", "Yes"), None where the answer has none."""
    found = gpu.find(path)
    text = (found.text or "").strip() if found is not None else ""
    if text in ("Yes", "No"):
        return float(text == "Yes")
    match = re.match(r"-?\d+(\.\d+)?", text)
    return float(match.group()) if match else None


def total(gpu: ET.Element, paths: list[str]) -> float | None:
    values = [v for v in (number(gpu, p) for p in paths) if v is not None]
    return sum(values) if values else None


def event_reasons(gpu: ET.Element) -> float:
    reasons = gpu.find("clocks_event_reasons")
    active = [bit for name, bit in EVENT_BITS.items() if reasons is not None
              and reasons.findtext(f"clocks_event_reason_{name}") == "Active"]  # fmt: skip
    return float(sum(active))


def ecc(kind: str, correctable: bool) -> list[str]:
    names = ["sram_correctable", "dram_correctable"] if correctable else [
        "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable"]  # fmt: skip
    return [f"ecc_errors/{kind}/{name}" for name in names]


# The counter of the last XID, which the kernel log answers; each other counter the stand-in can answer, from one
# GPU's nvidia-smi answer.
XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"
FIELDS: dict[str, Callable[[ET.Element], float | None]] = {
    "DCGM_FI_DEV_GPU_TEMP": lambda g: number(g, "temperature/gpu_temp"),
    "DCGM_FI_DEV_MEMORY_TEMP": lambda g: number(g, "temperature/memory_temp"),
    "DCGM_FI_DEV_POWER_USAGE": lambda g: number(g, "gpu_power_readings/instant_power_draw"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": lambda g: number(g, "gpu_power_readings/current_power_limit"),
    "DCGM_FI_DEV_SM_CLOCK": lambda g: number(g, "clocks/sm_clock"),
    "DCGM_FI_DEV_MEM_CLOCK": lambda g: number(g, "clocks/mem_clock"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": event_reasons,
    "DCGM_FI_DEV_POWER_VIOLATION": lambda g: number(
        g, "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": lambda g: total(g, [
        "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_therm_slowdown",
        "clocks_event_reasons_counters/clocks_event_reasons_counters_hw_therm_slowdown"]),
    "DCGM_FI_DEV_FB_FREE": lambda g: number(g, "fb_memory_usage/free"),
    "DCGM_FI_DEV_FB_USED": lambda g: number(g, "fb_memory_usage/used"),
    "DCGM_FI_DEV_GPU_UTIL": lambda g: number(g, "utilization/gpu_util"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g: number(g, "utilization/memory_util"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda g: number(g, "pci/replay_counter"),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": lambda g: total(g, ecc("volatile", True)),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": lambda g: total(g, ecc("volatile", False)),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": lambda g: total(g, ecc("aggregate", True)),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": lambda g: total(g, ecc("aggregate", False)),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": lambda g: number(g, "remapped_rows/remapped_row_unc"),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": lambda g: number(g, "remapped_rows/remapped_row_corr"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": lambda g: number(g, "remapped_rows/remapped_row_failure"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": lambda g: number(g, "remapped_rows/remapped_row_pending"),
}  # fmt: skip


def counters(path: str) -> list[tuple[str, str, str]]:
    """The counters file's lines (`DCGM_FI_..., type, help`), as the exporter reads them."""
    out = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip() and not line.lstrip().startswith("#"):
                name, kind, text = (part.strip() for part in line.split(",", 2))
                out.append((name, kind, text))
    return out


def state() -> tuple[str, float]:
    """The GPU state this node answers with, and since when."""
    try:
        with open(STATE, encoding="ascii") as handle:
            return handle.read().strip() or "healthy", os.stat(STATE).st_mtime
    except FileNotFoundError:
        return "healthy", 0.0


def last_xids(since: float) -> dict[tuple[int, int], int]:
    """The last XID of each GPU, by its PCI (domain, bus), that the kernel log shows since `since`."""
    out: dict[tuple[int, int], int] = {}
    try:
        with open(KERNEL_LOG, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                match = XID.match(line)
                if match and time.mktime(time.strptime(match[1], "%Y-%m-%dT%H:%M:%S%z")) >= int(since):
                    out[(int(match[2], 16), int(match[3], 16))] = int(match[4])
    except (FileNotFoundError, ValueError):
        pass
    return out


def jobs(folder: str, index: str) -> list[str]:
    """The jobs the GPU-to-job file of GPU `index` names; none without mapping."""
    try:
        with open(os.path.join(folder, index), encoding="utf-8") as handle:
            return [line.strip() for line in handle if line.strip()]
    except (FileNotFoundError, NotADirectoryError):
        return []


def label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(wanted: list[tuple[str, str, str]], mapping: str) -> str:
    """The exposition text of every counter wanted that the node's GPU answer holds."""
    name, since = state()
    if not any(glob.glob(pattern) for pattern in NVML):
        return ""  # no driver: DCGM sees no GPU
    gpus = ET.parse(os.path.join(HERE, f"{name}.xml")).getroot().findall("gpu")
    xids = last_xids(since)
    host = os.uname().nodename
    # Each GPU's label sets (one per job that holds it) and last XID, read once for all its counters.
    per_gpu = []
    for gpu in gpus:
        index = gpu.findtext("minor_number", "0")
        bus = gpu.findtext("pci/pci_bus_id", "")
        labels = (f'gpu="{index}",UUID="{label(gpu.findtext("uuid", ""))}",pci_bus_id="{label(bus)}",'
                  f'device="nvidia{index}",modelName="{label(gpu.findtext("product_name", ""))}",'
                  f'Hostname="{label(host)}"')  # fmt: skip
        sets = [labels + (f',hpc_job="{label(job)}"' if job else "") for job in jobs(mapping, index) or [""]]
        per_gpu.append((gpu, xids.get((int(bus[4:8], 16), int(bus[9:11], 16)), 0), sets))
    lines = []
    for field, kind, text in wanted:
        read = FIELDS.get(field)
        if read is None and field != XID_FIELD:
            continue
        lines += [f"# HELP {field} {text}", f"# TYPE {field} {kind}"]
        for gpu, xid, sets in per_gpu:
            value = read(gpu) if read is not None else xid
            if value is not None:
                lines += [f"{field}{{{labelled}}} {value:g}" for labelled in sets]
    return "\n".join(lines) + "\n" if lines else ""


def write(text: str) -> None:
    """Replace the textfile at once, so that a scrape never reads half of it."""
    temporary = os.path.join(OUTPUT, ".dcgm.prom")
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, os.path.join(OUTPUT, "dcgm.prom"))


def main() -> int:
    parser = argparse.ArgumentParser(prog="dcgm-exporter", description=__doc__.split("\n")[0])
    parser.add_argument("-f", "--collectors", required=True)
    parser.add_argument("-a", "--address", default=":9400")
    parser.add_argument("-c", "--collect-interval", type=int, default=30000)
    parser.add_argument("--hpc-job-mapping-dir", default="")
    parser.add_argument("--web-config-file", default="")
    args = parser.parse_args()
    wanted = counters(args.collectors)
    os.makedirs(OUTPUT, mode=0o755, exist_ok=True)
    write(metrics(wanted, args.hpc_job_mapping_dir))
    serve = [
        NODE_EXPORTER, f"--web.listen-address={args.address}", "--web.disable-exporter-metrics",
        "--collector.disable-defaults", "--collector.textfile", f"--collector.textfile.directory={OUTPUT}",
    ]  # fmt: skip
    if args.web_config_file:
        serve.append(f"--web.config.file={args.web_config_file}")
    server = subprocess.Popen(serve)
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())
    while server.poll() is None:
        write(metrics(wanted, args.hpc_job_mapping_dir))
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=1)
    return server.returncode if server.returncode > 0 else 0


if __name__ == "__main__":
    sys.exit(main())
