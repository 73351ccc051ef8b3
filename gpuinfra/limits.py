"""Bounds on what a cluster file may cost to read, so that any input is answered in bounded time and memory.

Each limit is above what a real cluster needs (inventories/large-1000 is 4 KiB, a 10,000-node cluster written with
hostlists about as much; 5,000 hosts each with an address of its own fit in 128 KiB; 32 levels would be a very
strange file) and low enough that any input is answered within about 2 s (benchmarks/hostile_inputs.py measures it).
"""

MAX_FILE_BYTES = 128 * 1024
"""A cluster file or a file it references (a mig-parted config) is read only up to this size."""

MAX_SOURCE_BYTES = 1024 * 1024
"""A release tarball (slurm.containers.sources) is read whole to check its pinned checksum; the pinned ones are
under 100 KiB."""

MAX_NODES = 100_000
"""YAML nodes after every alias is expanded: an alias bomb is refused before it is built."""

MAX_DEPTH = 32
"""Nesting of mappings and sequences."""

MAX_HOSTS = 100_000
"""Hosts in a cluster, after every hostlist expression is expanded."""
