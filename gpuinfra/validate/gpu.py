"""GPU rules: catalog models, driver branch and module flavour, NVSwitch fabric manager, MIG layouts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .. import catalog
from .. import mig_layouts as mig
from ..errors import InvalidInput
from ..model import Cluster, MigAssignment
from ..model.driver import DistributionSource
from ..resolve import ResolvedCluster, expand_gpu_indices
from .diagnostics import Diagnostics, suggest
from .source import read_yaml, to_plain


def parted_layouts(model: Cluster, report: Diagnostics) -> dict[str, dict[str, int]]:
    """Layouts from the cluster's mig-parted file; its own problems are reported against that file."""
    if not model.mig.parted_file:
        return {}
    path = Path(model.mig.parted_file)  # absolute: see load.absolute_paths
    if not path.exists():
        report.error(("mig", "parted_file"), f"{path} does not exist")
        return {}
    if not path.is_file():
        report.error(("mig", "parted_file"), f"{path} is not a regular file; give the path of a mig-parted YAML file")
        return {}
    try:
        source = read_yaml(path, display=str(path))
    except InvalidInput as exc:  # problems of the file itself, positioned in that file
        report.found.extend(exc.diagnostics)
        return {}
    configs, problems = mig.parse_parted(to_plain(source.data))
    for problem in problems:
        report.found.append(
            source.diagnostic(problem.path, ".".join(map(str, problem.path)), problem.message, problem.severity)
        )
    return mig.uniform_layouts(configs)


def check(rc: ResolvedCluster, report: Diagnostics) -> None:
    model = rc.model
    if any(g.gpu for g in model.node_groups.values()) and model.driver is None:
        report.error(("driver",), "node groups have GPUs but no driver is set; add `driver: {version: '...'}`")
    for name, group in model.node_groups.items():
        loc = ("node_groups", name)
        if group.gpu is None:
            if group.mig:
                report.error((*loc, "mig"), "this group has no GPUs; remove `mig` or add `gpu`")
            continue
        spec = catalog.lookup(group.gpu.model)
        if spec is None:
            report.error(
                (*loc, "gpu", "model"),
                f"{group.gpu.model!r} is not in the GPU catalog; {suggest(group.gpu.model, catalog.names())}",
            )
            continue
        if group.gpu.nvswitch and not spec.nvswitch_board:
            report.error(
                (*loc, "gpu", "nvswitch"),
                f"{spec.name} is a PCIe card, on no NVSwitch board: the fabric manager would never start; remove "
                "`nvswitch: true` (NVSwitch boards carry the SXM parts, H20, B200, GB200 and GH200)",
            )
        _driver(model, name, spec, group.gpu.nvswitch and spec.nvswitch_board, report)
        _mig(name, group.gpu.count, group.mig, spec, rc.layouts, report)
    _archive_driver(model, report)


def _archive_driver(model: Cluster, report: Diagnostics) -> None:
    """A driver from the OS archive must be of the branch that archive carries, on every OS of a GPU group."""
    driver = model.driver
    if driver is None or not isinstance(driver.source, DistributionSource):
        return
    groups_by_os: dict[str, list[str]] = {}
    for name, group in model.node_groups.items():
        if group.gpu is not None:
            groups_by_os.setdefault(group.os or model.os, []).append(name)
    for os_name, groups in groups_by_os.items():
        release = catalog.os_release(os_name)
        if release is None:
            continue
        suite = f"{release.codename}-backports" if driver.source.backports else release.codename
        carried = release.backports_driver if driver.source.backports else release.driver
        if carried is None:
            report.error(
                ("driver", "source", "backports"),
                f"{release.title} has no NVIDIA driver in {suite}; set backports: false",
            )
        elif driver.major != carried.branch:
            named = ", ".join(repr(g) for g in groups)
            report.error(
                ("driver", "version" if driver.version else "branch"),
                f"{release.title} carries driver branch {carried.branch} in {suite} (nvidia-kernel-dkms "
                f"{carried.version}), not {driver.major} (node group{'s' if len(groups) > 1 else ''} {named}): "
                f"use a {carried.branch} driver, or take {driver.major} from another source (type nvidia, mirror "
                "or local)",
            )


def _driver(model: Cluster, group: str, spec: catalog.GpuSpec, nvswitch: bool, report: Diagnostics) -> None:
    driver = model.driver
    if driver is None:
        return
    if driver.major < spec.min_driver_branch:
        report.error(
            ("driver", "version" if driver.version else "branch"),
            f"driver branch {driver.major} is older than {spec.name} supports "
            f"(node group {group!r} needs R{spec.min_driver_branch} or newer)",
        )
    if spec.requires_open_modules and driver.kernel_modules != "open":
        report.error(
            ("driver", "kernel_modules"),
            f"{spec.name} (node group {group!r}) needs the open kernel modules: set kernel_modules: open",
        )
    if driver.kernel_modules == "open" and not spec.supports_open_modules:
        report.error(
            ("driver", "kernel_modules"),
            f"{spec.name} (node group {group!r}) is older than Turing and needs the proprietary "
            "kernel modules: set kernel_modules: proprietary",
        )
    if nvswitch:
        if driver.version is None:
            report.error(
                ("driver", "branch"),
                f"node group {group!r} has NVSwitch: the fabric manager must match the driver "
                "exactly, so pin `version` instead of `branch`",
            )
        elif driver.fabric_manager_version and driver.fabric_manager_version != driver.version:
            report.error(
                ("driver", "fabric_manager_version"),
                f"the fabric manager must be at exactly the driver version {driver.version}",
            )


def _mig(
    group: str,
    count: int,
    assignments: list[MigAssignment],
    spec: catalog.GpuSpec,
    layouts: Mapping[str, Mapping[str, int]],
    report: Diagnostics,
) -> None:
    loc = ("node_groups", group)
    for i, assignment in enumerate(assignments):
        aloc = (*loc, "mig", i)
        if not spec.mig_profiles:
            report.error((*aloc, "layout"), f"{spec.name} does not support MIG")
            continue
        beyond = [index for index in expand_gpu_indices(assignment.gpus, count) if index >= count]
        if beyond:
            report.error(
                (*aloc, "gpus"),
                f"GPU index {beyond[0]} does not exist: this group has {count} GPUs (0-{count - 1})",
            )
        layout = layouts.get(assignment.layout)
        if layout is None:
            hint = suggest(assignment.layout, list(layouts))
            report.error((*aloc, "layout"), f"layout {assignment.layout!r} is not defined; {hint}")
            continue
        for problem in mig.check_layout(spec, dict(layout)):
            where = "" if spec.name in problem else f" on {spec.name}"  # most messages name the model already
            report.error((*aloc, "layout"), f"layout {assignment.layout!r}{where}: {problem}")
    taken: dict[int, int] = {}
    for i, assignment in enumerate(assignments):
        for index in expand_gpu_indices(assignment.gpus, count):
            if index in taken:
                report.error((*loc, "mig", i, "gpus"), f"GPU {index} already has a layout (mig[{taken[index]}])")
            taken.setdefault(index, i)
