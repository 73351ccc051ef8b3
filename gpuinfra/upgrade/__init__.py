"""Rolling work across the cluster: a sliding-window scheduler, its journal, and its simulation."""
