"""Shared by every tier: under CI (`CI=true`) a skipped test fails the run, outside the GPU and Kubernetes tiers
and their one reason each (tests/skip_policy.py)."""

from __future__ import annotations

import pytest
import skip_policy


def pytest_configure(config: pytest.Config) -> None:
    skip_policy.install(config)
