"""The validation layer: every rule a cluster file must pass before anything reads it.

- `grammar`: field types with the grammar of the place each value lands in (host names, Slurm and Kubernetes
  names, labels, image references, paths, URLs, single-line text);
- `limits` and `source`: reading YAML with positions, within bounds of size, aliases and depth;
- `schema_errors`: Pydantic's errors as positioned diagnostics;
- `rules` with `hosts`, `gpu` (and `mig`), `sources`, `slurm`, `kubernetes`: the cross-field rules;
- `load`: the entry point, `load_cluster`.

Rendering (gpuinfra.render) only ever sees a cluster that passed all of them.
"""
