"""gpuinfra: NVIDIA GPU clusters from one YAML file."""
