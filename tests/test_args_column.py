"""``Trace.args`` of a loaded Kineto trace: an int32 column of codes into deduplicated args, not a
per-row dict (a loop's operators share one entry), still read and written as ``dict[int, dict]``."""

from __future__ import annotations

from pathlib import Path

from cuvil_pgc.trace.reader import load_trace
from cuvil_pgc.trace.schema import Kind
from tests.test_reader import kineto, write_json, x


def _trace(tmp_path: Path):
    events = []
    for i in range(50):
        events.append(x("cpu_op", "aten::mm", 10 + i * 10, 5, **{"Input Dims": [[2, 3], [3, 4]],
                                                                 "Input type": ["float", "float"],
                                                                 "External id": i + 1}))
        events.append(x("cuda_runtime", "cudaLaunchKernel", 11 + i * 10, 1, correlation=i + 1))
        events.append(x("kernel", "sgemm", 12 + i * 10, 2, pid=0, tid=7, correlation=i + 1, grid=[i, 1, 1]))
    events.append(x("cpu_op", "aten::add", 600, 5, **{"Input Dims": [[8]], "Input type": ["float"]}))
    return load_trace(write_json(tmp_path / "k.json", kineto(events)))


def test_operator_args_share_one_entry_and_read_as_dicts(tmp_path):
    trace = _trace(tmp_path)
    ops = [r for r in range(len(trace)) if trace.kind[r] == Kind.CPU_OP]
    rows, values = trace.args.raw_items()
    assert list(rows) == sorted(rows) and len(rows) == len(trace.args) == 151
    stored = {id(v) for r, v in zip(rows.tolist(), values, strict=True) if r in set(ops)}
    assert len(stored) == 2                                   # 50 aten::mm rows share one struct
    assert trace.args[ops[0]] == {"shapes": [[2, 3], [3, 4]], "dtypes": ["float", "float"]}
    assert trace.args[ops[-1]]["shapes"] == [[8]]
    kernels = [r for r in range(len(trace)) if trace.kind[r] == Kind.KERNEL]
    assert [trace.args[r]["grid"][0] for r in kernels] == list(range(50))


def test_args_column_behaves_as_a_mapping(tmp_path):
    trace = _trace(tmp_path)
    args = trace.args
    op = next(r for r in range(len(trace)) if trace.kind[r] == Kind.CPU_OP)
    args[op]["note"] = 1                                      # changes to a read dict stay
    assert args[op]["note"] == 1 and args.get(op + 2**40) is None
    other = next(r for r in range(len(trace)) if trace.kind[r] == Kind.CPU_OP and r != op)
    assert "note" not in args[other]                          # ... on that row only
    del args[other]
    assert other not in args and len(args) == 150
    args[other] = {"x": 2}
    assert args[other] == {"x": 2} and len(args) == 151
    before = {r: dict(args[r]) for r in args}
    assert {r: args[r] for r in args.materialize()} == before
