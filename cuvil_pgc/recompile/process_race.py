"""Timing contenders each in worker processes of their own, the way each is deployed.

A long-lived process that searched, exported and compiled is not where a build runs: inside it,
two ONNX Runtime sessions of the same ``.onnx`` measured up to 25% apart (the one made early in a
search against one made after it), and zoo dwcnn's ``ort+rewrite`` beat ONNX Runtime's default
there with confidence, then ran 6% behind it in processes of their own. Where such a choice
matters, :func:`race_in_processes` decides it again as deployed.

Each contender is a command that sets it up in a fresh process and hands a zero-argument call to
:func:`serve`. The parent starts ``replicas`` processes per contender (a process's memory layout
alone moved one contender by up to 4%; more processes average that out, more rounds do not) and,
once all are ready, takes one sample per worker per round in the balanced orders of
:func:`~.measure.time_interleaved`, so drifts of the machine hit every contender alike. A sample
is as many calls as last at least :data:`MIN_SAMPLE_S`: a worker wakes from its pipe read on a
cold core, and with samples of one call every contender measured ~1.7x slower and two processes
of one contender up to 19% apart (5 ms: within 1-4%).

Between its samples a worker is stopped (SIGSTOP, where the platform has it): thread pools spin
on after a run returns (ONNX Runtime's intra-op threads, OpenVINO's, OpenMP's), and a deployment
has no other process whose spinning takes the cores from it. Without the stop, a 2-layer GRU
tagger at 2 threads on 2 cores measured, against each contender timed alone in its process:
AOTInductor 1.374 ms (alone 0.358), OpenVINO 0.568 (0.360), eager 2.421 (1.552), ONNX Runtime
0.301 (0.240); with it 0.389, 0.442, 1.539 and 0.266. At one thread the figures did not move.

Protocol: the worker writes ``ready`` when set up; each line ``N`` it reads runs N calls and it
replies the seconds they took. Its replies go to a private copy of stdout: a library that prints
to stdout cannot garble them.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from cuvil_pgc.recompile.measure import Samples, balanced_orders, median, whole_cycles

MIN_SAMPLE_S = 0.005
#: seconds a worker may take to set its contender up, and to answer one sample
SETUP_TIMEOUT_S = 600.0
SAMPLE_TIMEOUT_S = 120.0


def race_in_processes(commands: dict[str, list[str]], rounds: int, replicas: int = 3, *,
                      env: dict[str, str] | None = None, setup_timeout_s: float = SETUP_TIMEOUT_S,
                      sample_timeout_s: float = SAMPLE_TIMEOUT_S,
                      min_sample_s: float = MIN_SAMPLE_S) -> tuple[dict[str, Samples], dict[str, str]]:
    """Per-call samples of each contender, its ``replicas`` workers' samples pooled (at least
    ``rounds`` rounds, whole cycles of the balanced orders, each sample at least ``min_sample_s``
    long); and, for each contender that could not run, why (the last line its worker wrote to stderr). A contender runs whole or not at all:
    one failed worker takes its replicas out. A worker that stops answering mid-race ends the race
    for every contender (the samples so far would compare unequal rounds)."""
    workers: dict[str, subprocess.Popen[str]] = {}
    logs: dict[str, Any] = {}
    failed: dict[str, str] = {}
    try:
        for name, command in ((f"{k}#{i}", c) for k, c in commands.items() for i in range(replicas)):
            logs[name] = tempfile.TemporaryFile("w+")       # a pipe would fill with warnings and block the worker
            workers[name] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=logs[name], text=True, env=env)
        deadline = time.monotonic() + setup_timeout_s
        for name, proc in workers.items():
            contender = _contender(name)
            if contender in failed:
                continue
            reply = _readline(proc, max(deadline - time.monotonic(), 0.0))
            if reply is None:
                failed[contender] = f"it was not set up within {setup_timeout_s:.0f} s"
            elif reply.strip() != "ready":
                failed[contender] = _why(proc, logs[name], reply)
            else:
                _pause(proc)        # its warm-up's threads must not spin beside the others' setup and samples
        for name, proc in workers.items():       # a failed contender's other replicas must not run beside the race
            if _contender(name) in failed and proc.poll() is None:
                proc.kill()
        ready = {name: proc for name, proc in workers.items() if _contender(name) not in failed}
        if not ready:
            return {}, failed
        once = {name: _sample(proc, 1, sample_timeout_s) for name, proc in ready.items()}
        calls = max(1, math.ceil(min_sample_s / max(min(once.values()), 1e-7)))
        names = list(ready)
        orders = balanced_orders(len(names))
        pooled = {k: Samples(k) for k in dict.fromkeys(_contender(n) for n in names)}
        own: dict[str, list[float]] = {n: [] for n in names}
        for r in range(whole_cycles(rounds, len(names))):
            for i in orders[r % len(orders)]:
                own[names[i]].append(_sample(ready[names[i]], calls, sample_timeout_s) / calls)
                pooled[_contender(names[i])].seconds.append(own[names[i]][-1])
        for name, seconds in own.items():
            pooled[_contender(name)].processes.append(median(seconds))
        return pooled, failed
    finally:
        _stop_all(list(workers.values()))
        for log in logs.values():
            log.close()


def serve(call: Callable[[], Any], warmup: int = 5) -> None:
    """The worker's side: warm ``call`` up, say ``ready``, then time N calls per request line; when
    its input ends, end the process at once (``os._exit(0)``): nothing a worker holds needs tearing
    down, and the interpreter's teardown of torch and the runtimes took up to 0.9 s of CPU per
    worker, one worker after another, 9 s of a recompile's race of five contenders."""
    _die_with_parent()
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())        # anything else printed goes to stderr
    for _ in range(warmup):
        call()
    replies.write("ready\n")
    for line in sys.stdin:
        n = int(line)
        start = time.perf_counter()
        for _ in range(n):
            call()
        replies.write(f"{time.perf_counter() - start!r}\n")
    replies.flush()
    sys.stderr.flush()
    os._exit(0)


def _die_with_parent() -> None:
    """Where the kernel offers it (Linux), have this worker killed when the racing process dies: it
    stands stopped between samples (:func:`_pause`), where it cannot see its input close, and a
    racing process killed mid-race would leave it stopped for good."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _contender(worker: str) -> str:
    return worker.rpartition("#")[0]


def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str | None:
    """One line from the worker ("" once it has exited), or None when it sent none within
    ``timeout_s`` (it is then killed). One request is outstanding at a time, so no reply waits
    unseen in the pipe's read buffer."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        proc.kill()
        return None
    return proc.stdout.readline()


def _sample(proc: subprocess.Popen[str], calls: int, timeout_s: float) -> float:
    """Seconds ``calls`` calls took in the worker, which is resumed for them and stopped again after
    (:func:`_pause`)."""
    _resume(proc)
    proc.stdin.write(f"{calls}\n")
    proc.stdin.flush()
    reply = _readline(proc, timeout_s)
    try:
        seconds = float(reply or "")
    except ValueError:
        why = f"no answer within {timeout_s:.0f} s" if reply is None else exit_reason(proc.wait())
        raise RuntimeError(f"a race worker stopped answering ({why})") from None
    _pause(proc)
    return seconds


#: how long :func:`_pause` waits for a worker to stop (a signal takes microseconds to arrive)
PAUSE_TIMEOUT_S = 1.0


def _pause(proc: subprocess.Popen[str]) -> None:
    """Stop every thread of the idle worker until :func:`_resume` (see the module's docstring), and
    wait until it has stopped, so that the next worker's sample does not begin beside it. Where
    the platform has no SIGSTOP the worker idles as it is; without ``os.waitid`` it is not waited for."""
    if not hasattr(signal, "SIGSTOP") or proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGSTOP)
    if not hasattr(os, "waitid"):
        return
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    try:        # WSTOPPED alone: an exit is never reaped here, Popen keeps its status
        while os.waitid(os.P_PID, proc.pid, os.WSTOPPED | os.WNOHANG) is None and time.monotonic() < deadline:
            time.sleep(1e-4)
    except ChildProcessError:
        pass


def _resume(proc: subprocess.Popen[str]) -> None:
    if hasattr(signal, "SIGCONT") and proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)


def _why(proc: subprocess.Popen[str], log: Any, reply: str) -> str:
    """Why a worker did not say ready: the signal that killed it, else its last line on stderr,
    once it has exited."""
    if reply:
        proc.kill()
        return f"it answered {reply.strip()[:80]!r} instead of 'ready'"
    proc.wait()
    log.seek(0)
    lines = log.read().strip().splitlines()
    if proc.returncode < 0:     # a crash: its last line (a warning, often) is not why
        return f"it {exit_reason(proc.returncode)}" + (f"; its last message: {lines[-1][:200]}" if lines else "")
    return (lines[-1] if lines else f"it exited with status {proc.returncode} and no message")[:300]


def exit_reason(returncode: int) -> str:
    """A worker's exit as a user reads it: "crashed (SIGSEGV)" for a signal, else its exit status."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"crashed ({name})"


def _stop_all(procs: list[subprocess.Popen[str]], timeout_s: float = 30.0) -> None:
    """End every worker: close all their inputs first, then wait for each (killed after
    ``timeout_s`` in all), so that they end side by side rather than one after another."""
    for proc in procs:
        try:
            _resume(proc)           # a stopped worker would never read the end of its input
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
