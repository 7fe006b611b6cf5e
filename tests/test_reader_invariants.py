"""What every Trace from load_trace satisfies (used by the reader, recovery and fuzz tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.trace import Trace
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS
from cuvil_pgc.trace.reader import load_trace
from cuvil_pgc.trace.schema import Kind

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(p for d in ("kineto_cpu", "kineto_gpu", "ours") for p in (DATA / d).iterdir())


def assert_valid_trace(trace: Trace) -> None:
    """Column invariants of the reader's output contract (columns.py, reader.py)."""
    n = len(trace)
    for col, dtype in EVENT_COLUMNS.items():
        assert trace.events[col].dtype == dtype and len(trace.events[col]) == n, col
    assert trace.events["external_id"].dtype == np.int64 and len(trace.events["external_id"]) == n
    for col, dtype in COUNTER_COLUMNS.items():
        assert trace.counters[col].dtype == dtype, col
        assert len(trace.counters[col]) == len(trace.counters["ts"]), col
    ts, dur = trace.ts, trace.dur
    assert np.isfinite(ts).all() and np.isfinite(dur).all()
    assert (dur >= 0).all()
    assert (np.diff(ts) >= 0).all(), "rows are sorted by ts"
    assert (np.diff(trace.counters["ts"]) >= 0).all(), "counters are sorted by ts"
    starts = [a.min() for a in (ts, trace.counters["ts"]) if len(a)]
    if starts:
        assert min(starts) == pytest.approx(0.0, abs=1e-6), "ts counts from the earliest event"
    assert set(np.unique(trace.kind).tolist()) <= {int(k) for k in Kind}
    n_strings = len(trace.strings)
    assert ((trace.name >= 0) & (trace.name < n_strings)).all()
    assert ((trace.region >= -1) & (trace.region < n_strings)).all()
    assert ((trace.counters["name"] >= 0) & (trace.counters["name"] < n_strings)).all()
    regions = trace.of_kind(Kind.REGION)
    assert (trace.region[regions] >= 0).all(), "region rows carry their own path"
    assert ((trace.source >= 0) & (trace.source < len(trace.sources))).all()
    for row in list(trace.args):
        assert 0 <= row < n
        assert isinstance(trace.args[row], dict)
    for src in trace.sources:
        assert src.format in ("cuvil", "kineto")
        assert src.weight > 0
        assert isinstance(src.metadata, dict) and isinstance(src.notes, list)


def _loadable(path: Path) -> str:
    text = str(path)
    return text[: -len(".partial")] if text.endswith(".partial") else text


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_loads_into_a_valid_trace(path: Path) -> None:
    trace = load_trace(_loadable(path))
    assert len(trace) > 0
    assert_valid_trace(trace)
