"""Choosing the plan from the search's trials, and the final side-by-side check.

Per scope the fastest accurate measured trial wins. Plans then compete: the whole model as one
compile boundary (its best trial, up to three runners-up measured within 20 % of it and the
fastest trial of up to two other backends within 50 %: a search measures each candidate once, so
near ties are decided again side by side, unless the search's time budget is spent; and every
runtime at its defaults, what a user would
deploy instead, however far behind the search measured it) and the *composite* of the best
sub-region choices (disjoint regions, each compiled alone, the rest eager, predicted from their
measured savings). All are rebuilt (AOTInductor packages come from the artifact cache), checked
end to end with the accuracy guard, and timed interleaved with eager; the fastest wins, and eager
itself wins when nothing beats it in that run (a plan is never slower than what it replaces, as
far as the medians can tell).

A plan beats the fastest runtime default in the race only when the race says so with confidence
(the bootstrap 95% interval of its speedup over the default lies above 1); otherwise the default
ships. On a tie the default is what a user would deploy anyway, and a knob or backend that won by a
percent in the searching process can lose by several where the build is deployed: zoo gru_tagger's
``ort+opt=extended`` won the search's race and ran 4.5% slower than ONNX Runtime's default in
processes of their own (``recompile_speedup.py --deployed``).

Where the race's winner is a whole-model plan that runs without the model's code (one ONNX Runtime
session, OpenVINO model or AOTInductor package on the CPU), those plans race again, each in worker
processes of their own (:mod:`.standalone`), and that race decides, with the same rule against the
runtime defaults. The searching process is not where a build runs: there, unseen dwcnn's OpenVINO
bf16 plan ran 13% behind ONNX Runtime's default, and 11% ahead of it in processes of their own.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from cuvil_pgc._progress import stage
from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile.accuracy import check_outputs
from cuvil_pgc.recompile.apply import apply_plan, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.dispatch_state import kept
from cuvil_pgc.recompile.measure import Samples, ratio_ci, time_interleaved, time_surviving
from cuvil_pgc.recompile.realized import Realized
from cuvil_pgc.recompile.search_records import ENDED_RACE

log = logging.getLogger(__name__)

#: whole-model trials this close to the best are raced again at the end: one trial of a 0.1 ms model
#: spreads by more than 10% here (zoo lstm_step shipped an AOTInductor variant that its own trials
#: ranked over 10% ahead, and the exhaustive search's plan raced 12% ahead of it)
RUNNER_UP_WITHIN = 0.20
MAX_RUNNERS_UP = 3
#: the fastest whole-model trial of each other backend this close to the best is raced again too:
#: one trial ranks backends less reliably than it ranks one backend's knobs (on an H200 the search
#: measured an AOTInductor package at 0.131 ms and CUDA graphs at 0.161; the package then ran 0.203
#: ms in the final race, and CUDA graphs ran 1.23x ahead of it in a fresh process)
OTHER_BACKEND_WITHIN = 0.5
MAX_OTHER_BACKENDS = 2
# The final race decides near ties from few samples of ~0.5 ms each: it takes many more rounds than
# a search batch (200 x 0.5 ms x 4 contenders is under half a second) so a descheduled sample or
# two cannot flip it.
FINAL_RACE_ROUNDS = 200
#: rounds of the race in worker processes: 5 ms samples of each of up to 2 x 4 workers
DEPLOYED_RACE_ROUNDS = 48
#: devices whose winning plan is loaded in a fresh process before it ships (:func:`_loadable_winner`)
FRESH_LOAD_DEVICES = ("cuda",)


def best_per_scope(trials: dict[str, Any]) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for t in trials.values():
        if t.status == "ok" and t.measured_us is not None:
            cur = best.get(t.candidate.scope)
            if cur is None or t.measured_us < cur.measured_us:
                best[t.candidate.scope] = t
    return best


def runners_up(trials: dict[str, Any], best: Any, within: float = RUNNER_UP_WITHIN,
               most: int = MAX_RUNNERS_UP) -> list[Candidate]:
    """Whole-model configurations measured within ``within`` of the best one: one search measures
    each candidate once, so near ties are decided again, side by side, in the final race."""
    close = sorted((t for t in trials.values() if t.candidate.scope == "" and t is not best and t.status == "ok"
                    and t.measured_us is not None and not t.candidate.is_baseline
                    and t.measured_us <= best.measured_us * (1 + within)), key=lambda t: t.measured_us)
    return [t.candidate for t in close[:most]]


def other_backends(trials: dict[str, Any], best: Any, within: float = OTHER_BACKEND_WITHIN,
                   most: int = MAX_OTHER_BACKENDS) -> list[Candidate]:
    """The fastest whole-model trial of each backend other than the best's, measured within
    ``within`` of it, fastest first: the final race decides between backends side by side."""
    fastest: dict[str, Any] = {}
    for t in trials.values():
        if t.candidate.scope == "" and t.status == "ok" and t.measured_us is not None \
                and not t.candidate.is_baseline and t.candidate.backend != best.candidate.backend \
                and t.measured_us <= best.measured_us * (1 + within):
            cur = fastest.get(t.candidate.backend)
            if cur is None or t.measured_us < cur.measured_us:
                fastest[t.candidate.backend] = t
    return [t.candidate for t in sorted(fastest.values(), key=lambda t: t.measured_us)[:most]]


def passing_runtime_defaults(trials: dict[str, Any], defaults: list[Candidate]) -> list[Candidate]:
    """The whole-model runtimes at their defaults that passed the guard, fastest measured first:
    they all run in the final race, however far behind the search measured them (a search's
    measurement ranks runtimes unreliably: unseen dwcnn's OpenVINO bf16 measured 5% behind its
    f32 there and ran 15% ahead of it deployed), so the build is never slower than the runtime a
    user would deploy instead, as far as the race can tell."""
    ok = [trials[c.key] for c in defaults if c.key in trials and trials[c.key].status == "ok"
          and trials[c.key].measured_us is not None]
    return [t.candidate for t in sorted(ok, key=lambda t: t.measured_us)]


def composite_choice(best: dict[str, Any], features: dict[str, Any]) -> tuple[dict[str, Candidate], float]:
    """Disjoint sub-scopes with a measured saving, biggest first; returns choices and predicted µs."""
    chosen: dict[str, Candidate] = {}
    saving_total = 0.0
    ranked = sorted((s for s in best if s), key=lambda s: -(features[s].eager_us - best[s].measured_us))
    for scope in ranked:
        saving = features[scope].eager_us - best[scope].measured_us
        if saving <= 0 or best[scope].candidate.is_baseline or any(_nested(scope, o) for o in chosen):
            continue
        chosen[scope] = best[scope].candidate
        saving_total += saving
    return chosen, features[""].eager_us - saving_total


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def choose_plan(s: Any, result: Any) -> None:
    """Fill ``result.choices/realized/module/baseline_us/plan_us`` (``s`` is the running search)."""
    if s.opt.fixed is not None:       # a pinned plan: build and time it, no race against eager
        plans, defaults = {"pinned": dict(s.opt.fixed)}, []
    else:
        plans, defaults = _plans(s, result)
    records = getattr(s, "records", None)
    apart = records is not None and records.races_apart()
    try:
        if apart:
            built, samples, left_out = _build_and_time_apart(s, plans, records)
        else:
            if records is not None:
                records.race_started()
            built = {name: b for name, choices in plans.items() if (b := _build_plan(s, choices)) is not None}
            samples, left_out = None, {}
        if s.opt.fixed is not None and "pinned" not in built:
            why = left_out.get("pinned", "it cannot be built or fails the accuracy guard (see the warning above)")
            raise RecompileError(f"the pinned plan {[c.key for c in s.opt.fixed.values()]} is left out: {why}",
                                 fix="pin another configuration or run the search")
        _final_race(s, result, plans, built, samples=samples, allow_eager=s.opt.fixed is None, defaults=defaults)
    except BaseException:      # an interrupt or an error of the search: no fault of the plans
        if records is not None:
            records.leave()
        raise
    if records is not None and not apart:
        records.race_done(apart=False)


def _plans(s: Any, result: Any) -> tuple[dict[str, dict[str, Candidate]], list[str]]:
    """The plans the final race rebuilds, by name, and the names of those that are a runtime at its defaults."""
    best = best_per_scope(s.trials)
    plans: dict[str, dict[str, Candidate]] = {}
    defaults: list[str] = []          # the plans that are a runtime at its defaults
    root = best.get("")
    if root is not None and not root.candidate.is_baseline:
        plans[root.candidate.key] = {"": root.candidate}     # named as measured: <model>::aoti+freezing
        # near ties are raced again, each rebuilt (a detector's torch.compile: minutes), unless the
        # search's time budget is spent
        again = [] if getattr(s, "stopped_by_time", False) else runners_up(s.trials, root) + other_backends(s.trials, root)
        for cand in again:
            plans.setdefault(cand.key, {"": cand})
        for baseline in passing_runtime_defaults(s.trials, getattr(s, "runtime_defaults", [])):
            name = next((k for k, p in plans.items() if p == {"": baseline}), baseline.key)
            plans.setdefault(name, {"": baseline})
            defaults.append(name)
    composite, composite_us = composite_choice(best, s.features)
    # a new candidate, measured in the final race: within the budget, or beyond it when it is the
    # only plan that beat eager (built from measured parts, it costs no compile and one race)
    room = getattr(s, "budget", result.measured + 1) > result.measured or not plans
    if composite and room and (root is None or composite_us < root.measured_us * 1.05):
        plans["regions"] = composite
        result.measured += 1
    return plans, defaults


def _build_and_time_apart(s: Any, plans: dict[str, dict[str, Candidate]], records: Any
                          ) -> tuple[dict[str, Any], dict[str, Samples], dict[str, str]]:
    """Where a final race of this model ended its process (a native fault: nothing to catch,
    :meth:`.SearchRecords.races_apart`): each plan rebuilt and timed beside eager alone, marked
    started meanwhile, so that one that ends this process is left out of the next search's race.
    Returns the plans built and timed, the samples (eager's pooled, each plan's scaled by the
    ratio of all eager runs' median to its own run's) and why each plan left out was (said here)."""
    built, left_out, runs = {}, {}, {}
    for name, choices in plans.items():
        if records.plan_ended(choices):
            left_out[name] = ENDED_RACE
            continue
        records.plan_started(choices)
        if (b := _build_plan(s, choices)) is not None:
            runs[name], failed = _time_with_eager(s, {name: b[1]})
            left_out.update(failed)
            if name not in failed:
                built[name] = b
        records.plan_done(choices)
    records.race_done(apart=True)
    for name, why in left_out.items():
        log.warning("cuvil-pgc: plan %s is left out: %s", name, why)
    if not runs:        # eager alone, for the race to decide; a pinned plan left out has no race
        return built, {} if getattr(s.opt, "fixed", None) is not None else _time_with_eager(s, {})[0], left_out
    eager = Samples("eager", [t for run in runs.values() for t in run["eager"].seconds])
    samples = {"eager": eager}
    for name, run in runs.items():
        if name in built:
            scale = eager.median_s / run["eager"].median_s
            samples[name] = Samples(name, [t * scale for t in run[name].seconds])
    return built, samples, left_out


def _time_with_eager(s: Any, modules: dict[str, Any]) -> tuple[dict[str, Samples], dict[str, str]]:
    """``modules`` timed interleaved with the model; returns the samples and, by name, why one that
    raised (after its check call passed) is left out."""
    contenders = {"eager": s.model, **modules}
    args = s.inputs
    with torch.no_grad():
        samples, failed = time_surviving({k: (lambda m=m: m(*args)) for k, m in contenders.items()},
                                         timer=time_interleaved, rounds=max(s.opt.rounds, FINAL_RACE_ROUNDS))
    return samples, {name: f"it raised while raced, after its check call passed: {why}" for name, why in failed.items()}


def _build_plan(s: Any, choices: dict[str, Candidate]) -> tuple[dict[str, Realized], Any] | None:
    try:
        with kept(f"plan {[c.key for c in choices.values()]}"):
            realized = {scope: realize(s._module(scope), cand, s.scope_inputs[scope], device=s.opt.device,
                                       machine=s.machine_key, weights=s.weights[scope])
                        for scope, cand in choices.items()}
            module = apply_plan(s.model, realized)
            with torch.no_grad():
                out = module(*s.inputs)
    except Exception as exc:   # the plan could not be rebuilt: it loses the race
        log.warning("cuvil-pgc: plan %s could not be rebuilt (%s)", [c.key for c in choices.values()], exc)
        return None
    check = check_outputs(s.refs[""], out, rtol=s.opt.rtol, atol=s.opt.atol, exact=s.exact.get(""), padding=s.padding,
                          reduced=any(c.reduced for c in choices.values()))
    if not check.ok:
        log.warning("cuvil-pgc: plan %s fails the accuracy guard end to end: %s", [c.key for c in choices.values()],
                    check.reason)
        return None
    return realized, module


def _final_race(s: Any, result: Any, plans: dict[str, dict[str, Candidate]], built: dict[str, Any],
                allow_eager: bool = True, defaults: list[str] | tuple[str, ...] = (),
                samples: dict[str, Samples] | None = None) -> None:
    """Time the plans ``built`` with eager (unless ``samples`` holds their times, raced apart),
    decide the race and fill ``result``."""
    if samples is None:
        samples, failed = _time_with_eager(s, {name: module for name, (_, module) in built.items()})
        for name, why in failed.items():     # passed its check call, raised at a later one
            log.warning("cuvil-pgc: plan %s is left out: %s", name, why)
            del built[name]
            if not allow_eager:
                raise RecompileError(f"the pinned plan is left out: {why}",
                                     fix="pin another configuration or run the search")
    medians = {k: v.median_s * 1e6 for k, v in samples.items()}
    winner = _confident(min((k for k in medians if allow_eager or k != "eager"), key=medians.get), defaults, samples)
    if getattr(s.opt, "deployed_race", False):
        winner = _deployed_winner(s, result, plans, built, winner, defaults, allow_eager)
    winner = _loadable_winner(s, result, plans, built, medians, winner)
    deployed = getattr(result, "deployed_medians_us", {})
    figures = deployed if "eager" in deployed and winner in deployed else medians    # as deployed, where raced so
    result.baseline_us = figures["eager"]
    result.plan_us = figures[winner]
    result.final_medians_us = medians
    if winner == "eager":
        result.choices, result.realized, result.module = {}, {}, s.model
    else:
        result.choices = plans[winner]
        result.realized, result.module = built[winner]


def _loadable_winner(s: Any, result: Any, plans: dict[str, dict[str, Candidate]], built: dict[str, Any],
                     medians: dict[str, float], winner: str) -> str:
    """``winner``, or the fastest plan after it whose artifact regions (AOTInductor packages,
    runtime sessions) a fresh process rebuilds and runs (:func:`~.standalone.fresh_process_failures`):
    a plan that crashes the process that loads it must not ship. A plan the deployed race ran in
    processes of its own passed that already; eager has nothing to load.

    A plan whose workers failed in the deployed race (``result.unloadable``) does not ship either.
    The fresh-process check runs only on :data:`FRESH_LOAD_DEVICES`: there no deployed race runs,
    and AOTInductor CUDA packages crashed fresh processes (torch 2.11 on an H200, before
    :mod:`.cxx_runtime`). On the CPU,
    whole-model plans go through the deployed race, and packages and runtime files load in
    services' processes throughout the tests."""
    unloadable = getattr(result, "unloadable", {})       # the deployed race's failed plans
    check = str(getattr(s.opt, "device", "cpu")).split(":")[0] in FRESH_LOAD_DEVICES
    for name in [winner, *sorted((k for k in medians if k != winner), key=medians.get)]:
        if name in unloadable:
            continue
        if name == "eager" or not check or name in getattr(result, "deployed_medians_us", {}):
            return name
        failures = _fresh_process_failures(s, plans[name], built[name][0])
        if not failures:
            return name
        result.unloadable[name] = "; ".join(f"{scope or '<model>'}: {why}" for scope, why in failures.items())
        log.warning("cuvil-pgc: plan %s does not ship: %s", name, result.unloadable[name])
    return "eager"


def _fresh_process_failures(s: Any, choices: dict[str, Candidate], realized: dict[str, Realized]) -> dict[str, str]:
    from cuvil_pgc.recompile.standalone import fresh_process_failures, standalone_spec

    specs, inputs, references = {}, {}, {}
    for scope, cand in choices.items():
        if scope not in realized:
            continue
        spec = standalone_spec(cand, realized[scope], s.scope_inputs[scope], s.opt.device, check=True)
        if spec is not None:
            specs[scope], inputs[scope] = spec, s.scope_inputs[scope].args
            with torch.no_grad():
                references[scope] = realized[scope].module(*inputs[scope])
    if not specs:
        return {}
    stage(getattr(s, "progress", None), f"loading the plan's {len(specs)} compiled region(s) in a fresh process")
    return fresh_process_failures(specs, inputs, references)


def _confident(winner: str, defaults: list[str] | tuple[str, ...], samples: dict[str, Any]) -> str:
    """``winner``, unless it is a plan that the race cannot tell faster than the fastest runtime
    default in it (which then ships): the bootstrap interval of the speedup reaches 1, or, raced in
    worker processes, one of the plan's processes ran no faster than one of the default's. A
    process's memory layout alone moves a contender by a few percent, which pooled samples hide:
    with :data:`~.standalone.REPLICAS` processes each, "faster in every process" is a one-sided
    rank test at 5% (one of the 20 orders of six equal processes)."""
    raced = [k for k in defaults if k in samples]
    if not raced:
        return winner
    default = min(raced, key=lambda k: samples[k].median_s)
    if winner not in ("eager", default):
        lo, hi = ratio_ci(samples[default].seconds, samples[winner].seconds)
        mine, theirs = samples[winner].processes, samples[default].processes
        if lo <= 1.0 or (mine and theirs and max(mine) >= min(theirs)):
            log.info("cuvil-pgc: %s is not faster than %s with confidence (speedup 95%% CI %.3f-%.3f%s): "
                     "shipping the runtime default", winner, default, lo, hi,
                     f"; its slowest process {max(mine) * 1e3:.3f} ms, the default's fastest "
                     f"{min(theirs) * 1e3:.3f} ms" if mine and theirs else "")
            return default
    return winner


def _deployed_winner(s: Any, result: Any, plans: dict[str, dict[str, Candidate]], built: dict[str, Any],
                     winner: str, defaults: list[str] | tuple[str, ...], allow_eager: bool = True) -> str:
    """Where the race's winner is a whole-model plan a worker process can run alone, the fastest of
    those plans raced each in processes of their own (:mod:`.standalone`); ``winner`` otherwise,
    or when its own workers could not run (each plan whose workers failed goes into
    ``result.unloadable``, and :func:`_loadable_winner` passes it over). With the model's
    ``MODULE:FACTORY`` (``opt.model_ref``) eager races there too, and wins where it is fastest."""
    from cuvil_pgc.recompile.standalone import race_standalone, standalone_spec

    specs = {}
    for name, choices in plans.items():
        if name in built and set(choices) == {""}:
            spec = standalone_spec(choices[""], built[name][0][""], s.scope_inputs[""], s.opt.device)
            if spec is not None:
                specs[name] = spec
    if winner not in specs or len(specs) < 2:
        return winner
    ref = getattr(s.opt, "model_ref", None)
    if ref:         # eager too, the factory's model in a worker of its own (see build.recompile's model_ref)
        specs["eager"] = {"model_ref": ref, "threads": torch.get_num_threads()}
    with torch.no_grad():
        references = {name: (s.model if name == "eager" else built[name][1])(*s.inputs) for name in specs}
    stage(getattr(s, "progress", None), f"racing {len(specs)} whole-model plans in processes of their own")
    try:
        samples, failed = race_standalone(specs, s.inputs, references, rounds=DEPLOYED_RACE_ROUNDS)
    except Exception as exc:       # a worker that stopped answering: the race in this process stands
        log.warning("cuvil-pgc: the race in processes of their own stopped (%s); keeping %s", exc, winner)
        return winner
    for name, why in failed.items():      # a deployment's process would fail the same way
        if name == "eager":                # a factory that makes other weights: the figures stay this process's
            log.warning("cuvil-pgc: eager did not race in processes of their own (%s); the build's speedup "
                        "over eager is the searching process's", why)
            continue
        log.warning("cuvil-pgc: plan %s could not run in a process of its own: %s", name, why)
        result.unloadable[name] = f"<model>: a process of its own could not load and run it: {why}"
    if winner not in samples:
        return winner
    result.deployed_medians_us = {k: v.median_s * 1e6 for k, v in samples.items()}
    fastest = _confident(min((k for k in samples if allow_eager or k != "eager"), key=lambda k: samples[k].median_s),
                         defaults, samples)
    if fastest != winner:
        log.info("cuvil-pgc: in processes of their own %s ran fastest (%s); this process had measured %s fastest",
                 fastest, ", ".join(f"{k} {v / 1e3:.3f} ms" for k, v in result.deployed_medians_us.items()), winner)
    return fastest
