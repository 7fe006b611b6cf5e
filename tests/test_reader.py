"""load_trace: our files, gzip, torch.profiler (Kineto) CPU and GPU traces, attribution, merging."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import numpy as np
import pytest

import cuvil_pgc
from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.errors import ConfigError, TraceError
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace._args import ArgsMap
from cuvil_pgc.trace.schema import Kind
from tests.test_reader_invariants import DATA, assert_valid_trace

KINETO_CPU = DATA / "kineto_cpu" / "cpu_annotated.json"
KINETO_GPU = DATA / "kineto_gpu" / "gpu_two_regions.json"
OURS = DATA / "ours" / "regions.trace.json"
BASE_NS = 1_790_857_026_000_000_000


def rows(trace, kind: Kind | None = None, name: str | None = None) -> list[int]:
    out = trace.of_kind(kind).tolist() if kind is not None else list(range(len(trace)))
    if name is not None:
        out = [r for r in out if trace.strings[trace.name[r]] == name]
    return out


def region_of(trace, row: int) -> str | None:
    return trace.string(int(trace.region[row]))


def write_json(path: Path, obj) -> str:
    path.write_text(json.dumps(obj))
    return str(path)


def kineto(events: list[dict], **top) -> dict:
    return {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "traceEvents": events, **top}


def ours(events: list[dict], start_unix_ns: int = 1_700_000_000_000_000_000, **meta) -> dict:
    return {"traceEvents": events, "cuvil": {"schema_version": 1, "start_unix_ns": start_unix_ns, **meta}}


def x(cat: str, name: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# ----------------------------------------------------------------------------- our files
def test_real_session_regions_threads_and_attributes(tmp_path: Path) -> None:
    path = tmp_path / "run.trace.json"
    with profile(str(path), ops=False, gpu="off", sample_hz=0, compile=False):
        def work() -> None:
            with ProfileRegion("request", user="bob"):
                with ProfileRegion("decode", step=3):
                    pass
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        work()
    trace = load_trace(path)
    assert_valid_trace(trace)
    regions = rows(trace, Kind.REGION)
    assert sorted(region_of(trace, r) for r in regions) == ["request", "request", "request/decode",
                                                              "request/decode"]
    ids = {int(trace.region_id[r]): r for r in regions}
    for r in rows(trace, Kind.REGION, "decode"):
        parent = ids[int(trace.parent_id[r])]
        assert region_of(trace, parent) == "request"
        assert trace.tid[parent] == trace.tid[r]
        assert trace.ts[parent] <= trace.ts[r] and trace.ts[r] + trace.dur[r] <= trace.ts[parent] + trace.dur[parent]
        assert trace.args[r] == {"step": 3}
    for r in rows(trace, Kind.REGION, "request"):
        assert trace.parent_id[r] == -1 and trace.args[r] == {"user": "bob"}
    assert len(set(trace.tid[regions].tolist())) == 2
    src = trace.sources[0]
    assert src.format == "cuvil" and not src.recovered and src.weight == 1.0
    assert isinstance(src.metadata["start_unix_ns"], int) and src.metadata["pid"] > 0


def test_gzip_file_reads_the_same_as_plain() -> None:
    plain, gz = load_trace(OURS), load_trace(str(OURS) + ".gz")
    assert len(plain) == len(gz) == 9
    assert [plain.strings[i] for i in plain.region] == [gz.strings[i] for i in gz.region]
    k_plain, k_gz = load_trace(KINETO_CPU), load_trace(str(KINETO_CPU) + ".gz")
    np.testing.assert_array_equal(k_plain.ts, k_gz.ts)
    np.testing.assert_array_equal(k_plain.kind, k_gz.kind)


def test_our_given_region_is_kept_and_missing_ones_are_attributed(tmp_path: Path) -> None:
    events = [
        x("region", "step", 10, 100) | {"args": {"path": "step", "id": 1, "parent": None}},
        x("cpu_op", "aten::add", 20, 5) | {"args": {"region": "elsewhere/given", "shapes": [[2]]}},
        x("cpu_op", "aten::mul", 30, 5) | {"args": {"region": None, "flops": 8, "bytes": 64}},
        x("cpu_op", "aten::relu", 200, 5),
        x("compile", "inductor", 40, 10) | {"args": {"compile_id": "0/0", "phase": "codegen", "cache": "miss"}},
        x("kernel", "k", 50, 1, pid=0, tid=7) | {"args": {"correlation": 5, "Input Dims": [[1]],
                                                         "registers per thread": 16}},
    ]
    trace = load_trace(write_json(tmp_path / "a.trace.json", ours(events)))
    assert_valid_trace(trace)
    add, mul, relu = (rows(trace, Kind.CPU_OP, n)[0] for n in ("aten::add", "aten::mul", "aten::relu"))
    assert region_of(trace, add) == "elsewhere/given" and trace.args[add] == {"shapes": [[2]]}
    assert region_of(trace, mul) == "step"
    assert trace.flops[mul] == 8 and trace.bytes[mul] == 64 and np.isnan(trace.flops[add])
    assert region_of(trace, relu) is None
    comp = rows(trace, Kind.COMPILE)[0]
    assert region_of(trace, comp) == "step"
    assert trace.args[comp] == {"compile_id": "0/0", "phase": "codegen", "cache": "miss"}
    kernel = rows(trace, Kind.KERNEL)[0]
    assert trace.correlation[kernel] == 5
    assert trace.args[kernel] == {"shapes": [[1]], "registers_per_thread": 16}


# ----------------------------------------------------------------------------- Kineto CPU (real export)
def test_kineto_cpu_annotations_become_regions_with_nested_paths() -> None:
    trace = load_trace(KINETO_CPU)
    assert_valid_trace(trace)
    regions = rows(trace, Kind.REGION)
    paths = [region_of(trace, r) for r in regions]
    assert paths == ["preprocess", "model", "model/layer0", "model/layer1"] * 2
    by_id = {int(trace.region_id[r]): r for r in regions}
    assert len(by_id) == len(regions)
    for r in regions:
        if region_of(trace, r).startswith("model/"):
            assert region_of(trace, by_id[int(trace.parent_id[r])]) == "model"
        else:
            assert trace.parent_id[r] == -1
    src = trace.sources[0]
    assert src.format == "kineto"
    raw = json.loads(KINETO_CPU.read_text())
    first_us = min(e["ts"] for e in raw["traceEvents"] if e.get("ph") in ("X",))
    assert src.metadata["start_unix_ns"] == raw["baseTimeNanoseconds"] + round(first_us * 1000)
    assert src.metadata["kineto"]["record_shapes"] == 1


def test_kineto_ops_inside_and_outside_annotations() -> None:
    trace = load_trace(KINETO_CPU)
    outside = rows(trace, Kind.CPU_OP, "aten::ones")
    assert outside and all(region_of(trace, r) is None for r in outside)
    addmm = rows(trace, Kind.CPU_OP, "aten::addmm")
    assert [region_of(trace, r) for r in addmm] == ["model/layer0", "model/layer1"] * 2
    args = trace.args[addmm[0]]
    assert args["shapes"] == [[32], [8, 16], [16, 32], [], []]
    assert args["dtypes"][:3] == ["float", "float", "float"]
    assert (trace.events["external_id"][addmm] > 0).all()
    for r in rows(trace, Kind.CPU_OP, "aten::randn"):
        assert region_of(trace, r) == "preprocess"


def test_op_attribution_uses_thread_and_innermost_enclosing_region(tmp_path: Path) -> None:
    events = [
        x("user_annotation", "outer", 10, 40, tid=1),
        x("user_annotation", "inner", 20, 10, tid=1),
        x("cpu_op", "at_start", 10, 1, tid=1),
        x("cpu_op", "in_inner", 25, 1, tid=1),
        x("cpu_op", "after_inner", 30, 1, tid=1),
        x("cpu_op", "other_thread", 25, 1, tid=2),           # a thread without regions: works for tid 1
        x("user_annotation", "own", 60, 10, tid=3),
        x("cpu_op", "thread_with_regions", 25, 1, tid=3),    # outside its own regions, in tid 1's window
        x("cpu_op", "at_end", 50, 1, tid=1),
        x("cpu_op", "other_pid", 25, 1, tid=1, pid=2),
        x("cuda_runtime", "cudaLaunchKernel", 26, 1, tid=1, correlation=3),
    ]
    trace = load_trace(write_json(tmp_path / "k.json", kineto(events)))
    got = {trace.strings[trace.name[r]]: region_of(trace, r) for r in range(len(trace))
           if trace.kind[r] != Kind.REGION}
    assert got == {"at_start": "outer", "in_inner": "outer/inner", "after_inner": "outer",
                   "other_thread": "outer/inner", "thread_with_regions": "outer/inner", "at_end": None,
                   "other_pid": None,
                   "cudaLaunchKernel": "outer/inner"}


# ----------------------------------------------------------------------------- Kineto GPU
def test_kineto_gpu_kernels_memcpy_memset_get_the_region_of_their_launch() -> None:
    trace = load_trace(KINETO_GPU)
    assert_valid_trace(trace)
    kernels = rows(trace, Kind.KERNEL)
    assert len(kernels) == 10
    assert [region_of(trace, r) for r in kernels] == ["preprocess"] + ["decode/attention"] * 8 + ["decode"]
    for r in kernels:
        launch = [q for q in rows(trace, Kind.RUNTIME) if trace.correlation[q] == trace.correlation[r]]
        assert len(launch) == 1 and trace.ts[launch[0]] < trace.ts[r]
    (memcpy,) = rows(trace, Kind.MEMCPY)
    (memset,) = rows(trace, Kind.MEMSET)
    assert region_of(trace, memcpy) == region_of(trace, memset) == "preprocess"
    assert trace.bytes[memcpy] == 1 << 20 and trace.args[memcpy]["stream"] == 7
    softmax = rows(trace, Kind.KERNEL, "triton_per_fused_softmax_0")[0]
    assert trace.args[softmax]["registers_per_thread"] == 40 and trace.args[softmax]["shared_memory"] == 2048
    assert trace.args[kernels[1]]["grid"] == [1, 1, 1] and trace.args[kernels[1]]["block"] == [64, 1, 1]
    assert trace.pid[softmax] == 0 and trace.tid[softmax] == 7
    assert {trace.strings[trace.name[r]] for r in rows(trace, Kind.RUNTIME)} == {
        "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchKernel", "cuLaunchKernel", "cudaDeviceSynchronize"}
    src = trace.sources[0]
    assert (src.rank, src.metadata["world_size"]) == (1, 2)
    assert src.metadata["devices"][0]["numSms"] == 132
    gpu_annotation = rows(trace, Kind.OTHER, "preprocess")
    assert trace.args[gpu_annotation[0]] == {"cat": "gpu_user_annotation"}
    spans = rows(trace, Kind.OTHER, "PyTorch Profiler (0)")[0]
    assert trace.strings[-2 - int(trace.pid[spans])] == "Spans"


def test_string_pids_and_tids(tmp_path: Path) -> None:
    events = [x("cpu_op", "a", 1.0, 1.0) | {"pid": "²", "tid": "42"}, x("cpu_op", "b", 2.0, 1.0) | {"pid": "Spans"}]
    trace = load_trace(write_json(tmp_path / "s.json", kineto(events)))
    assert trace.tid[0] == 42
    assert [trace.strings[-2 - int(p)] for p in trace.pid] == ["²", "Spans"]


def _gpu_events() -> dict:
    return json.loads(KINETO_GPU.read_text())


def test_kernel_region_through_ac2g_flow_when_args_lack_correlation(tmp_path: Path) -> None:
    doc = _gpu_events()
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "cuda_runtime", "cuda_driver", "gpu_memcpy", "gpu_memset"):
            e["args"].pop("correlation", None)
            e["args"].pop("External id", None)
    trace = load_trace(write_json(tmp_path / "flows.json", doc))
    kernels = rows(trace, Kind.KERNEL)
    assert [region_of(trace, r) for r in kernels] == ["preprocess"] + ["decode/attention"] * 8 + ["decode"]
    assert (trace.correlation[kernels] >= 100).all()


def test_kernel_region_through_external_id_when_launch_is_missing(tmp_path: Path) -> None:
    doc = _gpu_events()
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if e.get("cat") not in ("cuda_runtime", "cuda_driver", "ac2g")]
    trace = load_trace(write_json(tmp_path / "noruntime.json", doc))
    kernels = rows(trace, Kind.KERNEL)
    assert [region_of(trace, r) for r in kernels] == ["preprocess"] + ["decode/attention"] * 8 + ["decode"]


# ----------------------------------------------------------------------------- several files
def test_sources_are_aligned_on_wall_time_and_weighted(tmp_path: Path) -> None:
    t0 = 1_700_000_000_000_000_000
    a = write_json(tmp_path / "a.trace.json", ours([x("region", "r", 100, 10) | {"args": {"path": "r", "id": 1}}],
                                                   start_unix_ns=t0, rank=0))
    b = write_json(tmp_path / "b.trace.json", ours([x("region", "r", 100, 10) | {"args": {"path": "r", "id": 1}}],
                                                   start_unix_ns=t0 + 2_000_000, rank=1))
    trace = load_trace(a, b, weights=[1.0, 3.0])
    assert_valid_trace(trace)
    assert [s.weight for s in trace.sources] == [1.0, 3.0]
    assert [s.rank for s in trace.sources] == [0, 1]
    by_source = {int(trace.source[r]): float(trace.ts[r]) for r in range(len(trace))}
    assert by_source == {0: 0.0, 1: pytest.approx(2000.0)}
    assert trace.sources[1].metadata["ts_offset_us"] - trace.sources[0].metadata["ts_offset_us"] == \
        pytest.approx(2000.0)
    same = load_trace([a, b])
    np.testing.assert_array_equal(same.ts, trace.ts)


def test_sub_nanosecond_timestamps_still_start_at_exactly_zero(tmp_path: Path) -> None:
    region = {"args": {"path": "r", "id": 1}}
    one = write_json(tmp_path / "a.trace.json", ours([x("region", "r", 1.6875, 10) | region,
                                                     x("region", "r", 14.5, 10) | region]))
    trace = load_trace(one)
    assert float(trace.ts.min()) == 0.0 and float(trace.ts.max()) == pytest.approx(12.8125)
    later = write_json(tmp_path / "b.trace.json", ours([x("region", "r", 0.3125, 1) | region],
                                                       start_unix_ns=1_700_000_000_000_000_000 + 5_000))
    both = load_trace(one, later)
    assert float(both.ts.min()) == 0.0                                  # a's 1.6875 µs is the earliest
    assert float(both.ts[both.source == 1][0]) == pytest.approx(5.0 + 0.3125 - 1.6875)


def test_kineto_and_ours_share_one_clock(tmp_path: Path) -> None:
    k = write_json(tmp_path / "k.json", kineto([x("cpu_op", "aten::mm", 1000.0, 5)]))
    o = write_json(tmp_path / "o.trace.json", ours([x("region", "r", 500.0, 10) | {"args": {"path": "r", "id": 1}}],
                                                   start_unix_ns=BASE_NS + 1_000_000))
    trace = load_trace(k, o)
    assert float(trace.ts[trace.source == 0][0]) == 0.0             # Kineto: BASE + 1000 µs
    assert float(trace.ts[trace.source == 1][0]) == pytest.approx(500.0)   # ours: BASE + 1000 + 500 µs


def test_weights_must_match_paths() -> None:
    with pytest.raises(ConfigError, match="2 weights given for 1"):
        load_trace(OURS, weights=[1, 2])
    with pytest.raises(ConfigError, match="positive"):
        load_trace(OURS, weights=[0])
    with pytest.raises(ConfigError, match="positive"):
        load_trace(OURS, weights=[float("nan")])


def test_source_without_time_anchor_starts_at_zero_with_a_note(tmp_path: Path) -> None:
    bare = write_json(tmp_path / "bare.json", {"traceEvents": [x("cpu_op", "op", 50.0, 1)]})
    trace = load_trace(bare, OURS)
    assert trace.ts[trace.source == 0].min() == 0.0
    assert any("no absolute time anchor" in n for n in trace.sources[0].notes)
    assert "start_unix_ns" not in trace.sources[0].metadata


def test_older_kineto_absolute_unix_microseconds(tmp_path: Path) -> None:
    us = 1_700_000_000_123_456.0
    path = write_json(tmp_path / "old.json", {"traceEvents": [x("cpu_op", "a", us, 1), x("cpu_op", "b", us + 10, 1)]})
    trace = load_trace(path)
    assert trace.ts.tolist() == [0.0, 10.0]
    assert trace.sources[0].metadata["start_unix_ns"] == round(us * 1000)


# ----------------------------------------------------------------------------- counters, formats, API
def test_counters_one_row_per_series(tmp_path: Path) -> None:
    counters = [
        {"ph": "C", "name": "sm_util", "pid": 0, "ts": 5.0, "args": {"gpu0": 40, "gpu1": 60.5}},
        {"ph": "C", "name": "cpu_util", "pid": 1, "ts": 6.0, "args": {"value": 12}},
        {"ph": "C", "name": "power_w", "pid": 0, "ts": 7.0, "args": {"power_w": 300, "label": "x", "on": True}},
    ]
    for name, doc in (("o.trace.json", ours(counters + [x("region", "r", 0.0, 1) | {"args": {"path": "r"}}])),
                      ("k.json", kineto(counters + [x("cpu_op", "a", 0.0, 1)]))):
        trace = load_trace(write_json(tmp_path / name, doc))
        c = trace.counters
        got = [(trace.strings[n], t, v, p) for n, t, v, p in zip(c["name"], c["ts"], c["value"], c["pid"], strict=True)]
        assert got == [("sm_util.gpu0", 5.0, 40.0, 0), ("sm_util.gpu1", 5.0, 60.5, 0), ("cpu_util", 6.0, 12.0, 1),
                       ("power_w", 7.0, 300.0, 0)]


def test_array_form_and_unknown_categories(tmp_path: Path) -> None:
    path = write_json(tmp_path / "arr.json", [x("python_function", "f", 1.0, 2), x("cpu_op", "a", 2.0, 1),
                                              {"ph": "i", "name": "mark", "ts": 3.0, "pid": 1, "tid": 1}])
    trace = load_trace(path)
    f = rows(trace, Kind.OTHER, "f")[0]
    assert trace.args[f] == {"cat": "python_function"}
    assert trace.sources[0].notes == ["ignored events of phase 'i' x1",
                                      "kept as other events, not analysed: 'python_function' x1"]


def test_equal_start_rows_put_the_longer_first(tmp_path: Path) -> None:
    events = [x("cpu_op", "child", 10, 1), x("user_annotation", "parent", 10, 5)]
    trace = load_trace(write_json(tmp_path / "k.json", kineto(events)))
    assert [trace.strings[n] for n in trace.name] == ["parent", "child"]
    assert region_of(trace, 1) == "parent"


def test_public_api_and_args_map() -> None:
    assert cuvil_pgc.load_trace is load_trace
    trace = load_trace(KINETO_GPU)
    args = trace.args
    assert isinstance(args, ArgsMap) and len(args) == len(list(args))
    row = rows(trace, Kind.KERNEL)[0]
    assert row in args and args.get(row)["stream"] == 7
    args[row] = {"note": 1}
    assert args[row] == {"note": 1}
    del args[row]
    assert row not in args and args.get(row) is None
    assert all(isinstance(v, dict) for v in args.materialize().values())


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    path = tmp_path / "plain-name.json"
    path.write_bytes(gzip.compress(KINETO_CPU.read_bytes()))
    assert len(load_trace(path)) == len(load_trace(KINETO_CPU))


def test_kineto_flops_and_bytes_args_fill_columns(tmp_path: Path) -> None:
    events = [x("cpu_op", "aten::mm", 1.0, 2.0, **{"External id": 7, "flops": 524288, "Input Dims": [[64, 64]]}),
              x("gpu_memset", "Memset (Device)", 2.0, 1.0, pid=0, tid=7, bytes=4096, correlation=3)]
    trace = load_trace(write_json(tmp_path / "k.json", kineto(events)))
    mm = rows(trace, Kind.CPU_OP, "aten::mm")[0]
    assert trace.flops[mm] == 524288 and np.isnan(trace.bytes[mm])
    assert trace.events["external_id"][mm] == 7 and trace.args[mm] == {"shapes": [[64, 64]]}
    memset = rows(trace, Kind.MEMSET)[0]
    assert trace.bytes[memset] == 4096 and trace.correlation[memset] == 3


def test_region_attributes_named_like_columns_stay_user_attributes(tmp_path: Path) -> None:
    path = tmp_path / "attrs.trace.json"
    with profile(str(path), ops=False, gpu="off", sample_hz=0, compile=False):
        with ProfileRegion("load", bytes="big", correlation="x", region="r"):
            pass
        with ProfileRegion("matmul", flops=2e9, bytes=4096):
            pass
    trace = load_trace(path)
    load, matmul = rows(trace, Kind.REGION, "load")[0], rows(trace, Kind.REGION, "matmul")[0]
    assert trace.args[load] == {"bytes": "big", "correlation": "x", "region": "r"}
    assert region_of(trace, load) == "load" and np.isnan(trace.bytes[load])
    assert trace.flops[matmul] == 2e9 and trace.bytes[matmul] == 4096
    assert trace.args[matmul] == {"flops": 2e9, "bytes": 4096}


def test_our_op_and_unknown_category_args(tmp_path: Path) -> None:
    events = [
        x("cpu_op", "aten::add", 1.0, 1.0) | {"args": {"region": None, "shapes": [[2], [2]], "dtypes": ["float"],
                                                       "flops": None, "bytes": None, "depth": 0}},
        x("python_function", "f", 2.0, 1.0) | {"args": {"Python id": 3, "region": "p"}},
        x("cpu_op", "aten::relu", 3.0, 1.0) | {"args": {}},
    ]
    trace = load_trace(write_json(tmp_path / "o.trace.json", ours(events)))
    add, f, relu = (rows(trace, name=n)[0] for n in ("aten::add", "f", "aten::relu"))
    assert trace.args[add] == {"shapes": [[2], [2]], "dtypes": ["float"], "depth": 0}
    assert trace.args[f] == {"Python id": 3, "cat": "python_function"} and region_of(trace, f) == "p"
    assert relu not in trace.args


def test_synthesised_region_ids_avoid_the_ids_a_file_gives(tmp_path: Path) -> None:
    events = [x("region", "a", 1.0, 10.0) | {"args": {"path": "a", "id": 2**63 - 1}},
              x("region", "b", 2.0, 1.0) | {"args": {"path": "a/b", "id": 1}},
              x("region", "c", 3.0, 1.0) | {"args": {}},
              x("region", "d", 5.0, 1.0) | {"args": {}}]
    trace = load_trace(write_json(tmp_path / "ids.trace.json", ours(events)))
    ids = {trace.strings[trace.name[r]]: int(trace.region_id[r]) for r in range(len(trace))}
    assert ids == {"a": 2**63 - 1, "b": 1, "c": 2, "d": 3}
    c = rows(trace, Kind.REGION, "c")[0]
    assert region_of(trace, c) == "a/c" and trace.parent_id[c] == 2**63 - 1


def test_garbage_collector_state_is_restored() -> None:
    import gc

    assert gc.isenabled()
    load_trace(OURS)
    assert gc.isenabled()
    gc.disable()
    try:
        load_trace(OURS)
        assert not gc.isenabled()
        with pytest.raises(TraceError):
            load_trace("/nonexistent/x.trace.json")
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(TraceError):
        load_trace("/nonexistent/x.trace.json")
    assert gc.isenabled()
