"""The decompressed-size cap follows the memory the loader can use (issue 23, item 10)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tracemalloc
import zlib

import pytest

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _input, load_trace


def _bomb(path, decompressed: int) -> None:
    """A valid-looking trace that is almost all whitespace: ~1000x smaller compressed."""
    body = b'{"traceEvents": [' + b" " * decompressed + b"]}"
    path.write_bytes(gzip.compress(body, compresslevel=9))


def test_the_default_cap_is_a_share_of_available_memory(monkeypatch):
    assert 0 < _input.available_memory()
    monkeypatch.delenv(_input.ENV_MAX_TRACE_BYTES, raising=False)
    monkeypatch.setattr(_input, "available_memory", lambda: 40 << 30)
    assert _input.max_trace_bytes() == (40 << 30) // _input.MEMORY_PER_BYTE
    monkeypatch.setattr(_input, "available_memory", lambda: 0)
    assert _input.max_trace_bytes() == _input.MIN_TRACE_BYTES


def test_a_gzip_bomb_is_refused_before_it_takes_the_memory(tmp_path, monkeypatch):
    path = tmp_path / "bomb.trace.json.gz"
    _bomb(path, 48 << 20)                      # 48 MiB decompressed from ~50 KB
    assert path.stat().st_size < 200_000
    monkeypatch.delenv(_input.ENV_MAX_TRACE_BYTES, raising=False)
    monkeypatch.setattr(_input, "MIN_TRACE_BYTES", 1 << 20)
    monkeypatch.setattr(_input, "available_memory", lambda: 32 << 20)       # the cap is 8 MiB
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=r"bomb.trace.json.gz: decompressed, it holds more than 8,388,608 bytes"
                                             r".*share of the memory available.*CUVIL_MAX_TRACE_BYTES"):
            load_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, f"peak {peak:,} bytes"      # the cap, one chunk and the decompressor; not 48 MiB
    monkeypatch.setattr(_input, "available_memory", lambda: 1 << 30)
    assert len(load_trace(path)) == 0                   # with the memory, the same file loads


def test_a_gzip_bomb_on_the_command_line_with_a_low_cap(tmp_path):
    path = tmp_path / "bomb.trace.json.gz"
    _bomb(path, 4 << 20)
    env = {**os.environ, _input.ENV_MAX_TRACE_BYTES: "1000000"}
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "summary", str(path)], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "decompressed, it holds more than 1,000,000 bytes, the limit for one trace" in result.stderr


def test_decompressing_keeps_one_copy(tmp_path, monkeypatch):
    """Peak memory of reading a gzip trace stays near its decompressed size (no list + join copy)."""
    size = 24 << 20
    path = tmp_path / "big.trace.json.gz"
    _bomb(path, size)
    monkeypatch.setenv(_input.ENV_MAX_TRACE_BYTES, str(1 << 30))
    tracemalloc.start()
    try:
        with open(path, "rb") as f:
            data = _input._gunzip(f, str(path), 1 << 30, False, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(data) == size + 19
    assert peak < size * 1.5 + (8 << 20), f"peak {peak:,} bytes for {size:,}"
    assert zlib.crc32(data) == zlib.crc32(gzip.decompress(path.read_bytes()))
