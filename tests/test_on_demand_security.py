"""The on-demand control channel against other local users (issue 23, item 7).

Hostile users are simulated with files of another owner (``os.chown`` to uid 65534), which needs
root; those tests are skipped with that reason elsewhere.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import tempfile
import threading
import time

import orjson
import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.errors import CuvilError
from cuvil_pgc.instrument import _control, capture
from cuvil_pgc.instrument.on_demand import OnDemandController, control_dir, done_path, request_path

OTHER_UID = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="simulating another user's files needs root (chown)")
QUIET = {"ops": False, "gpu": "off", "sample_hz": 0, "compile": False}


@pytest.fixture
def ctl(tmp_path):
    directory = tmp_path / "ctl"
    directory.mkdir(mode=0o700)
    return OnDemandController(str(directory), **QUIET)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- where the channel lives ---------------------------------------------------------------------------------

def test_default_control_dir_is_per_user_never_the_temp_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("CUVIL_PGC_CONTROL_DIR", raising=False)
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert control_dir() == str(runtime / "cuvil-pgc")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    assert control_dir() == str(tmp_path / "cache" / "control")
    assert not control_dir().startswith(tempfile.gettempdir() + os.sep + "cuvil-pgc")
    controller = OnDemandController(**QUIET).start()
    try:
        assert controller.unavailable is None
        assert _mode(tmp_path / "cache" / "control") == 0o700
    finally:
        controller.stop()


@needs_root
def test_a_runtime_dir_of_another_user_is_not_used(tmp_path, monkeypatch):
    monkeypatch.delenv("CUVIL_PGC_CONTROL_DIR", raising=False)
    runtime = tmp_path / "run-other"
    runtime.mkdir(mode=0o700)
    os.chown(runtime, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    assert control_dir() == str(tmp_path / "cache" / "control")


@pytest.mark.parametrize("kind", ["world-writable", "other-owner", "symlink"])
def test_an_unsafe_control_dir_keeps_the_controller_off(tmp_path, kind, caplog):
    if kind == "other-owner" and os.geteuid() != 0:
        pytest.skip("simulating another user's directory needs root (chown)")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    directory = tmp_path / "ctl"
    if kind == "symlink":
        directory.symlink_to(real)
    else:
        directory.mkdir()
        if kind == "world-writable":
            os.chmod(directory, 0o777)
        else:
            os.chown(directory, OTHER_UID, OTHER_UID)
    caplog.set_level(logging.WARNING, "cuvil_pgc")
    controller = OnDemandController(str(directory), **QUIET).start()     # never raises into the program
    assert controller.unavailable and "unsafe control directory" in controller.unavailable
    assert controller._thread is None and controller.stop() is None
    assert "on-demand capture is off" in caplog.text
    assert not any(p.name.startswith("cuvil-pgc-") for p in directory.iterdir())
    with pytest.raises(CuvilError, match="unsafe control directory"):
        capture.request_capture(os.getpid(), seconds=1, directory=str(directory), timeout=0.1)


# --- hostile request files --------------------------------------------------------------------------------------

def _request(ctl, doc=None) -> str:
    path = request_path(ctl.pid, ctl.directory)
    with open(path, "wb") as f:
        f.write(orjson.dumps(doc if doc is not None else {"id": "abc123", "seconds": 1.0}))
    return path


def test_a_request_of_the_same_user_is_accepted(ctl):
    path = _request(ctl)
    assert ctl._read_request() == {"id": "abc123", "seconds": 1.0}
    assert not os.path.lexists(path)


@needs_root
def test_a_request_owned_by_another_user_is_rejected(ctl):
    path = _request(ctl)
    os.chown(path, OTHER_UID, OTHER_UID)
    assert ctl._read_request() is None
    assert ctl.failures.counts == {"owner": 1} and not os.path.lexists(path)


def _read_in_thread(ctl, limit_s=10.0):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("r", ctl._read_request()), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), "the watcher blocked on a control file"
    return result["r"]


def test_a_fifo_does_not_block_the_watcher(ctl):
    path = request_path(ctl.pid, ctl.directory)
    os.mkfifo(path)
    assert _read_in_thread(ctl) is None
    assert ctl.failures.counts == {"not-regular": 1} and not os.path.lexists(path)


def test_a_symlink_to_dev_zero_is_not_followed(ctl):
    path = request_path(ctl.pid, ctl.directory)
    os.symlink("/dev/zero", path)
    assert _read_in_thread(ctl) is None
    assert ctl.failures.counts == {"symlink": 1}
    assert not os.path.lexists(path) and os.path.exists("/dev/zero")


def test_a_sparse_huge_file_is_not_read(ctl):
    path = request_path(ctl.pid, ctl.directory)
    with open(path, "wb") as f:
        f.truncate(1_500_000_000)       # 1.5 GB that takes no disk
    assert _read_in_thread(ctl) is None
    assert ctl.failures.counts == {"size": 1} and not os.path.lexists(path)


@pytest.mark.parametrize("doc, problem", [
    ({"id": "../../etc/x", "seconds": 1}, "id must be"),
    ({"id": "abc", "seconds": -1}, "seconds must be"),
    ({"id": "abc", "seconds": 1e308}, "seconds must be"),
    ({"id": "abc", "steps": "lots"}, "steps must be"),
    ([1, 2], "JSON object"),
])
def test_invalid_requests_are_refused_with_an_answer_when_they_can_be(ctl, doc, problem, caplog):
    caplog.set_level(logging.WARNING, "cuvil_pgc")
    _request(ctl, doc)
    assert ctl._read_request() is None
    assert problem in caplog.text
    answer = done_path(ctl.pid, "abc", ctl.directory)
    if isinstance(doc, dict) and doc.get("id") == "abc":
        assert "invalid request" in orjson.loads(open(answer, "rb").read())["error"]
        assert _mode(answer) == 0o600
    assert not any(".." in p for p in os.listdir(ctl.directory))


def test_an_undeletable_request_is_acted_on_once_and_logged_once(ctl, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "cuvil_pgc")
    _request(ctl)

    def refuse(path, *a, **k):
        raise PermissionError(1, "Operation not permitted", path)

    monkeypatch.setattr(os, "unlink", refuse)
    results = [ctl._read_request() for _ in range(50)]          # five seconds of the watcher's polls
    assert results[0] == {"id": "abc123", "seconds": 1.0} and results[1:] == [None] * 49
    assert ctl.failures.counts == {"unlink": 1, "stuck": 49}
    lines = [r for r in caplog.records if "cuvil-pgc" in r.getMessage()]
    assert len(lines) == 2          # one line per distinct failure, not one per poll
    ctl.failures.summarize()
    assert "happened 49 times" in caplog.text


def test_a_precreated_partial_does_not_block_windows(ctl):
    first = os.path.join(ctl.directory, f"cuvil-pgc-{ctl.pid}.0.trace.json")
    open(first + ".partial", "wb").close()
    os.symlink("/etc/passwd", os.path.join(ctl.directory, f"cuvil-pgc-{ctl.pid}.1.trace.json"))
    assert ctl._window_path() == os.path.join(ctl.directory, f"cuvil-pgc-{ctl.pid}.2.trace.json")


# --- files written -----------------------------------------------------------------------------------------------

def test_traces_and_partials_are_private_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("CUVIL_PGC_TRACE_MODE", raising=False)
    path = tmp_path / "run.trace.json"
    session = profile(path, **QUIET).start()
    with ProfileRegion("step"):
        pass
    assert _mode(str(path) + ".partial") == 0o600
    session.stop()
    assert _mode(path) == 0o600
    monkeypatch.setenv("CUVIL_PGC_TRACE_MODE", "640")
    with profile(tmp_path / "shared.trace.json", **QUIET):
        pass
    assert _mode(tmp_path / "shared.trace.json") == 0o640 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- the requesting side ----------------------------------------------------------------------------------------

def _answer_when_asked(ctl, make_answer):
    """A stand-in server: waits for the request file, then writes what make_answer returns."""
    def serve():
        path = request_path(ctl.pid, ctl.directory)
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        request = orjson.loads(open(path, "rb").read())
        os.unlink(path)
        make_answer(done_path(ctl.pid, request["id"], ctl.directory))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@needs_root
def test_a_forged_answer_of_another_user_is_refused(ctl):
    def forge(answer):
        with open(answer, "wb") as f:
            f.write(orjson.dumps({"trace": "/home/attacker/chosen.trace.json"}))
        os.chown(answer, OTHER_UID, OTHER_UID)

    thread = _answer_when_asked(ctl, forge)
    with pytest.raises(CuvilError, match="refusing the answer file.*belongs to"):
        capture.request_capture(ctl.pid, seconds=0.1, directory=ctl.directory, timeout=20)
    thread.join()


def test_an_answer_naming_a_file_outside_the_channel_is_refused(ctl):
    thread = _answer_when_asked(ctl, lambda answer: _control.write_control_file(
        answer, orjson.dumps({"trace": "/etc/passwd"})))
    with pytest.raises(CuvilError, match="not a capture window of process"):
        capture.request_capture(ctl.pid, seconds=0.1, directory=ctl.directory, timeout=20)
    thread.join()


def test_capture_end_to_end_in_process(ctl):
    ctl.start()
    try:
        assert ctl.unavailable is None
        done = {}
        worker = threading.Thread(target=lambda: done.setdefault("path", capture.request_capture(
            ctl.pid, seconds=0.3, directory=ctl.directory, timeout=30)), daemon=True)
        worker.start()
        while worker.is_alive():            # the main thread runs regions (and the SIGUSR2 handler)
            with ProfileRegion("serve"):
                time.sleep(0.005)
        trace = done["path"]
        assert os.path.basename(trace) == f"cuvil-pgc-{ctl.pid}.0.trace.json" and _mode(trace) == 0o600
        assert b'"serve"' in open(trace, "rb").read()
    finally:
        ctl.stop()


def test_capture_of_another_users_process_says_what_it_needs(monkeypatch):
    monkeypatch.setattr(capture, "process_owner", lambda pid: 0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(CuvilError, match=r"process 1 runs as root \(uid 0\)") as info:
        capture.request_capture(1, seconds=1, timeout=0.1)
    assert "sudo" in str(info.value) and "only root" in str(info.value)


@needs_root
def test_root_hands_its_request_to_the_processes_user(tmp_path, monkeypatch):
    """Root capturing another user's process: that user must be able to read (and trust) the request."""
    directory = tmp_path / "their-ctl"
    directory.mkdir(mode=0o700)
    os.chown(directory, OTHER_UID, OTHER_UID)
    pid = os.getpid()
    monkeypatch.setattr(capture, "process_owner", lambda p: OTHER_UID)
    seen = {}

    def serve():
        path = request_path(pid, str(directory))
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        st = os.lstat(path)
        seen.update(uid=st.st_uid, mode=stat.S_IMODE(st.st_mode))
        data = _control.read_control_file(path, {OTHER_UID, 0})
        os.unlink(path)
        trace = directory / f"cuvil-pgc-{pid}.0.trace.json"
        trace.write_bytes(b"{}")
        os.chown(trace, OTHER_UID, OTHER_UID)
        answer = done_path(pid, orjson.loads(data)["id"], str(directory))
        _control.write_control_file(answer, orjson.dumps({"trace": str(trace)}), owner=OTHER_UID)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert capture.request_capture(pid, seconds=0.1, directory=str(directory), timeout=20) == \
        str(directory / f"cuvil-pgc-{pid}.0.trace.json")
    thread.join()
    assert seen == {"uid": OTHER_UID, "mode": 0o600}


def test_root_finds_another_users_control_dir_in_its_environment(tmp_path):
    target = tmp_path / "their-ctl"
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                            env={**os.environ, "CUVIL_PGC_CONTROL_DIR": str(target)}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"     # its environment is in place once it runs
        assert capture._directory_of(proc.pid, os.geteuid()) == str(target)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("pid", ["abc", "0", "-1", "1.5"])
def test_capture_pid_must_be_a_positive_integer(pid):
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "capture", "--pid", pid],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--pid must be a process id" in result.stderr


@pytest.mark.slow
def test_capture_finds_the_default_per_user_directory_end_to_end(tmp_path):
    """A service and `cuvil-pgc capture` as separate processes, neither told where the channel is."""
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k != "CUVIL_PGC_CONTROL_DIR"}
    env.update(XDG_RUNTIME_DIR=str(runtime), CUVIL_PGC_ON_DEMAND="1")
    ready = tmp_path / "pid"
    worker = os.path.join(os.path.dirname(__file__), "_on_demand_worker.py")
    proc = subprocess.Popen([sys.executable, worker, str(ready), "30"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "capture", "--pid", str(proc.pid),
                                 "--seconds", "1"], capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        trace = result.stdout.strip()
        assert trace == str(runtime / "cuvil-pgc" / f"cuvil-pgc-{proc.pid}.0.trace.json")
        assert _mode(runtime / "cuvil-pgc") == 0o700 and _mode(trace) == 0o600
    finally:
        proc.kill()
        proc.wait()


def test_a_request_arriving_while_a_window_closes_waits_for_it(ctl, monkeypatch):
    """The watcher must not open a second window while the first one's trace is still being written."""
    from cuvil_pgc.instrument import session as session_mod

    ctl.start()
    stop = session_mod.Session.stop

    injected = []

    def slow_stop(self):
        if not injected:
            injected.append(_request(ctl, {"id": "bbb", "seconds": 0.2}))   # the next request lands mid-close
            time.sleep(0.4)                                                # several watcher polls
        return stop(self)

    monkeypatch.setattr(session_mod.Session, "stop", slow_stop)
    try:
        _request(ctl, {"id": "aaa", "seconds": 0.2})
        deadline = time.monotonic() + 30
        while not os.path.exists(done_path(ctl.pid, "bbb", ctl.directory)) and time.monotonic() < deadline:
            with ProfileRegion("serve"):
                time.sleep(0.005)
        monkeypatch.setattr(session_mod.Session, "stop", stop)
        answers = [orjson.loads(open(done_path(ctl.pid, i, ctl.directory), "rb").read()) for i in ("aaa", "bbb")]
        assert [os.path.basename(a.get("trace") or "") for a in answers] == \
            [f"cuvil-pgc-{ctl.pid}.0.trace.json", f"cuvil-pgc-{ctl.pid}.1.trace.json"], answers
        assert not ctl.failures.counts
    finally:
        monkeypatch.setattr(session_mod.Session, "stop", stop)
        ctl.stop()
