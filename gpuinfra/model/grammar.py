"""Field types with the grammar of the place each value lands in.

A value of the cluster file ends up in slurm.conf, a systemd unit, a Kubernetes manifest, an ssh command line or an
apt source. Each type here admits exactly what is valid where the value goes, so nothing from the file can add a
line, an argument or a template to what gpuinfra writes. Every type is defined once and used by every field that
lands in the same kind of place. Lengths are checked before any pattern, so no value costs more than a bounded scan.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

TEMPLATE_DELIMITERS = ("{{", "{%", "{#")


@dataclass(frozen=True)
class Grammar:
    """Pydantic metadata for a string type: at most `max_length` characters, no control characters or template
    delimiters, then `check`, which returns the problem or None. The JSON Schema carries the length and pattern."""

    what: str
    max_length: int
    check: Callable[[str], str | None]
    pattern: str | None = None

    def validate(self, value: str) -> str:
        if len(value) > self.max_length:
            raise ValueError(f"is {len(value)} characters long; {self.what} has at most {self.max_length}")
        problem = _unsafe_characters(value) or self.check(value)
        if problem is not None:  # "" says no more than `what` does
            raise ValueError(f"{value!r} is not {self.what}" + (f": {problem}" if problem else ""))
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        out.update(maxLength=self.max_length, description=self.what)
        if self.pattern:
            out["pattern"] = f"^({self.pattern})$"
        return out


def _unsafe_characters(value: str) -> str | None:
    """Control characters (a newline starts a new config line) and template delimiters (Ansible would run them)."""
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            return f"it holds the control character {char!r}"
    for delimiter in TEMPLATE_DELIMITERS:
        if delimiter in value:
            return f"it holds the template delimiter {delimiter!r}"
    return None


def _matches(pattern: str, hint: str = "") -> Callable[[str], str | None]:
    compiled = re.compile(pattern)
    return lambda value: None if compiled.fullmatch(value) else hint


# -- names --------------------------------------------------------------------------------------------------------

_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"{_LABEL}(\.{_LABEL})*")


def hostname_problem(value: str) -> str | None:
    """Why `value` is not an RFC 1123 host name, or None. Used on every name a hostlist expands to."""
    if not value:
        return "it is empty"
    if len(value) > 253:
        return "it is longer than 253 characters"
    if value.startswith("-"):
        return "it starts with '-', which ssh and Slurm would read as an option"
    if not HOSTNAME_RE.fullmatch(value):
        return "use letters, digits and '-' in dot-separated labels of at most 63, not starting or ending with '-'"
    return None


Hostname = Annotated[str, Grammar("an RFC 1123 host name", 253, hostname_problem, HOSTNAME_RE.pattern)]


def _address_problem(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return hostname_problem(value)
    return None


Address = Annotated[str, Grammar("an IP address or an RFC 1123 host name", 253, _address_problem)]
"""Where a host is reached: an IPv4/IPv6 address or a host name."""

# A hostlist expression such as `gpu[01-16]` or `a100-[01-04,07]`: host-name characters, brackets, ranges and
# commas only. The names it expands to are checked as Hostname, and their number is capped (see limits.py).
HOSTLIST_PATTERN = r"[A-Za-z0-9.\-\[\],]+"
HostlistExpr = Annotated[
    str,
    Grammar(
        "a hostlist expression such as gpu[01-16]",
        1024,
        _matches(HOSTLIST_PATTERN, "use host-name characters with [ranges], e.g. gpu[01-16]"),
        HOSTLIST_PATTERN,
    ),
]

Hosts = Annotated[list[HostlistExpr], Field(min_length=1, max_length=1000)] | HostlistExpr
"""One hostlist expression or a list of them: a node group's hosts, a leaf switch's."""

NAME_PATTERN = r"[a-z0-9]([a-z0-9_-]{0,62}[a-z0-9])?"
Name = Annotated[
    str,
    Grammar(
        "a name of lower-case letters, digits, '-' and '_' (at most 64)",
        64,
        _matches(NAME_PATTERN),
        NAME_PATTERN,
    ),
]
"""Node groups, partitions, QoS, accounts, tenants, receivers: valid as Slurm entity, Ansible group and (without
'_') Kubernetes names alike."""

UNIX_NAME_PATTERN = r"[a-z_][a-z0-9_-]{0,31}"
UnixName = Annotated[str, Grammar("a Unix user or group name", 32, _matches(UNIX_NAME_PATTERN), UNIX_NAME_PATTERN)]

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_LABEL_PATTERN = _DNS_LABEL
DnsLabel = Annotated[
    str,
    Grammar(
        "a DNS-1123 label (lower-case letters, digits and '-', at most 63)",
        63,
        _matches(_DNS_LABEL),
        _DNS_LABEL,
    ),
]
"""Kubernetes namespaces and most object names."""

_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
DnsSubdomain = Annotated[
    str,
    Grammar(
        "a DNS-1123 subdomain (dot-separated DNS labels, at most 253)",
        253,
        _matches(_DNS_SUBDOMAIN, "use lower-case letters, digits, '-' and '.'"),
        _DNS_SUBDOMAIN,
    ),
]

_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"


def _label_key_problem(value: str) -> str | None:
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not re.fullmatch(_DNS_SUBDOMAIN, prefix)):
        return "its prefix before '/' must be a DNS subdomain of at most 253 characters"
    if not re.fullmatch(_LABEL_NAME, name):
        return "its name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    return None


LabelKey = Annotated[str, Grammar("a Kubernetes label key ([prefix/]name)", 317, _label_key_problem)]
"""Kubernetes label and taint keys, by the API server's own rules."""

LabelValue = Annotated[
    str,
    Grammar(
        "a Kubernetes label value (empty, or at most 63 letters, digits, '-', '_' or '.')",
        63,
        _matches(rf"({_LABEL_NAME})?", "start and end with a letter or digit"),
    ),
]

# -- paths, URLs and images -------------------------------------------------------------------------------------

_PATH_PART = r"[A-Za-z0-9._+@-]+"


def _path_problem(value: str, absolute: bool) -> str | None:
    if absolute and not value.startswith("/"):
        return "it must be absolute (start with '/')"
    parts = value.removeprefix("~/").strip("/").split("/")
    if value.startswith("~") and not value.startswith("~/"):
        return "only '~/' (the controller user's home) is expanded"
    if any(part == ".." for part in parts) and absolute:
        return "it must not contain '..'"
    if value not in ("/", "~/") and not all(re.fullmatch(_PATH_PART, part) for part in parts):
        return "use letters, digits, '.', '_', '+', '@' and '-' between slashes"
    return None


AbsolutePath = Annotated[str, Grammar("an absolute path", 1024, lambda v: _path_problem(v, absolute=True))]
"""A path on a managed host: lands in config files and unit lines, so no spaces, quotes or shell characters."""

ControllerPath = Annotated[
    str,
    Grammar("a path on the controller", 1024, lambda v: _path_problem(v, absolute=False)),
]
"""A file on the machine that runs gpuinfra; a relative path is taken from the cluster file's folder and a
leading `~/` from the user's home. Regular files only, read with a size cap (see limits.py)."""

_URL_CHARS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")


def url_grammar(*schemes: str, secrets_go: str) -> Grammar:
    """A URL with one of `schemes` and RFC 3986 characters only (no spaces, quotes, braces or newlines), and no
    credentials: `secrets_go` says where this URL's secrets are kept instead."""
    allowed = " or ".join(f"{s}://" for s in schemes)

    def check(value: str) -> str | None:
        if not _URL_CHARS.fullmatch(value):
            return "it holds characters a URL cannot (percent-encode them)"
        parts = urlsplit(value)
        if "@" in parts.netloc:  # raised, not returned: the error must not repeat the URL, and so its password
            raise ValueError(
                "the URL holds credentials (user:password@host), which plan --diff would print and the hosts would "
                f"keep in world-readable files: give it without them; {secrets_go}"
            )
        if parts.scheme not in schemes:
            return f"use {allowed}"
        if parts.scheme != "file" and not parts.hostname:
            return "it names no host"
        if parts.scheme == "file" and not parts.path.startswith("/"):
            return "a file:// URL needs an absolute path (file:///srv/mirror)"
        return None

    return Grammar(f"a {allowed} URL", 2048, check, rf"({'|'.join(schemes)})://.*")


HttpUrl = Annotated[
    str,
    url_grammar(
        "https",
        "http",
        secrets_go="gpuinfra takes a receiver's secrets only from files on the monitoring host "
        "(the slack receiver's api_url_file), never from the cluster file",
    ),
]
RepoUrl = Annotated[
    str,
    url_grammar(
        "https",
        "http",
        "file",
        secrets_go="apt reads a mirror's login from /etc/apt/auth.conf.d/ on each host "
        "(apt_auth.conf(5), mode 0600), which stays out of the cluster file",
    ),
]

# An OCI image reference, as the distribution reference grammar defines it: an optional registry with port, a
# lower-case path, and a tag, a digest, or both.
_IMAGE_RE = re.compile(
    r"(?P<name>(?:(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}|sha512:[a-f0-9]{128}))?"
)
ImageRef = Annotated[
    str,
    Grammar(
        "an OCI image reference such as registry/name:tag or registry/name@sha256:<64 hex>",
        512,
        _matches(_IMAGE_RE.pattern, "use [registry[:port]/]path[:tag][@sha256:digest] with a lower-case path"),
    ),
]


# -- text ---------------------------------------------------------------------------------------------------------

# A slurm.conf parameter passed through (slurm.extra_config): Slurm's CamelCase names, and values without spaces,
# quotes or comment signs, so that one entry is one `Key=Value` line and nothing more.
SLURM_KEY_PATTERN = r"[A-Z][A-Za-z0-9]{1,63}"
SlurmKey = Annotated[
    str,
    Grammar("a slurm.conf parameter name such as MessageTimeout", 64, _matches(SLURM_KEY_PATTERN), SLURM_KEY_PATTERN),
]
SLURM_VALUE_PATTERN = r"[A-Za-z0-9_.,:=/@%+*\-]+"
SlurmValue = Annotated[
    str,
    Grammar(
        "a slurm.conf value: letters, digits and _ . , : = / @ % + * -, without spaces",
        1024,
        _matches(SLURM_VALUE_PATTERN),
        SLURM_VALUE_PATTERN,
    ),
]

Text = Annotated[str, Grammar("single-line text", 256, lambda _: None)]
"""Free text (a description): one line, no control characters, no template delimiters."""

HELM_VALUE_TEXT = Grammar("a single-line Helm value", 4096, lambda _: None)
"""A string among a chart's values. Charts paste values into YAML, often unquoted, so a newline could add fields or
whole objects to what they render; template delimiters would run in charts that `tpl` their values."""

HELM_VALUE_KEY_PATTERN = r"[A-Za-z0-9_]([A-Za-z0-9_./-]{0,315})?"
HELM_VALUE_KEY = Grammar(
    "a Helm value key (letters, digits, '_', '.', '/' and '-', at most 317)",
    317,
    _matches(HELM_VALUE_KEY_PATTERN),
    HELM_VALUE_KEY_PATTERN,
)
"""A key among a chart's values: the chart's own names, or label, annotation and resource names in its free maps."""

EMAIL_PATTERN = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"
Email = Annotated[
    str, Grammar("an email address", 254, _matches(EMAIL_PATTERN, "write it as name@domain"), EMAIL_PATTERN)
]
EmailList = Annotated[
    str,
    Grammar(
        "email addresses separated by commas",
        1024,
        _matches(rf"{EMAIL_PATTERN}(\s*,\s*{EMAIL_PATTERN})*", "write name@domain, separated by commas"),
    ),
]


def _host_port_problem(value: str) -> str | None:
    host, colon, port = value.rpartition(":")
    if not colon or not port.isdigit() or not 1 <= int(port) <= 65535:
        return "write host:port, e.g. smtp.example.org:587"
    return _address_problem(host.removeprefix("[").removesuffix("]"))


HostPort = Annotated[str, Grammar("host:port", 260, _host_port_problem)]

SLACK_CHANNEL_PATTERN = r"[#@]?[a-z0-9][a-z0-9._-]{0,79}"
SlackChannel = Annotated[
    str, Grammar("a Slack channel such as #gpu-alerts", 81, _matches(SLACK_CHANNEL_PATTERN, "lower-case, no spaces"))
]

# Debian's and RPM's package names together: no spaces, no leading '-', nothing a shell or apt reads as an option.
PACKAGE_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,127}"
PackageName = Annotated[
    str,
    Grammar(
        "a package name such as datacenter-gpu-manager-4-core",
        128,
        _matches(PACKAGE_NAME_PATTERN, "start with a letter or digit; letters, digits and . + _ - only"),
        PACKAGE_NAME_PATTERN,
    ),
]

PACKAGE_VERSION_PATTERN = r"[0-9][A-Za-z0-9.+~:-]{0,127}"
PackageVersion = Annotated[
    str,
    Grammar(
        "a package version such as 1.17.8-1",
        128,
        _matches(PACKAGE_VERSION_PATTERN, "start with a digit; letters, digits and . + ~ : - only"),
        PACKAGE_VERSION_PATTERN,
    ),
]

CHART_VERSION_PATTERN = r"v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?"
ChartVersion = Annotated[
    str,
    Grammar(
        "a chart version such as v26.7.0",
        80,
        _matches(CHART_VERSION_PATTERN),
        CHART_VERSION_PATTERN,
    ),
]

KEY_FINGERPRINT_PATTERN = r"[0-9A-F]{40}"
KeyFingerprint = Annotated[
    str,
    Grammar(
        "an OpenPGP key fingerprint (40 upper-case hex digits)",
        40,
        _matches(KEY_FINGERPRINT_PATTERN, "copy it from `gpg --show-keys --with-colons`, the fpr line"),
        KEY_FINGERPRINT_PATTERN,
    ),
]

MIG_PROFILE_PATTERN = r"[1-8]g\.[0-9]{1,3}gb(\+[a-z]{1,8})?"
MigProfileName = Annotated[
    str,
    Grammar(
        "a MIG profile name such as 1g.10gb or 1g.10gb+me",
        20,
        _matches(MIG_PROFILE_PATTERN),
        MIG_PROFILE_PATTERN,
    ),
]

GPU_MODEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}"
GpuModelName = Annotated[
    str,
    Grammar(
        "a GPU model name from the catalog, e.g. H100-SXM5-80GB",
        64,
        _matches(GPU_MODEL_PATTERN),
        GPU_MODEL_PATTERN,
    ),
]

LAYOUT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,62}"
LayoutName = Annotated[
    str,
    Grammar(
        "a MIG layout name (letters, digits, '.', '_', '+' and '-', at most 63)",
        63,
        _matches(LAYOUT_NAME_PATTERN),
        LAYOUT_NAME_PATTERN,
    ),
]

# -- numbers in text form -------------------------------------------------------------------------------------

DURATION_PATTERN = r"([0-9]{1,6}(ms|s|m|h|d|w|y)){1,4}"
Duration = Annotated[
    str,
    Grammar("a duration such as 30s, 5m, 2h or 15d", 32, _matches(DURATION_PATTERN), DURATION_PATTERN),
]

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def duration_seconds(text: str) -> int:
    """`4h`, `1h30m`, `90s` -> seconds (the Duration form)."""
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return int(sum(int(n) * _DURATION_UNITS[u] for n, u in parts))


SLURM_TIME_PATTERN = (
    r"UNLIMITED|INFINITE|[0-9]{1,7}|[0-9]{1,7}:[0-9]{2}(:[0-9]{2})?|[0-9]{1,5}-[0-9]{1,2}(:[0-9]{2}){0,2}"
)
SlurmTime = Annotated[
    str,
    Grammar(
        "a Slurm time such as 60, 12:00:00, 2-00:00:00 or UNLIMITED",
        20,
        _matches(SLURM_TIME_PATTERN),
        SLURM_TIME_PATTERN,
    ),
]

DECAY_PATTERN = r"[0-9]{1,5}(-[0-9]{1,2})?(:[0-9]{2}){0,2}"
DecayHalfLife = Annotated[str, Grammar("a Slurm half-life in days-hours form, e.g. 7-0", 20, _matches(DECAY_PATTERN))]

DRIVER_VERSION_PATTERN = r"[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?"
DriverVersion = Annotated[
    str,
    Grammar(
        "an exact driver version such as '535.261.03'",
        11,
        _matches(DRIVER_VERSION_PATTERN),
        DRIVER_VERSION_PATTERN,
    ),
]

PERCENT_PATTERN = r"([1-9][0-9]?|100)%"
Percentage = Annotated[str, Grammar("a percentage such as '25%'", 4, _matches(PERCENT_PATTERN), PERCENT_PATTERN)]

COUNT_OR_PERCENT_PATTERN = r"[0-9]{1,6}%?"
CountOrPercentage = Annotated[
    str,
    Grammar(
        "a count or a percentage such as '25%'",
        7,
        _matches(COUNT_OR_PERCENT_PATTERN),
        COUNT_OR_PERCENT_PATTERN,
    ),
]

# The largest GPU index a selector may name: the catalog has no host with more GPUs than this.
MAX_GPUS_PER_HOST = 16
GPU_SELECTOR_PATTERN = r"all|[0-9]{1,2}(-[0-9]{1,2})?(,[0-9]{1,2}(-[0-9]{1,2})?){0,15}"


def _gpu_selector_problem(value: str) -> str | None:
    if not re.fullmatch(GPU_SELECTOR_PATTERN, value):
        return "write `all`, a range such as 0-3, or a list such as 0,2,4-5"
    for part in value.split(",") if value != "all" else []:
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            return f"the range {part} runs backwards; write {hi}-{lo}"
        if int(hi or lo) >= MAX_GPUS_PER_HOST:
            return f"GPU index {int(hi or lo)} is beyond the {MAX_GPUS_PER_HOST} GPUs a host can have"
    return None


GpuSelector = Annotated[
    str, Grammar("a GPU selector such as all, 0-3 or 0,2,4-5", 64, _gpu_selector_problem, GPU_SELECTOR_PATTERN)
]

NonNegativeInt = Annotated[int, Field(ge=0, le=2**31 - 1)]
PositiveInt = Annotated[int, Field(ge=1, le=2**31 - 1)]
Percent = Annotated[int, Field(ge=0, le=100)]
Port = Annotated[int, Field(ge=1, le=65535)]
