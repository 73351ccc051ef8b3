"""The JSON Schema of the cluster file (yaml-language-server reads it for completion and hover docs)."""

from __future__ import annotations

from typing import Any

from .model import Cluster


def cluster_schema() -> dict[str, Any]:
    schema = Cluster.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpuinfra cluster file"
    try:
        from . import catalog

        # Offer the catalog's GPU names as completions; the model itself keeps the field a string so that
        # an unknown name gets a did-you-mean from the checks.
        schema["$defs"]["Gpu"]["properties"]["model"]["examples"] = catalog.names()
    except (ImportError, KeyError):
        pass
    return schema
