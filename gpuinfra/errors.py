"""Diagnostics a user sees: `file:line:col: path: message`, all of them at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    file: str
    line: int
    col: int
    path: str
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}: {tag}{self.path}: {self.message}" if self.path else f"{where}: {tag}{self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "path": self.path,
            "message": self.message,
            "severity": self.severity,
        }


class GpuinfraError(Exception):
    """Base of the errors the library raises for a user to read."""


class Refused(GpuinfraError):
    """A request that cannot be carried out as asked (a limit that matches no node, a cluster without what the
    request reads): nothing was run."""


class Cancelled(GpuinfraError):
    """The work was interrupted (Ctrl-C, SIGTERM) before it finished."""


class InvalidInput(GpuinfraError):
    """The input file is invalid; carries every diagnostic found, errors and warnings."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = sorted(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]
