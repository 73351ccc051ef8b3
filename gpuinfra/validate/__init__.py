"""The validation layer: every rule a cluster file must pass before anything reads it.

- `source`: reading YAML with positions, within the bounds of gpuinfra.limits (size, aliases, depth);
- `schema_errors`: Pydantic's errors as positioned diagnostics (the field types are gpuinfra.model.grammar's);
- `rules` with `hosts`, `gpu`, `package_sources`, `slurm`, `kubernetes`: the cross-field rules, on the shared domain
  modules below them (gpuinfra.hostlists, gpuinfra.mig_layouts, gpuinfra.k8s_resources);
- `load`: the entry point, `load_cluster`.

Rendering (gpuinfra.render) only ever sees a cluster that passed all of them, and never imports this package.
"""
