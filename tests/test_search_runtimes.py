"""The search over runtime backends with measurements faked at their seam (``time_interleaved``) and
builds faked at ``realize``: the runtime defaults are always measured as baselines, and a search
reaches a mixed plan (different runtimes per region) on its own."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.recompile import candidates
from cuvil_pgc.recompile.apply import Realized
from cuvil_pgc.recompile.candidates import Candidate, RuntimeSpace
from cuvil_pgc.recompile.measure import Samples


def stats(path: str, mean_us: float, module: str) -> RegionStats:
    return RegionStats(path=path, calls=10, total_us=mean_us * 10, self_us=mean_us * 10, mean_us=mean_us,
                       p50_us=mean_us, p95_us=mean_us, p99_us=mean_us, share=0.5, hotness=mean_us * 10,
                       bottleneck="launch_overhead", confidence=0.9, evidence={"module": module})


class Tagged(nn.Module):
    """A fake build of ``key``: runs the original module and says it ran."""

    ran: list[str] = []

    def __init__(self, inner: nn.Module, key: str) -> None:
        super().__init__()
        self.inner, self.key = inner, key

    def forward(self, *args, **kwargs):
        Tagged.ran.append(self.key)
        return self.inner(*args, **kwargs)


def fake_measurements(monkeypatch, eager_ms: dict[str, float], ms: dict[str, float], other: float = 0.9,
                      final_ms: dict[str, float] | None = None):
    """Builds cost nothing; a candidate ``scope::config`` takes ``ms`` (else ``other`` x its scope's
    eager time; ``final_ms`` overrides it in the final race); a whole plan takes the model's eager
    time less what its regions save."""
    import cuvil_pgc.recompile.checked_build as checked_build
    import cuvil_pgc.recompile.plan as plan_mod
    import cuvil_pgc.recompile.search as search_mod

    built: list[str] = []

    def realize(module, cand, inputs, **kw):
        built.append(cand.key)
        return Realized(Tagged(module, cand.key))

    def cost(key: str) -> float:
        scope = key.split("::")[0].replace("<model>", "")
        return ms.get(key, other * eager_ms[scope])

    def plan_time(fn) -> float:
        Tagged.ran = []
        with torch.no_grad():
            fn()
        ran = set(Tagged.ran)
        whole = [k for k in ran if k.startswith("<model>::")]
        if whole:
            return (final_ms or {}).get(whole[0], cost(whole[0]))
        return eager_ms[""] - sum(eager_ms[k.split("::")[0]] - cost(k) for k in ran)

    def search_batch(fns, rounds=25, **kw):      # a scope's eager module and its candidates
        scopes = {k.split("::")[0].replace("<model>", "") for k in fns if "::" in k}
        eager = eager_ms[next(iter(scopes))] if scopes else eager_ms[""]
        return {k: Samples(k, [(eager if k == "eager" else cost(k)) / 1e3]) for k in fns}

    def final_race(fns, rounds=25, **kw):        # whole plans
        return {k: Samples(k, [(eager_ms[""] if k == "eager" else plan_time(fn)) / 1e3]) for k, fn in fns.items()}

    for mod in (checked_build, plan_mod):
        monkeypatch.setattr(mod, "realize", realize)
    monkeypatch.setattr(search_mod, "time_interleaved", search_batch)
    monkeypatch.setattr(plan_mod, "time_interleaved", final_race)
    monkeypatch.setattr(candidates.RuntimeSpace, "here",
                        classmethod(lambda cls, device="cpu": RuntimeSpace(("ort", "openvino"), False, 1)))
    return built


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_runtime_defaults_are_measured_as_baselines_outside_even_a_spent_budget(monkeypatch):
    """A budget with no room left (before: both defaults silently skipped, eager shipped) still
    measures ONNX Runtime and OpenVINO at their defaults; they are counted apart and can win."""
    from cuvil_pgc.recompile.plan_doc import plan_document
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    built = fake_measurements(monkeypatch, {"": 1.0}, {"<model>::ort": 0.4, "<model>::openvino": 0.6})
    torch.manual_seed(0)
    an = Analysis(regions=[stats("model", 300.0, "Mlp")])
    result = search(Mlp().eval(), (torch.randn(2, 16),), an,
                    options=SearchOptions(budget=1, backends=("aoti", "ort", "openvino"), rounds=3))
    assert set(built[:2]) == {"<model>::ort", "<model>::openvino"}
    assert result.measured == 1 and result.baselines_measured == 2       # the budget: eager alone
    assert {t.candidate.config: t.status for t in result.runtime_defaults} == {"ort": "ok", "openvino": "ok"}
    assert result.choices == {"": Candidate("", "ort")}
    plan = plan_document(result, device="cpu", model_hash="", rtol=None, atol=None, artifacts={})
    assert {d["config"]: d["measured_ms"] for d in plan.runtime_defaults} == {"ort": 0.4, "openvino": 0.6}
    assert plan.measured_candidates == 1


def test_a_runtime_left_out_of_the_space_is_logged_not_silently_skipped(monkeypatch, caplog):
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    fake_measurements(monkeypatch, {"": 1.0}, {"<model>::ort": 0.4})
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="cuvil_pgc.recompile.search"):
        result = search(Mlp().eval(), (torch.randn(2, 16),), Analysis(regions=[stats("model", 300.0, "Mlp")]),
                        options=SearchOptions(budget=3, backends=("aoti", "ort"), rounds=3))
    assert [t.candidate.config for t in result.runtime_defaults] == ["ort"]
    assert "OpenVINO at its defaults is not measured as a baseline" in caplog.text


class TwoPart(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x))


def test_a_search_reaches_a_mixed_plan_on_its_own(monkeypatch):
    """The encoder runs fastest on ONNX Runtime, the head on OpenVINO, the whole model on either is
    slower than both regions apart: the search's own plan is the mixed one."""
    import cuvil_pgc.recompile.search as search_mod
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    fake_measurements(monkeypatch, {"": 1.0, "enc": 0.45, "head": 0.45},
                      {"enc::ort": 0.15, "enc::openvino": 0.3, "head::openvino": 0.1, "head::ort": 0.3,
                       "<model>::ort": 0.8, "<model>::openvino": 0.8})
    monkeypatch.setattr(search_mod, "MIN_EXPLORE", 10**6)     # no stop rule: every candidate is tried
    torch.manual_seed(0)
    an = Analysis(regions=[stats("model", 300.0, "TwoPart"), stats("model/model.enc", 140.0, "Sequential"),
                           stats("model/model.head", 140.0, "Sequential")])
    result = search(TwoPart().eval(), (torch.randn(2, 16),), an,
                    options=SearchOptions(budget=100, backends=("ort", "openvino"), rounds=3))
    assert result.choices == {"enc": Candidate("enc", "ort"), "head": Candidate("head", "openvino")}
    assert result.plan_us == pytest.approx(1000.0 - 300.0 - 350.0)
    assert {type(m).__name__ for n, m in result.module.named_children()} == {"Tagged"}


def test_the_profile_steers_the_runtime_knobs_and_keeps_the_space_bounded():
    """Overhead-bound scopes get ORT's basic level and one-thread runtimes, scopes with work the
    spinning and executor knobs, batched inputs OpenVINO's throughput hint; batch 1 keeps latency."""
    from cuvil_pgc.recompile.candidates import ScopeFeatures, scope_candidates

    def configs(label: str, threads: int = 2, batch: int = 1) -> set[str]:
        feats = ScopeFeatures(scope="", path="m", bottleneck=label, eager_us=500.0, labels=[label],
                              evidence={"batch": batch})
        return {c.config for c in scope_candidates(feats, runtimes=RuntimeSpace(("ort", "openvino"), False, threads))
                if c.backend in ("ort", "openvino")}

    small = configs("launch_overhead")
    assert {"ort+opt=basic", "ort+threads=1", "openvino+threads=1"} <= small
    assert not {"ort+spin=off", "ort+exec=parallel", "openvino+hint=throughput"} & small
    work = configs("compute")
    assert {"ort+spin=off", "ort+exec=parallel"} <= work and not {"ort+opt=basic", "ort+threads=1"} & work
    assert "openvino+hint=throughput" not in work                    # batch 1: the latency hint only
    assert "openvino+hint=throughput" in configs("compute", batch=8)
    assert "openvino+hint=throughput" not in configs("compute", threads=1, batch=8)
    assert not {"ort+threads=1", "openvino+threads=1"} & configs("launch_overhead", threads=1)
    assert max(len(configs(label, 4, 8)) for label in ("launch_overhead", "compute", "memory_bandwidth")) <= 8


def test_the_features_record_the_batch():
    from cuvil_pgc.recompile.apply import ScopeInputs
    from cuvil_pgc.recompile.features import scope_features

    feats = scope_features("", Mlp().eval(), ScopeInputs((torch.randn(4, 16),)), None, None, 1.0, 1.0)
    assert feats.evidence["batch"] == 4


def test_every_runtime_default_runs_in_the_final_race(monkeypatch):
    """The search measured OpenVINO's defaults 20 % and ONNX Runtime's 40 % behind AOTInductor (no
    near tie); both run in the final race, which finds OpenVINO faster: the build is OpenVINO, not
    the slower AOTInductor package."""
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    fake_measurements(monkeypatch, {"": 1.0}, {"<model>::aoti": 0.5, "<model>::openvino": 0.6, "<model>::ort": 0.7},
                      final_ms={"<model>::openvino": 0.4})
    monkeypatch.setattr("cuvil_pgc.recompile.search.MIN_EXPLORE", 10**6)
    torch.manual_seed(0)
    result = search(Mlp().eval(), (torch.randn(2, 16),), Analysis(regions=[stats("model", 300.0, "Mlp")]),
                    options=SearchOptions(budget=100, backends=("aoti", "ort", "openvino"), rounds=3))
    assert result.trials["<model>::aoti"].status == "ok"
    assert {"<model>::openvino", "<model>::ort"} <= set(result.final_medians_us)
    assert result.choices == {"": Candidate("", "openvino")}


@pytest.mark.parametrize(("tuned_factor", "ships"), [(0.99, "<model>::ort"), (0.80, "tuned")])
def test_a_plan_must_beat_the_runtime_default_with_confidence_to_ship(monkeypatch, tuned_factor, ships):
    """The final race ships the fastest runtime at its defaults unless a plan's speedup over it is
    significant (bootstrap 95% CI above 1): a 1% lead within the round-to-round spread is a tie."""
    from types import SimpleNamespace

    import cuvil_pgc.recompile.plan as plan_mod

    spread = [1.00, 1.04, 0.97, 1.02, 0.99, 1.03, 0.98, 1.01] * 5
    rotated = spread[3:] + spread[:3]

    def race(fns, rounds=25, **kw):
        return {"eager": Samples("eager", [2e-3] * len(spread)),
                "<model>::ort": Samples("<model>::ort", [1e-3 * x for x in spread]),
                "tuned": Samples("tuned", [1e-3 * tuned_factor * x for x in rotated])}

    monkeypatch.setattr(plan_mod, "time_interleaved", race)
    default, tuned = Candidate("", "ort"), Candidate("", "ort", knobs=(("opt", "extended"),))
    plans = {"<model>::ort": {"": default}, "tuned": {"": tuned}}
    built = {name: ({}, nn.Identity()) for name in plans}
    s = SimpleNamespace(model=nn.Identity(), inputs=(torch.zeros(1),), opt=SimpleNamespace(rounds=3))
    result = SimpleNamespace()
    plan_mod._final_race(s, result, plans, built, defaults=["<model>::ort"])
    assert result.choices == plans[ships]
    assert result.plan_us == pytest.approx(result.final_medians_us[ships])


@pytest.mark.parametrize("rule", [True, False])
def test_cuda_graphs_are_measured_on_a_launch_bound_scope_whatever_their_prior(monkeypatch, rule):
    """The cost models predict CUDA graphs far slower than eager (their prior, as on the H200 where
    they were 15 % slower for a model they ran 2.3x faster): on a launch-bound scope the stop
    rule still keeps them until one is measured; without that rule they are never tried."""
    import cuvil_pgc.recompile.search as search_mod
    from cuvil_pgc.recompile import cost_models
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    fake_measurements(monkeypatch, {"": 1.0}, {"<model>::cudagraphs": 0.3})
    monkeypatch.setitem(cost_models.PRIORS["fixed_us"], "cudagraphs", 5000.0)
    if not rule:
        monkeypatch.setattr(search_mod, "untried_remedy", lambda *args: False)
    torch.manual_seed(0)
    result = search(Mlp().eval(), (torch.randn(2, 16),), Analysis(regions=[stats("model", 300.0, "Mlp")]),
                    options=SearchOptions(budget=6, device="cuda", backends=("aoti", "compile", "cudagraphs"),
                                          rounds=3))
    measured = {k for k, t in result.trials.items() if t.status == "ok"}
    assert ("<model>::cudagraphs" in measured) is rule
    assert (result.choices == {"": Candidate("", "cudagraphs", mode="reduce-overhead")}) is rule


def test_only_cuda_graphs_on_a_launch_bound_scope_not_yet_measured_there_are_kept():
    from cuvil_pgc.recompile.candidates import ScopeFeatures
    from cuvil_pgc.recompile.search_policy import untried_remedy
    from cuvil_pgc.recompile.trials import Trial

    graphs = Candidate("", "cudagraphs", mode="reduce-overhead")
    launch = ScopeFeatures(scope="", path="model", bottleneck="launch_overhead", eager_us=300.0, labels=["host_bound"])
    compute = ScopeFeatures(scope="", path="model", bottleneck="compute", eager_us=300.0, labels=["compute"])
    assert untried_remedy(graphs, launch, []) and not untried_remedy(graphs, compute, [])
    assert not untried_remedy(Candidate("", "aoti"), launch, [])
    other_scope = Trial(Candidate("head", "cudagraphs", mode="reduce-overhead"), 1.0, "ok", 1.0)
    assert untried_remedy(graphs, launch, [other_scope])
    failed_here = Trial(Candidate("", "cudagraphs", mode="reduce-overhead", rewrite=True), 1.0, "compile_error")
    assert not untried_remedy(graphs, launch, [failed_here])


class Faint(nn.Module):
    """A head whose answers are all far below the guard's atol (a randomly initialized depth head
    answered 7.9e-8 at most): zeros in their place pass the guard."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.body, self.scale = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)), scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


@pytest.mark.parametrize("scale, blind", [(1e-7, True), (1.0, False)])
def test_reduced_precision_is_not_built_where_the_guard_cannot_see_the_outputs(monkeypatch, caplog, scale, blind):
    """OpenVINO's bf16 passed a depth model's guard that any answer would have passed."""
    from cuvil_pgc.recompile.accuracy import blind_scale
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    fake_measurements(monkeypatch, {"": 1.0}, {"<model>::openvino+bf16": 0.3})
    monkeypatch.setattr(candidates.RuntimeSpace, "here",      # a CPU that runs bf16 natively
                        classmethod(lambda cls, device="cpu": RuntimeSpace(("ort", "openvino"), True, 1)))
    torch.manual_seed(0)
    model, x = Faint(scale).eval(), torch.randn(2, 16)
    with torch.no_grad():
        assert (blind_scale(model(x)) is not None) == blind
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.search"):
        result = search(model, (x,), Analysis(regions=[stats("model", 300.0, "Faint")]),
                        options=SearchOptions(budget=4, backends=("openvino",), rounds=3))
    assert ("the accuracy guard cannot see this model's outputs" in caplog.text) == blind
    reason = result.trials["<model>::openvino+bf16"].reason
    assert ("within the accuracy guard's atol of 0" in reason) == blind
    assert (result.choices.get("") == Candidate("", "openvino", precision="bf16")) != blind
