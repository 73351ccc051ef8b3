"""What every verb prints, in one place: human text, or with --json exactly one JSON document on stdout.

Human text goes to stdout, or to stderr under --json so that stdout holds the document alone; errors always go to
stderr as `gpuinfra VERB: message`. Every document ends with the verb's `exit_code`, and its `status` is the verb's
own word for a run that went through (`ok`, `healthy`, ...) or one of `invalid`, `failed` and `cancelled`. Two verbs
print another tool's document without --json: `inventory` (Ansible's inventory) and `schema` (a JSON Schema); with
--json, it is a field of theirs. A verb that asks before it acts asks through `Output.confirm`.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from rich.console import Console

from ..errors import Cancelled, Diagnostic, GpuinfraError, InvalidInput, Refused
from ..validate.load import LoadedCluster, load_cluster
from . import exitcodes
from .common import parse_extra_vars

_STATUS = {exitcodes.OK: "ok", exitcodes.INVALID_INPUT: "invalid", exitcodes.CANCELLED: "cancelled"}


def status_of(code: int) -> str:
    """The document's status for an exit code, where the verb has no word of its own."""
    return _STATUS.get(code, "failed")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def print_diagnostics(diagnostics: list[Diagnostic]) -> None:
    for diagnostic in diagnostics:
        print(diagnostic, file=sys.stderr)


class Output:
    def __init__(self, verb: str, as_json: bool, file: str | None = None) -> None:
        self.verb = verb
        self.as_json = as_json
        self.file = file
        self.human: TextIO = sys.stderr if as_json else sys.stdout
        self.console = Console(file=self.human, highlight=False, soft_wrap=True)
        self.warnings: list[Diagnostic] = []
        """The cluster file's warnings: printed as it loads, and carried by the JSON document."""

    def load(self) -> LoadedCluster | None:
        """The cluster file, its warnings printed; None once every diagnostic of an invalid one is printed."""
        assert self.file is not None
        try:
            loaded = load_cluster(self.file)
        except InvalidInput as exc:
            self.invalid(exc)
            return None
        self.warnings = loaded.warnings
        if not self.as_json:
            print_diagnostics(loaded.warnings)
        return loaded

    def extra_vars(self, items: list[str]) -> dict[str, Any] | None:
        """--extra-vars as a mapping; None once the error is printed."""
        try:
            return parse_extra_vars(items)
        except (OSError, ValueError) as exc:
            self.fail(f"--extra-vars: {exc}", exitcodes.INVALID_INPUT)
            return None

    def invalid(self, exc: InvalidInput) -> int:
        if self.as_json:
            doc = {"status": "invalid", "valid": False, "diagnostics": [d.as_dict() for d in exc.diagnostics]}
            return self.finish(doc, exitcodes.INVALID_INPUT)
        print_diagnostics(exc.diagnostics)
        count = len(exc.errors)
        print(f"{self.file}: {count} error{'s' if count != 1 else ''}; nothing was run", file=sys.stderr)
        return exitcodes.INVALID_INPUT

    def confirm(self, question: str) -> bool | None:
        """Ask the person at the terminal: True for 'yes' only. None, with the refusal printed, when stdin is not a
        terminal: no one can answer, and --yes is the way to go on without asking."""
        if not sys.stdin.isatty():
            self.refuse("stdin is not a terminal, so no one can confirm; pass --yes to go on without asking")
            return None
        self.human.write(f"\n{question} Only 'yes' is accepted: ")
        self.human.flush()
        try:
            return sys.stdin.readline().strip() == "yes"
        except EOFError:
            return False

    def refuse(self, message: str) -> int:
        """Input the verb cannot act on: nothing was run."""
        return self.fail(message, exitcodes.INVALID_INPUT)

    def error(self, exc: GpuinfraError) -> int:
        """A library call's error: refused (nothing was run), cancelled, or failed."""
        if isinstance(exc, Refused):
            return self.refuse(str(exc))
        return self.fail(str(exc), exitcodes.CANCELLED if isinstance(exc, Cancelled) else exitcodes.FAILED)

    def fail(self, message: str, code: int = exitcodes.FAILED) -> int:
        print(f"gpuinfra {self.verb}: {message}", file=sys.stderr)
        return self.finish({"status": status_of(code), "errors": [message]}, code)

    def finish(self, doc: dict[str, Any], code: int) -> int:
        """Print the JSON document (under --json) and return the exit code."""
        if self.as_json:
            extra: dict[str, Any] = {"file": self.file} if self.file is not None else {}
            if self.warnings and "diagnostics" not in doc:
                extra["diagnostics"] = [d.as_dict() for d in self.warnings]
            print_json({**doc, "exit_code": code, **extra})
        return code
