"""Aggregate mode folds buffered regions into histograms off the user's threads (aggregate.py)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.instrument import aggregate, region
from cuvil_pgc.instrument.aggregate import AggregateRecorder
from cuvil_pgc.trace.summary import bucket_of, buckets_of


@given(st.lists(st.integers(min_value=-5, max_value=2**62), min_size=1, max_size=200))
def test_vector_buckets_match_the_scalar_rule(values):
    assert buckets_of(np.array(values, np.int64)).tolist() == [bucket_of(v) for v in values]


def _ended_frames(n_paths: int, calls: int) -> list:
    frames = []

    class Sink:
        def record(self, frame, end_ns):
            frames.append(frame)

    region.attach(sink := Sink())
    try:
        for _ in range(calls):
            with ProfileRegion("root"):
                for k in range(n_paths - 1):
                    with ProfileRegion(f"child{k}"):
                        pass
    finally:
        region.detach(sink)
    return frames


@pytest.mark.skipif(not region.ACCELERATED, reason="the C accelerator is not built")
def test_c_fold_index_matches_python():
    frames = _ended_frames(5, 20)
    c_index, py_index = {}, {}
    c = region._accel.fold_index(frames, c_index, 3)
    py = aggregate._fold_index_py(frames, py_index, 3)
    assert c == py and c_index == py_index and len(c_index) == 3
    numbers = np.frombuffer(c[0], np.int64)
    assert (numbers == -1).sum() == 2 * 20            # two paths did not fit
    assert (np.frombuffer(c[1], np.int64) >= 0).all()


def test_fold_counts_paths_that_do_not_fit_and_keeps_exact_totals():
    recorder = AggregateRecorder(max_paths=2)
    frames = _ended_frames(4, 25)
    for frame in frames:
        recorder.record(frame, frame[5])
    stats = recorder.snapshot()
    assert set(stats) == {"root/child0", "root/child1"}      # the first two paths to end
    assert recorder.dropped_paths == 2 * 25
    for path, s in stats.items():
        durations = [f[5] - f[2] for f in frames if region.frame_path(f) == path]
        assert s.count == 25 and s.sum_ns == sum(durations)
        assert (s.min_ns, s.max_ns) == (min(durations), max(durations))
        assert sum(s.buckets.values()) == 25
        assert s.buckets == {b: [bucket_of(d) for d in durations].count(b) for b in set(map(bucket_of, durations))}


def test_snapshot_folds_what_is_buffered_and_a_full_buffer_counts(tmp_path):
    path = tmp_path / "s.summary.json"
    with profile(path, mode="aggregate", flush_s=60.0) as session:
        session.recorder.capacity = 50       # tiny buffers, no fold before the final snapshot
        region._configure_accel()

        def work():
            for _ in range(100):
                with ProfileRegion("req"):
                    pass
        t = threading.Thread(target=work)
        t.start()
        t.join()
    doc = json.loads(path.read_text())["cuvil_summary"]
    (row,) = doc["regions"]
    assert row["path"] == "req" and row["count"] + doc["metadata"]["dropped"]["aggregate_regions"] == 100
    assert 0 < row["count"] <= 100
