"""A file passed for a trace that is another tool's output is named as such, with what to record
instead, and is not parsed as what it is (a pickle is never unpickled)."""

from __future__ import annotations

import gzip
import json
import pickle
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import load_trace


def _sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("create table CUPTI_ACTIVITY_KIND_KERNEL(start int, end int)")
    db.commit()
    db.close()


class _Runs:
    """Unpickling this creates the file named by its argument."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


CASES = {
    "report.sqlite": (_sqlite, "an SQLite database (Nsight Systems"),
    "report.nsys-rep": (lambda p: p.write_bytes(b"\x00\x01NSYS\xf7" * 40), "an Nsight Systems report"),
    "kernels.ncu-rep": (lambda p: p.write_bytes(b"\x00\x07" * 40), "an Nsight Compute report"),
    "trace.pftrace": (lambda p: p.write_bytes(b"\x0a\x8f\x01" * 40), "a Perfetto protobuf trace"),
    "trace.json.zst": (lambda p: p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 40), "compressed with zstd"),
    "trace.json.xz": (lambda p: p.write_bytes(b"\xfd7zXZ\x00" + b"\x00" * 40), "compressed with xz"),
    "build.cuvilpkg": (lambda p: zipfile.ZipFile(p, "w").writestr("plan.json", "{}"), "a zip archive"),
    "et.json": (lambda p: p.write_text(json.dumps({"schema": "1.0.3-chakra.0.0.4", "pid": 1, "nodes": [{"id": 1}]})),
                "a PyTorch execution trace"),
    "snapshot.json.gz": (lambda p: p.write_bytes(gzip.compress(json.dumps({"segments": [], "device_traces": []})
                                                               .encode())), "a CUDA memory snapshot"),
}


@pytest.mark.parametrize("name", CASES)
def test_another_tools_file_is_named_with_what_to_record(tmp_path: Path, name: str) -> None:
    write, what = CASES[name]
    path = tmp_path / name
    write(path)
    with pytest.raises(TraceError) as err:
        load_trace(str(path))
    assert what in str(err.value) and name in str(err.value) and err.value.fix


def test_a_pickle_is_named_and_never_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(_Runs(str(marker)), protocol=4))
    with pytest.raises(TraceError) as err:
        load_trace(str(path))
    assert "a Python pickle" in str(err.value) and "torch.profiler" in err.value.fix
    assert not marker.exists()
    pickle.loads(path.read_bytes())          # what loading it would have done
    assert marker.exists()


def test_a_json_trace_named_like_another_format_is_read(tmp_path: Path) -> None:
    """The suffix alone names a format only where the file does not start as JSON."""
    text = json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2,
                                        "pid": 1, "tid": 1}]})
    (tmp_path / "renamed.pftrace").write_text(text)
    (tmp_path / "zipped.nsys-rep").write_bytes(gzip.compress(text.encode()))
    for name in ("renamed.pftrace", "zipped.nsys-rep"):
        assert len(load_trace(str(tmp_path / name)).events["ts"]) == 1


def test_the_cli_names_an_nsight_database(tmp_path: Path) -> None:
    path = tmp_path / "report.sqlite"
    _sqlite(path)
    done = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "an SQLite database (Nsight Systems" in done.stderr
    assert "Traceback" not in done.stderr
