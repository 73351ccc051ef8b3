"""Running Ansible: one playbook of this repository against a cluster's inventory, through ansible-runner.

- playbook.py: `run_playbook` and its options;
- environment.py: the private run directory, ansible-playbook's environment, configuration and forks;
- stopping.py: Ctrl-C, cancel and timeout stop ansible-playbook and everything it started;
- result.py: the outcome, from runner's status and rc and Ansible's final stats, never from parsing output.

It knows nothing of cluster files: callers hand it an inventory (gpuinfra.render.inventory) and the hosts it targets
(gpuinfra.targets).
"""

from __future__ import annotations

from .environment import INVENTORY_PLUGIN, MAX_DEFAULT_FORKS, default_forks
from .playbook import DEFAULT_PLAYBOOK, PLAYBOOKS, OnUpdate, RunOptions, playbook_path, run_playbook
from .result import Outcome, RunError, RunResult, one_line

__all__ = [
    "DEFAULT_PLAYBOOK",
    "INVENTORY_PLUGIN",
    "MAX_DEFAULT_FORKS",
    "PLAYBOOKS",
    "OnUpdate",
    "Outcome",
    "RunError",
    "RunOptions",
    "RunResult",
    "default_forks",
    "one_line",
    "playbook_path",
    "run_playbook",
]
