"""analyze on an engine: map each trace apart, reduce; the same Analysis in one process, a pool and Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cuvil_pgc import analyze, load_trace
from cuvil_pgc.analyze.engine import analyze_many
from cuvil_pgc.analyze.reduce import map_trace, reduce_partials
from cuvil_pgc.errors import ConfigError, TraceError
from cuvil_pgc.trace.discover import trace_files
from tests._fleet_traces import write_run


def _doc(analysis):
    doc = analysis.to_json()
    doc["trace"].pop("engine", None)          # timings: the one part allowed to differ
    return doc


@pytest.fixture
def run_dir(tmp_path):
    write_run(tmp_path / "runs", "job", ranks=4, slow=2, day=0)
    write_run(tmp_path / "runs", "job2", ranks=2, day=1, scale=2.0)
    return tmp_path / "runs"


def test_reduce_adds_histograms_and_finds_the_straggler(run_dir):
    merged = analyze_many([run_dir], workers=1)
    paths = trace_files([run_dir])
    assert len(paths) == 6 and merged.trace["traces"] == 6
    singles = [analyze(load_trace(p)) for p in paths]
    decode = merged.region("request/decode")
    assert decode.calls == sum(s.region("request/decode").calls for s in singles) == 6 * 20
    assert decode.total_us == pytest.approx(sum(s.region("request/decode").total_us for s in singles))
    assert sum(decode.histogram["counts"]) == pytest.approx(120)
    lo, hi = min(s.region("request/decode").p50_us for s in singles), max(s.region("request/decode").p99_us
                                                                          for s in singles)
    assert lo * 0.9 <= decode.p50_us <= decode.p99_us <= hi * 1.1
    assert decode.evidence["traces"] == 6
    assert merged.ranks["ranks"] == [0, 1, 2, 3]
    straggler = merged.ranks["stragglers"][0]
    assert straggler["path"] in ("request", "request/decode")
    # rank 2 is slow in job; but job2 (ranks 0, 1) runs at twice the scale, so per-rank totals add both runs
    per = next(r for r in merged.ranks["regions"] if r["path"] == "request/decode")["per_rank_us"]
    assert per["2"] > per["3"]
    assert merged.trace["events"] == sum(s.trace["events"] for s in singles)


def test_quantiles_over_traces_are_those_of_the_merged_calls(run_dir, monkeypatch):
    """Where each trace sends its calls the quantiles are exact: the same as one analyze() of the
    files together. Past EXACT_CALLS they come from the merged histogram, and stay within the
    calls' smallest and largest (before, p99 could exceed the slowest call by half a bucket)."""
    reduce_mod = sys.modules[map_trace.__module__]

    paths = trace_files([run_dir])
    together = analyze(load_trace(*paths)).region("request/decode")
    merged = analyze_many([run_dir], workers=1).region("request/decode")
    assert (merged.p50_us, merged.p95_us, merged.p99_us) == (together.p50_us, together.p95_us, together.p99_us)
    monkeypatch.setattr(reduce_mod, "EXACT_CALLS", 0)
    coarse = reduce_partials([map_trace(p) for p in paths]).region("request/decode")
    trace = load_trace(*paths)
    ev = trace.events
    durs = [float(d) for d, code in zip(ev["dur"], ev["region"], strict=True)
            if code >= 0 and trace.strings[int(code)] == "request/decode"]
    assert min(durs) <= coarse.p50_us <= coarse.p99_us <= max(durs)


def test_order_of_the_partials_does_not_change_the_result(run_dir):
    partials = [map_trace(p) for p in trace_files([run_dir])]
    a = reduce_partials(partials)
    b = reduce_partials(list(reversed(partials)))
    assert a.to_json() == b.to_json()


def test_one_trace_reduces_to_its_own_analysis(tmp_path):
    (p,) = write_run(tmp_path, "solo", ranks=1)
    assert _doc(analyze_many([p], workers=1)) == analyze(load_trace(p)).to_json()


def test_local_pool_gives_the_single_process_result(run_dir):
    single = analyze_many([run_dir], workers=1)
    pooled = analyze_many([str(run_dir / "*.trace.json")], engine="local", workers=2)
    assert pooled.trace["engine"]["workers"] == 2 and single.trace["engine"]["workers"] == 1
    assert _doc(pooled) == _doc(single)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")     # one local Ray cluster at a time (pytest -n: one worker runs both)
def test_ray_gives_the_local_and_single_process_result(run_dir, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    single = analyze_many([run_dir], workers=1)
    local = analyze_many([run_dir], engine="local", workers=2)
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="ERROR",
             log_to_driver=False)
    try:
        seen = []
        on_ray = analyze_many([run_dir], engine="ray", progress=lambda done, total, path: seen.append((done, total)))
    finally:
        ray.shutdown()
    assert on_ray.trace["engine"]["name"] == "ray"
    assert seen[-1] == (6, 6) and len(seen) == 6
    assert _doc(on_ray) == _doc(local) == _doc(single)


def test_engine_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="not an engine"):
        analyze_many([tmp_path], engine="spark")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="holds no trace files"):
        analyze_many([tmp_path / "empty"])
    with pytest.raises(TraceError, match="matches no files"):
        analyze_many([str(tmp_path / "x*.trace.json")])
    (tmp_path / "bad.trace.json").write_text("{not json")
    with pytest.raises(TraceError, match="bad.trace.json"):
        analyze_many([tmp_path / "bad.trace.json", tmp_path / "bad.trace.json"], workers=2)


def test_analyze_cli_on_a_directory_uses_the_engine(run_dir):
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(run_dir), "--engine", "local",
                          "--workers", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["trace"]["engine"]["name"] == "local" and doc["trace"]["traces"] == 6
    assert doc["ranks"]["ranks"] == [0, 1, 2, 3]
    single = _doc(analyze_many([run_dir], workers=1))
    doc["trace"].pop("engine")
    assert json.loads(json.dumps(single)) == doc


def test_a_parquet_export_directory_is_analysed_one_trace_per_unit(run_dir, tmp_path):
    pytest.importorskip("pyarrow")
    from cuvil_pgc.analyze.engine import work_units
    from cuvil_pgc.trace.parquet import export_files
    from tests.test_fleet_export import _same

    files = trace_files([run_dir])
    export_files(files, tmp_path / "ds", workers=1)
    units = work_units([tmp_path / "ds"])
    assert len(units) == len(files) and all(u.endswith(".parquet") for u in units)
    from_files = _doc(analyze_many(files, workers=1))
    _same(_doc(analyze_many([tmp_path / "ds"], engine="local", workers=2)), from_files)
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(tmp_path / "ds"), "--engine", "local",
                          "--workers", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["trace"]["engine"]["traces"] == len(files) and doc["ranks"]["ranks"] == [0, 1, 2, 3]


def test_the_engine_refuses_summaries_with_event_traces_as_one_process_does(run_dir, tmp_path):
    from cuvil_pgc import ProfileRegion, profile
    from cuvil_pgc.errors import AnalysisError

    summary = tmp_path / "serve.summary.json"
    with profile(summary, mode="aggregate"):
        with ProfileRegion("request"):
            pass
    with pytest.raises(AnalysisError, match="cannot be analysed together"):
        analyze(load_trace(summary, *trace_files([run_dir])))
    with pytest.raises(AnalysisError, match="serve.summary.json.* cannot be analysed together"):
        analyze_many([run_dir, summary], workers=2)


def _map_and_look(path, machine, filter):
    """map_trace, then what the worker still holds: run in the pool's worker processes."""
    import gc
    import os

    from cuvil_pgc.trace.columns import Trace

    partial = map_trace(path, machine, filter)
    live = sum(1 for o in gc.get_objects() if isinstance(o, Trace))
    return {**partial, "probe": {"given": type(path).__name__, "live_traces": live, "pid": os.getpid()}}


def _plain(value):
    """Whether ``value`` is made of JSON-like builtins only (no Trace, no numpy arrays)."""
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))      # numpy.float64 is a float


def test_workers_get_one_path_at_a_time_and_return_small_reduced_results(run_dir, monkeypatch):
    """What bounds a worker's memory by its largest trace (the figures are in benchmarks/fleet_scale.py):
    the map is called once per trace with one path, keeps no Trace once it returns, and returns a
    plain, small result rather than the trace."""
    import pickle

    from cuvil_pgc.analyze import engine

    seen = []
    monkeypatch.setattr(engine, "map_trace", _map_and_look)
    monkeypatch.setattr(engine, "reduce_partials", lambda partials: seen.extend(partials) or reduce_partials(partials))
    analyze_many([run_dir], workers=2)
    paths = trace_files([run_dir])
    assert sorted(p["unit"] for p in seen) == sorted(paths)              # each trace once
    assert {p["probe"]["given"] for p in seen} == {"str"}                # a path, never a list of them
    assert {p["probe"]["live_traces"] for p in seen} == {0}              # nothing kept between traces
    assert len({p["probe"]["pid"] for p in seen}) <= 2
    for p in seen:
        assert _plain(p)
        assert len(pickle.dumps(p)) < 0.5 * (run_dir / p["unit"]).stat().st_size


def _closed_port():
    """A loopback port nothing listens on (bound, never listened, closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_fails_at_once_with_a_clear_error(run_dir, monkeypatch):
    ray = pytest.importorskip("ray")

    def never(*args, **kwargs):
        raise AssertionError("ray.init was called: it retries an unreachable address for minutes")

    monkeypatch.setattr(ray, "init", never)
    address = f"127.0.0.1:{_closed_port()}"
    with pytest.raises(ConfigError, match=rf"cannot reach the Ray cluster at {address}: .*refused.*--address"):
        analyze_many([run_dir], engine="ray", address=address)
    monkeypatch.setenv("RAY_ADDRESS", f"ray://{address}")
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster at ray://127.0.0.1"):
        analyze_many([run_dir], engine="ray")


def test_ray_addresses_and_authentication_failures_are_told_apart():
    from cuvil_pgc.analyze._ray_engine import auth_failure, host_and_port

    assert host_and_port("head:6379") == ("head", 6379)
    assert host_and_port("ray://10.0.0.5:10001") == ("10.0.0.5", 10001)
    assert host_and_port("[::1]:6379") == ("::1", 6379)
    assert host_and_port("auto") is None and host_and_port("local") is None and host_and_port(None) is None
    ray = pytest.importorskip("ray")
    try:       # how Ray 2.60's ray.init reports a cluster refusing a driver without the token
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: ... Unauthenticated: RPC error: "
                               "InvalidAuthToken: Authentication token is missing or incorrect")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from inner
    except ConnectionError as exc:
        assert auth_failure(exc, ray)
    assert not auth_failure(ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379"), ray)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")     # one local Ray cluster at a time (pytest -n: one worker runs both)
def test_analyze_through_address_on_a_cluster_started_with_ray_start(run_dir, tmp_path):
    """``ray start --head`` (token authentication, Ray 2.60's default when a token exists) in a subprocess; the CLI
    joins it through --address with RAY_AUTH_MODE=token, and without it says so. The head and what it
    started are stopped through their own session (``ray stop`` would stop every Ray on the machine)."""
    import os
    import secrets
    import shutil
    import signal
    import socket
    import tempfile
    import time

    pytest.importorskip("ray")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _closed_port()
    temp = tempfile.mkdtemp(prefix="cr", dir="/tmp")            # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # The cluster's token in a home of its own: ray start enables token authentication when one exists
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env.update(HOME=str(tmp_path / "home"), RAY_ENABLE_UV_RUN_RUNTIME_ENV="0",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen([ray_bin, "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard", "false", "--temp-dir", temp, "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        for _ in range(240):
            assert head.poll() is None, head.stderr.read().decode()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        cmd = [sys.executable, "-m", "cuvil_pgc", "analyze", str(run_dir), "--engine", "ray",
               "--address", f"127.0.0.1:{port}", "--json"]
        run = subprocess.run(cmd, env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        doc = json.loads(run.stdout)
        assert doc["trace"]["engine"]["name"] == "ray" and doc["trace"]["traces"] == 6
        doc["trace"].pop("engine")
        assert doc == json.loads(json.dumps(_doc(analyze_many([run_dir], workers=1))))
        # without RAY_AUTH_MODE=token (ray.init's own retries cut to a second)
        run = subprocess.run(cmd, env={**env, "RAY_gcs_server_port_wait_time_s": "1"}, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 1
        last = run.stderr.strip().splitlines()[-1]
        assert "requires token authentication" in last and "RAY_AUTH_MODE=token" in last, run.stderr[-3000:]
        assert "Traceback" not in run.stderr
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(60)
        finally:
            try:
                os.killpg(head.pid, signal.SIGKILL)           # whatever of that session is left
            except ProcessLookupError:
                pass
            shutil.rmtree(temp, ignore_errors=True)
