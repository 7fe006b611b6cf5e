"""Racing contenders in worker processes of their own (process_race) and whole-model plans there
(standalone, and the plan's decision from that race). Workers are real processes; nothing here
asserts on a timing."""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.measure import Samples
from cuvil_pgc.recompile.process_race import race_in_processes

needs_ort = pytest.mark.skipif(not __import__("importlib").util.find_spec("onnxruntime"), reason="needs onnxruntime")


def _worker(body: str) -> list[str]:
    """A worker command: ``body`` sets ``call`` up, then the worker serves it."""
    return [sys.executable, "-c", f"from cuvil_pgc.recompile.process_race import serve\n{body}\nserve(call)"]


def test_each_contender_gets_its_replicas_samples_pooled():
    samples, failed = race_in_processes({"a": _worker("call = lambda: None"), "b": _worker("call = lambda: sum(range(50))")},
                                        rounds=3, replicas=2)
    assert failed == {}
    assert set(samples) == {"a", "b"}
    # 4 workers: whole cycles of 4 balanced orders, one sample per worker per round, two workers each
    assert [len(s.seconds) for s in samples.values()] == [8, 8]
    assert all(x > 0 for s in samples.values() for x in s.seconds)
    assert [len(s.processes) for s in samples.values()] == [2, 2]       # each worker's median
    assert all(min(s.seconds) <= p <= max(s.seconds) for s in samples.values() for p in s.processes)


def test_a_worker_that_fails_to_start_takes_its_contender_out_with_its_reason():
    samples, failed = race_in_processes({"good": _worker("call = lambda: None"),
                                         "bad": _worker("raise SystemExit('cannot read plan0.onnx: truncated')")},
                                        rounds=2, replicas=2)
    assert set(samples) == {"good"}
    assert failed == {"bad": "cannot read plan0.onnx: truncated"}


def test_a_worker_that_crashes_while_setting_up_is_named_with_its_signal():
    """A native crash (an AOTInductor package did this on an H200) is the signal, not the last
    line the worker happened to print."""
    body = "import os, signal, sys; print('UserWarning: something harmless', file=sys.stderr, flush=True); " \
           "os.kill(os.getpid(), signal.SIGSEGV)"
    samples, failed = race_in_processes({"crashy": _worker(body), "good": _worker("call = lambda: None")},
                                        rounds=2, replicas=1)
    assert set(samples) == {"good"}
    assert failed["crashy"].startswith("it crashed (SIGSEGV); its last message: ")   # (faulthandler's, if on)


def test_a_contender_that_fails_in_one_replica_has_its_other_replicas_stopped_before_the_race(tmp_path):
    """The first replica sets up fine, the second fails: the first must not idle beside the race
    (it is killed: its exit handler never runs), and the contender is out with the reason."""
    claim, exited = tmp_path / "claimed", tmp_path / "exited"
    body = (f"import atexit, os, time\n"
            f"try:\n    os.close(os.open({str(claim)!r}, os.O_CREAT | os.O_EXCL))\n"
            f"except FileExistsError:\n    time.sleep(0.5)\n    raise SystemExit('the second replica fails')\n"
            f"atexit.register(lambda: open({str(exited)!r}, 'w').close())\ncall = lambda: None")
    samples, failed = race_in_processes({"flaky": _worker(body), "good": _worker("call = lambda: None")},
                                        rounds=2, replicas=2)
    assert set(samples) == {"good"} and failed == {"flaky": "the second replica fails"}
    assert claim.exists() and not exited.exists()


def test_a_worker_that_never_says_ready_is_stopped_after_the_setup_timeout():
    samples, failed = race_in_processes({"slow": _worker("import time; time.sleep(60); call = None")},
                                        rounds=2, replicas=1, setup_timeout_s=0.5)
    assert samples == {}
    assert "not set up within" in failed["slow"]


def test_what_a_contender_prints_does_not_garble_the_replies():
    samples, failed = race_in_processes({"chatty": _worker("call = lambda: print('0.5 noise')")}, rounds=2, replicas=1)
    assert failed == {} and len(samples["chatty"].seconds) == 2


def test_workers_end_side_by_side_at_once_when_the_race_is_over(tmp_path):
    """Every worker's input closes before any is waited for, and serve ends its process without the
    interpreter's teardown (its exit handler never runs: a torch worker's took up to 0.9 s of CPU).
    Each worker here ends only once it has seen all three workers' inputs end (or after 10 s):
    waiting for one before closing the next would leave the first waiting alone."""
    import textwrap

    body = textwrap.dedent(f"""
        import atexit, os, time
        here = {str(tmp_path)!r}
        def ended():
            return len([f for f in os.listdir(here) if f.startswith("ended")])
        atexit.register(lambda: open(os.path.join(here, f"teardown{{os.getpid()}}"), "w").close())
        real_exit = os._exit
        def at_end(status):
            open(os.path.join(here, f"ended{{os.getpid()}}"), "w").close()
            deadline = time.monotonic() + 10
            while ended() < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
            open(os.path.join(here, f"saw{{ended()}}-{{os.getpid()}}"), "w").close()
            real_exit(status)
        os._exit = at_end
        call = lambda: None""")
    samples, failed = race_in_processes({"a": _worker(body)}, rounds=2, replicas=3)
    assert failed == {} and len(samples["a"].processes) == 3
    names = os.listdir(tmp_path)
    assert sorted(n.split("-")[0] for n in names if n.startswith("saw")) == ["saw3"] * 3, names
    assert not [n for n in names if n.startswith("teardown")]


def test_a_worker_that_dies_mid_race_ends_the_race_loudly():
    body = "import os\nn = [0]\ndef call():\n    n[0] += 1\n    if n[0] > 8: os._exit(3)"
    with pytest.raises(RuntimeError, match="stopped answering"):
        race_in_processes({"dies": _worker(body)}, rounds=50, replicas=1)


_SIBLINGS_STOPPED = """
import os
n = [0]
real_exit = os._exit
def at_end(status):   # serve ends the process here once its input closes (no kill)
    open(os.path.join(MARKS, str(os.getpid())), "w").close()
    real_exit(status)
os._exit = at_end
def siblings():       # this race's other workers (the test process may have other children)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            command = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rpartition(")")[2].split()[:2]
        if int(ppid) == os.getppid() and int(pid) != os.getpid() and MARKS in command:
            yield pid, state
def call():
    n[0] += 1
    if n[0] > 5:       # past the warm-up, when every worker is set up: each other one stands stopped
        running = [(pid, state) for pid, state in siblings() if state not in "TtZX"]
        if running:
            raise SystemExit(f"workers not stopped during this one's sample: {running}")
"""


@pytest.mark.skipif(not (os.path.isdir("/proc/self") and hasattr(os, "waitid")), reason="reads process states in /proc")
def test_idle_workers_stand_stopped_while_another_takes_its_sample_and_end_cleanly(tmp_path):
    """A worker's thread pools spin on after its sample (see process_race's docstring): every other
    worker is stopped while one is timed, and each is resumed to end on its own (no kill)."""
    body = f"MARKS = {str(tmp_path)!r}" + _SIBLINGS_STOPPED
    samples, failed = race_in_processes({"a": _worker(body), "b": _worker(body)}, rounds=4, replicas=2)
    assert failed == {} and [len(s.seconds) for s in samples.values()] == [8, 8]
    assert len(os.listdir(tmp_path)) == 4          # every worker ended on its own: none was killed


_KILLED_MID_RACE = """
import subprocess, sys, signal, os
worker = subprocess.Popen([sys.executable, "-c", "from cuvil_pgc.recompile.process_race import serve; serve(lambda: None)"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
assert worker.stdout.readline().strip() == "ready"
os.kill(worker.pid, signal.SIGSTOP)            # as the race leaves an idle worker
print(worker.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)           # the racing process dies mid-race
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_stopped_worker_does_not_outlive_a_racing_process_killed_mid_race():
    import subprocess
    import time

    racer = subprocess.Popen([sys.executable, "-c", _KILLED_MID_RACE], stdout=subprocess.PIPE, text=True)
    pid = int(racer.stdout.readline())
    racer.wait(timeout=60)
    try:
        deadline = time.monotonic() + 30          # liveness, not a timing: it is gone at once, or never
        while _state(pid) not in ("Z", "X") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(pid) in ("Z", "X")
    finally:
        if _state(pid) not in ("Z", "X"):
            os.kill(pid, 9)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return "X"


# ----------------------------------------------------------------------------- standalone plans

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _realized_ort(knobs=()):
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.candidates import Candidate

    torch.manual_seed(0)
    model, inputs = Mlp().eval(), (torch.randn(2, 16),)
    cand = Candidate("", "ort", knobs=tuple(knobs))
    scope_inputs = ScopeInputs(inputs)
    realized = realize(model, cand, scope_inputs)
    return model, inputs, cand, realized, scope_inputs


@needs_ort
def test_a_whole_model_runtime_plan_races_in_workers_that_rebuild_it_as_load_build_does():
    from cuvil_pgc.recompile.standalone import race_standalone, standalone_spec

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    *_, basic, realized_basic, _ = _realized_ort([("opt", "basic")])
    specs = {"default": standalone_spec(cand, realized, scope_inputs, "cpu"),
             "basic": standalone_spec(basic, realized_basic, scope_inputs, "cpu")}
    assert specs["default"]["outputs"] is not None and specs["default"]["threads"] == torch.get_num_threads()
    with torch.no_grad():
        reference = model(*inputs)
    samples, failed = race_standalone(specs, inputs, {"default": reference, "basic": reference}, rounds=2, replicas=1)
    assert failed == {}
    assert set(samples) == {"default", "basic"} and all(len(s.seconds) == 2 for s in samples.values())
    # each worker checks its own plan's output: one whose region answers differently refuses to race
    samples, failed = race_standalone(specs, inputs, {"default": reference, "basic": reference + 1.0},
                                      rounds=2, replicas=1)
    assert set(samples) == {"default"} and "differ from the searching process's" in failed["basic"]


@needs_ort
def test_only_whole_model_cpu_artifacts_with_a_written_down_output_race_alone():
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.standalone import standalone_spec

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    assert standalone_spec(cand, realized, scope_inputs, "cpu") is not None
    assert standalone_spec(cand, realized, scope_inputs, "cuda") is None
    assert standalone_spec(Candidate("a", "ort"), realized, scope_inputs, "cpu") is None     # a sub-region
    assert standalone_spec(Candidate("", "compile"), realized, scope_inputs, "cpu") is None  # needs the model's code
    # a load check rebuilds a region of any scope on any device
    assert standalone_spec(cand, realized, scope_inputs, "cuda", check=True) is not None
    assert standalone_spec(Candidate("a", "ort"), realized, scope_inputs, "cpu", check=True) is not None
    assert standalone_spec(Candidate("a", "compile"), realized, scope_inputs, "cpu", check=True) is None
    realized.module.compiled.template = None                   # an output structure not learnt yet
    assert standalone_spec(cand, realized, scope_inputs, "cpu") is None


@needs_ort
def test_an_output_structure_that_cannot_be_written_down_races_as_a_tuple_of_its_tensors():
    """A Hugging Face-like output (a class pytree cannot serialize): the worker's region returns the
    same tensors as one tuple, in the order the reference's tensors come (what it checks)."""
    from dataclasses import dataclass

    from cuvil_pgc.recompile.object_outputs import output_tensors
    from cuvil_pgc.recompile.output_template import OutputTemplate
    from cuvil_pgc.recompile.standalone import standalone_spec

    @dataclass
    class Out:
        logits: torch.Tensor
        hidden: torch.Tensor

    torch.utils._pytree.register_dataclass(Out)
    model, inputs, cand, realized, scope_inputs = _realized_ort()
    a, b = torch.ones(2, 4), torch.zeros(3)
    realized.module.compiled.template = OutputTemplate.of(Out(a, b))
    assert realized.module.compiled.template.to_json() is None
    spec = standalone_spec(cand, realized, scope_inputs, "cpu")
    assert spec["outputs"] is None
    worker_template = OutputTemplate.from_json(spec["flat_outputs"])
    built = worker_template.build([a, b])
    assert isinstance(built, tuple) and output_tensors(built) == output_tensors(Out(a, b)) == [a, b]


class _FakeSearch:
    """What the plan's deployed decision reads of a running search."""

    def __init__(self):
        from cuvil_pgc.recompile.apply import ScopeInputs
        from cuvil_pgc.recompile.trials import SearchOptions

        self.inputs = (torch.randn(2, 16),)
        self.scope_inputs = {"": ScopeInputs(self.inputs)}
        self.opt = SearchOptions(deployed_race=True)


def _decide(monkeypatch, deployed: dict[str, list[float]] | Exception, winner: str = "model",
            failed: dict[str, str] | None = None):
    """The plan's deployed decision among three whole-model plans, the worker race faked."""
    from cuvil_pgc.recompile import standalone
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.plan import _deployed_winner
    from cuvil_pgc.recompile.trials import SearchResult

    def fake_race(specs, inputs, references, rounds, replicas=2):
        assert set(references) == set(specs)
        assert set(specs) == {"model", "<model>::ort", "<model>::openvino"}
        if isinstance(deployed, Exception):
            raise deployed
        return {k: v if isinstance(v, Samples) else Samples(k, v) for k, v in deployed.items()}, failed or {}

    monkeypatch.setattr(standalone, "race_standalone", fake_race)
    monkeypatch.setattr(standalone, "standalone_spec", lambda cand, realized, si, device: {"config": cand.config})
    plans = {"model": {"": Candidate("", "ort", knobs=(("opt", "basic"),))}, "<model>::ort": {"": Candidate("", "ort")},
             "<model>::openvino": {"": Candidate("", "openvino")}, "regions": {"a": Candidate("a", "aoti")}}
    built = {name: ({"": None}, nn.Identity()) for name in plans}
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    return _deployed_winner(_FakeSearch(), result, plans, built, winner, ["<model>::ort", "<model>::openvino"]), result


def test_the_race_in_processes_decides_between_whole_model_plans(monkeypatch):
    rng = random.Random(0)

    def noisy(ms):                      # 40 rounds with 5% noise around ``ms``
        return [ms * 1e-3 * (1 + rng.uniform(-0.05, 0.05)) for _ in range(40)]

    chosen, result = _decide(monkeypatch, {"model": noisy(1.2), "<model>::ort": noisy(1.2),
                                           "<model>::openvino": noisy(1.0)})
    assert chosen == "<model>::openvino"
    assert set(result.deployed_medians_us) == {"model", "<model>::ort", "<model>::openvino"}
    # a lead the race cannot tell from noise goes to the runtime default
    chosen, _ = _decide(monkeypatch, {"model": noisy(1.0), "<model>::ort": noisy(1.001), "<model>::openvino": noisy(1.3)})
    assert chosen == "<model>::ort"


def test_a_lead_that_not_every_worker_process_shows_goes_to_the_runtime_default(monkeypatch):
    """A process's memory layout alone moves a contender by a few percent: pooled, one slow default
    process makes a plan look faster with confidence. The plan must beat the default in every
    process (with three each, a one-sided rank test at 5%)."""
    rng = random.Random(1)

    def processes(*ms):                 # 20 samples per process, 1% noise around each process's ``ms``
        seconds = [[m * 1e-3 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20)] for m in ms]
        return [x for xs in seconds for x in xs], [sorted(xs)[10] for xs in seconds]

    plan_s, plan_p = processes(1.00, 1.00, 1.04)
    default_s, default_p = processes(1.03, 1.03, 1.12)      # pooled: the plan leads by 3%
    race = {"model": Samples("model", plan_s, plan_p), "<model>::ort": Samples("<model>::ort", default_s, default_p),
            "<model>::openvino": Samples("<model>::openvino", *processes(1.3, 1.3, 1.3))}
    chosen, result = _decide(monkeypatch, race)
    assert result.deployed_medians_us["model"] < result.deployed_medians_us["<model>::ort"]
    assert chosen == "<model>::ort"
    plan_s, plan_p = processes(1.00, 1.00, 1.01)               # faster in every process
    race["model"] = Samples("model", plan_s, plan_p)
    chosen, _ = _decide(monkeypatch, race)
    assert chosen == "model"


def test_the_searching_process_decides_where_the_race_in_processes_cannot(monkeypatch):
    from cuvil_pgc.recompile.plan import _loadable_winner

    fast, slow = [1.0e-3] * 20, [1.2e-3] * 20
    # the winner's own workers failed: nothing to compare it with, and it does not ship (a
    # deployment's process would fail as its workers did): the next fastest in this process does
    chosen, result = _decide(monkeypatch, {"<model>::ort": fast, "<model>::openvino": slow},
                             failed={"model": "cannot load"})
    assert chosen == "model" and result.deployed_medians_us == {}
    assert result.unloadable == {"model": "<model>: a process of its own could not load and run it: cannot load"}
    medians = {"eager": 3.0, "model": 1.0, "<model>::openvino": 1.1, "<model>::ort": 1.2}
    assert _loadable_winner(_FakeSearch(), result, {}, {}, medians, "model") == "<model>::openvino"
    chosen, _ = _decide(monkeypatch, RuntimeError("a race worker stopped answering"))
    assert chosen == "model"
    # a composite plan needs the model's code: no race in processes
    chosen, _ = _decide(monkeypatch, {"model": slow, "<model>::ort": fast, "<model>::openvino": fast},
                        winner="regions")
    assert chosen == "regions"


@needs_ort
def test_the_final_race_sends_whole_model_plans_to_worker_processes():
    """The plan's final race, with two real ONNX Runtime plans: the race in processes of their own
    ran both (which one wins is the machine's business) and the winner is one of them."""
    from types import SimpleNamespace

    from cuvil_pgc.recompile.plan import _final_race
    from cuvil_pgc.recompile.trials import SearchOptions, SearchResult

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    *_, basic, realized_basic, _ = _realized_ort([("opt", "basic")])
    plans = {"model": {"": basic}, "<model>::ort": {"": cand}}
    built = {"model": ({"": realized_basic}, realized_basic.module), "<model>::ort": ({"": realized}, realized.module)}
    s = SimpleNamespace(model=model, inputs=inputs, scope_inputs={"": scope_inputs},
                        opt=SearchOptions(rounds=5, deployed_race=True))
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    _final_race(s, result, plans, built, allow_eager=False, defaults=["<model>::ort"])   # eager may beat a tiny MLP
    assert set(result.deployed_medians_us) == {"model", "<model>::ort"}
    assert result.choices in (plans["model"], plans["<model>::ort"])
    s.opt.deployed_race = False
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    _final_race(s, result, plans, built, allow_eager=False, defaults=["<model>::ort"])
    assert result.deployed_medians_us == {}


def mlp_factory():
    """``tests.test_process_race:mlp_factory``: the model of :func:`_realized_ort`, as a worker makes it."""
    torch.manual_seed(0)
    return Mlp().eval(), (torch.randn(2, 16),)


def other_weights_factory():
    torch.manual_seed(1)
    return Mlp().eval(), (torch.randn(2, 16),)


@needs_ort
def test_eager_from_the_model_s_factory_races_in_processes_and_gives_the_build_s_figures():
    """In the searching process the backends' thread pools share the cores, so its eager figure
    and the plan's can be far from what each runs at deployed: with the model's MODULE:FACTORY,
    eager races in processes of its own beside the plans, and the build's figures come from there."""
    from types import SimpleNamespace

    from cuvil_pgc.recompile.plan import _final_race
    from cuvil_pgc.recompile.trials import SearchOptions, SearchResult

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    *_, basic, realized_basic, _ = _realized_ort([("opt", "basic")])
    plans = {"model": {"": basic}, "<model>::ort": {"": cand}}
    built = {"model": ({"": realized_basic}, realized_basic.module), "<model>::ort": ({"": realized}, realized.module)}
    s = SimpleNamespace(model=model, inputs=inputs, scope_inputs={"": scope_inputs},
                        opt=SearchOptions(rounds=5, deployed_race=True, model_ref="tests.test_process_race:mlp_factory"))
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    _final_race(s, result, plans, built, allow_eager=False, defaults=["<model>::ort"])
    deployed = result.deployed_medians_us
    assert set(deployed) == {"model", "<model>::ort", "eager"}
    shipped = next(name for name in plans if plans[name] == result.choices)
    assert (result.baseline_us, result.plan_us) == (deployed["eager"], deployed[shipped])
    assert set(result.final_medians_us) == {"eager", "model", "<model>::ort"}       # this process's, kept

    s.opt.model_ref = "tests.test_process_race:other_weights_factory"     # not the model searched: its eager does not race
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    _final_race(s, result, plans, built, allow_eager=False, defaults=["<model>::ort"])
    assert set(result.deployed_medians_us) == {"model", "<model>::ort"} and result.unloadable == {}
    assert result.baseline_us == result.final_medians_us["eager"]


@needs_ort
def test_a_worker_that_cannot_rebuild_the_output_structure_returns_the_tensors_as_a_tuple():
    """In the worker the structure's class may not be imported (a ``ModelOutput`` of a library the
    model imports): the region then returns the flat tuple."""
    from cuvil_pgc.recompile.standalone import region, standalone_spec

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    spec = standalone_spec(cand, realized, scope_inputs, "cpu")
    unknown = {**spec["outputs"], "spec": spec["outputs"]["spec"].replace("null", '"no.such.Output"', 1)}
    with torch.no_grad():
        out = region({**spec, "outputs": unknown})(*inputs)
        assert isinstance(out, tuple) and len(out) == 1          # ONNX Runtime's GEMM rounds as it does,
        torch.testing.assert_close(out[0], model(*inputs))       # not bit for bit as torch's
        torch.testing.assert_close(region(spec)(*inputs), model(*inputs))


class HfLike(nn.Module):
    """Returns a Hugging Face ``ModelOutput``, as most imported models do."""

    def __init__(self, output_class):
        super().__init__()
        self.a, self.output_class = nn.Linear(16, 8), output_class

    def forward(self, x):
        return self.output_class(last_hidden_state=torch.tanh(self.a(x)))


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_plan_returning_a_model_output_races_in_its_worker():
    """The package's output structure names transformers' class; the worker imports the modules of
    the output's classes first. Before, it failed to load ("... in pytree is not registered") and
    GPT-2's AOTInductor plan never raced as deployed."""
    outputs = pytest.importorskip("transformers.modeling_outputs")
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.standalone import _output_modules, race_standalone, standalone_spec

    torch.manual_seed(0)
    model, inputs = HfLike(outputs.BaseModelOutput).eval(), (torch.randn(2, 16),)
    cand, scope_inputs = Candidate("", "aoti"), ScopeInputs(inputs)
    realized = realize(model, cand, scope_inputs)
    with torch.no_grad():
        reference = model(*inputs)
    assert _output_modules(reference) == ["transformers.modeling_outputs"]
    spec = standalone_spec(cand, realized, scope_inputs, "cpu")
    samples, failed = race_standalone({"aoti": spec}, inputs, {"aoti": reference}, rounds=2, replicas=1)
    assert failed == {} and len(samples["aoti"].seconds) == 2


# ----------------------------------------------------------------------------- load checks

@needs_ort
def test_a_fresh_process_rebuilds_the_region_from_its_artifact_and_a_crash_is_named(tmp_path):
    """The load check's worker is real: it rebuilds the ONNX Runtime region from its file and
    answers; a worker that dies of a signal (as AOTInductor CUDA packages killed fresh processes
    on an H200) or fails is named, and a region answering otherwise than here fails too."""
    from cuvil_pgc.recompile.standalone import fresh_process_failures, standalone_spec

    model, inputs, cand, realized, scope_inputs = _realized_ort()
    specs = {"": standalone_spec(cand, realized, scope_inputs, "cpu", check=True)}
    with torch.no_grad():
        reference = model(*inputs)
    assert fresh_process_failures(specs, {"": inputs}, {"": reference}) == {}
    assert "differ from the searching process's" in fresh_process_failures(specs, {"": inputs},
                                                                          {"": reference + 1.0})[""]
    crasher = tmp_path / "python"
    crasher.write_text("#!/bin/sh\nkill -SEGV $$\n")
    crasher.chmod(0o755)
    why = fresh_process_failures(specs, {"": inputs}, {"": reference}, python=str(crasher))[""]
    assert "crashed (SIGSEGV)" in why


def test_a_winning_plan_a_fresh_process_cannot_load_does_not_ship(monkeypatch):
    """The fastest plan whose artifacts crash a fresh process loses to the next fastest; its
    reason goes into plan.json and the console's plan caption."""
    from cuvil_pgc.recompile import plan as plan_module
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.plan_doc import Plan
    from cuvil_pgc.recompile.trials import SearchResult
    from cuvil_pgc.viewer.console_recompile import plan_view

    crash = "a process of its own that loaded it crashed (SIGSEGV), as a deployment loading the build would"
    checked = []

    def fake_failures(s, choices, realized):
        checked.append(next(iter(choices.values())).config)
        return {"": crash} if choices == plans["<model>::aoti+freezing"] else {}

    monkeypatch.setattr(plan_module, "_fresh_process_failures", fake_failures)
    plans = {"<model>::aoti+freezing": {"": Candidate("", "aoti", freezing=True)},
             "<model>::ort": {"": Candidate("", "ort")}}
    built = {name: ({"": None}, nn.Identity()) for name in plans}
    medians = {"eager": 3.0, "<model>::aoti+freezing": 1.0, "<model>::ort": 2.0}
    result = SearchResult(trials={}, features={}, matches=None, scope_inputs={})
    search = _FakeSearch()
    assert plan_module._loadable_winner(search, result, plans, built, medians, "<model>::aoti+freezing") \
        == "<model>::aoti+freezing" and checked == []      # on the CPU: no check (see its docstring)
    search.opt.device = "cuda"
    chosen = plan_module._loadable_winner(search, result, plans, built, medians, "<model>::aoti+freezing")
    assert chosen == "<model>::ort" and checked == ["aoti+freezing", "ort"]
    assert result.unloadable == {"<model>::aoti+freezing": f"<model>: {crash}"}
    # a plan the race in processes of its own ran is not loaded again; eager has nothing to load
    checked.clear()
    result.deployed_medians_us = {"<model>::ort": 2.0}
    assert plan_module._loadable_winner(search, result, plans, built, medians, "<model>::ort") == "<model>::ort"
    assert plan_module._loadable_winner(search, result, plans, built, medians, "eager") == "eager"
    assert checked == []
    plan = Plan(unloadable=result.unloadable)
    assert Plan.from_json(plan.to_json()).unloadable == result.unloadable
    assert "unloadable" not in Plan().to_json()
    assert "crashed (SIGSEGV)" in plan_view(plan, "build.cuvilpkg").caption
