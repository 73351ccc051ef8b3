"""`gpuinfra sandbox up|down|status|image [FILE]`: the local sandbox cluster of systemd containers.

Exit codes: 0 done (or nothing to do); 1 podman, SSH or the image build failed; 3 nothing was done because the
cluster file cannot describe a sandbox or a program is missing (the message names the Debian packages).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import sandbox
from ..errors import GpuinfraError, InvalidInput
from . import exitcodes
from .common import DEFAULT_CLUSTER, add_json
from .output import Output

IMAGE_ENV = "GPUINFRA_NODE_IMAGE"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("sandbox", help="the local sandbox cluster: systemd containers reached over SSH")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    helps = {
        "up": "create (or complete) the network and one container per host; idempotent",
        "down": "remove the containers, the network and the generated keys",
        "status": "list the hosts and their containers' state",
    }
    default_image = os.environ.get(IMAGE_ENV) or None
    for action, text in helps.items():
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument(
            "file",
            nargs="?",
            default=DEFAULT_CLUSTER,
            metavar="FILE",
            help=f"cluster file (default: {DEFAULT_CLUSTER})",
        )
        if action == "up":
            sub.add_argument(
                "--gpu-nodes",
                type=int,
                metavar="N",
                help="bring up N emulated GPU nodes instead of the file's: the resized cluster file is written "
                "into the sandbox's state folder, and `up` prints it for apply",
            )
        if action != "down":
            sub.add_argument(
                "--image",
                default=default_image,
                help=f"image of every host (default: ${IMAGE_ENV}, else each host's base image for its os, "
                "such as localhost/gpuinfra-debian13, built when missing)",
            )
        add_json(sub)
        sub.set_defaults(func=run)
    image = actions.add_parser("image", help="build a Debian systemd base image with debootstrap unless podman has it")
    image.add_argument(
        "--os",
        choices=sorted(sandbox.PLATFORMS),
        default=sandbox.DEFAULT_PLATFORM.os,
        help=f"the Debian release to build (default: {sandbox.DEFAULT_PLATFORM.os}, "
        + ", ".join(f"{p.os} is {p.suite}" for p in sandbox.PLATFORMS.values())
        + ")",
    )
    image.add_argument(
        "--image", help="image name (default: localhost/gpuinfra-OS, e.g. " + sandbox.DEFAULT_IMAGE + ")"
    )
    add_json(image)
    image.set_defaults(func=run_image)


def run(args: argparse.Namespace) -> int:
    output = Output(f"sandbox {args.action}", args.json)
    try:
        if args.action == "up":
            if args.gpu_nodes is not None:
                args.file = str(sandbox.resized(args.file, args.gpu_nodes, args.image))
            result = sandbox.up(args.file, args.image)
        elif args.action == "down":
            result = sandbox.down(args.file)
        else:
            result = sandbox.status(args.file, args.image)
    except InvalidInput as exc:
        output.file = args.file
        return output.invalid(exc)
    except (sandbox.MissingTools, sandbox.SandboxConfigError) as exc:
        return output.refuse(str(exc))
    except GpuinfraError as exc:
        return output.fail(str(exc))
    if args.json:
        return output.finish({"status": "ok", **result.as_dict()}, exitcodes.OK)
    for change in result.changes:
        print(f"  {change}")
    _print_hosts(result)
    if args.action == "up":
        verdict = "ready" if result.changed else "already up, nothing changed"
        print(f"{result.cluster}: {verdict}; next: gpuinfra apply {args.file}")
    elif args.action == "down":
        print(f"{result.cluster}: " + ("removed" if result.changed else "nothing to remove"))
    return exitcodes.OK


def run_image(args: argparse.Namespace) -> int:
    output = Output("sandbox image", args.json)
    try:
        platform = sandbox.PLATFORMS[args.os]
        built = sandbox.ensure_image(args.image or platform.image, suite=platform.suite)
    except sandbox.MissingTools as exc:
        return output.refuse(str(exc))
    except GpuinfraError as exc:
        return output.fail(str(exc))
    if args.json:
        return output.finish({"status": "ok", **built.as_dict()}, exitcodes.OK)
    if built.built:
        print(f"built {built.name} in {built.seconds:.0f} s")
    else:
        print(f"{built.name} is present; reusing it")
    return exitcodes.OK


def _print_hosts(result: sandbox.SandboxResult) -> None:
    network = f"{result.network} ({result.subnet})" + ("" if result.network_present else ", absent")
    print(f"network {network}")
    for host in result.hosts:
        gpus = f"{host.gpus} fake GPUs" if host.gpus else "no GPUs"
        print(f"  {host.host:<12} {host.address:<15} {host.state:<8} {gpus:<12} {host.container}")
