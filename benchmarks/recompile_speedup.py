"""Recompiled builds vs eager and torch.compile on the zoo, plus the search's efficiency (issue 7).

For each zoo model, in one process: profile it (instrument_module + profile), analyze the trace,
run the guided search (fresh record database, so the measurement count is a first search's),
then time eager, torch.compile default, torch.compile max-autotune-no-cudagraphs and the build's
module interleaved side by side (balanced orders, medians of --rounds rounds or more; each contender on its
own copy of the weights, as deployed). Prints the table and
the geometric means. For --exhaustive-models it also runs the exhaustive search of the same space
(its own fresh record database) and times its plan against the guided plan interleaved: the
fraction of the exhaustive measurements the guided search used, and the fraction of the exhaustive
best it reached. A second guided search with the first one's records shows the record reuse.

The "floor" column is the model's matmul/conv/attention/RNN FLOPs (the recompiler's op census of
one eager call) at this process's measured large-matmul rate: no fp32 build beats it, so "build / floor"
says how much room is left. It counts FLOPs only: batch-1 matrix-vector models (mlp, lstm_step)
are bound by reading their weights long before that, so their ratio overstates the room.

ONNX Runtime and OpenVINO race too (issue 26): the whole model at their default settings, each on
its own copy of the weights. Goals (issue 26): the build >= 0.98x the fastest of eager,
torch.compile, ONNX Runtime and OpenVINO on every model; geomean over that best single runtime
>= 1.2x. Goals (issue 7): geomean >= 2.0x over torch.compile default and >= 2.5x over eager; no model more
than 2% slower than the best baseline; <= 25% of the exhaustive measurements reaching >= 97% of
the exhaustive best. Runs with one intra-op thread by default (--threads): on a shared 2-core
machine, two threads measure the neighbours, not the code. AOTInductor packages are cached under
$CUVIL_CACHE_DIR/artifacts, so a second run of this script compiles much less.

    python benchmarks/recompile_speedup.py [--models mlp,cnn] [--budget N] [--exhaustive-models lstm_step]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mlp,cnn,lstm_step,transformer,mixed",
                   help="zoo models (comma-separated; 'all' for every zoo factory) or models from outside the "
                        "repository as MODULE_OR_FILE:FACTORY (./models.py:gpt2), as recompile --model takes them")
    p.add_argument("--budget", type=int, default=None, help="search budget (default: the search's own)")
    p.add_argument("--exhaustive-models", default="lstm_step,mlp",
                   help="models to also search exhaustively (slow: every candidate is compiled)")
    p.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--profile-iters", type=int, default=20)
    p.add_argument("--rtol", type=float, default=None, help="the build's accuracy guard (recompile --rtol)")
    p.add_argument("--atol", type=float, default=None, help="the build's accuracy guard (recompile --atol)")
    p.add_argument("--deployed", action="store_true",
                   help="race eager, torch.compile, the runtimes and the saved build each in its own process, as "
                        "deployed (the build through load_build), instead of in this process")
    p.add_argument("--deployed-runs", type=int, default=1,
                   help="with --deployed: races per model, each with fresh worker processes; each contender's "
                        "figure is the median of its races' medians (one race spreads by about 3%% per model)")
    p.add_argument("--sample-ms", type=float, default=None,
                   help="with --deployed: the shortest timing sample (default process_race's 5 ms). Each sample "
                        "starts in a worker woken from its pipe read, on caches the other workers left cold: "
                        "short samples weigh that first call, as a service with sporadic requests sees it; "
                        "long ones (50) time the steady state of a busy one")
    return p.parse_args()


def profile_model(name: str, model, inputs, iters: int, workdir: str):
    import torch

    from cuvil_pgc import instrument_module, load_trace, profile
    from cuvil_pgc.analyze import analyze

    path = os.path.join(workdir, f"{name}.trace.json")
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        handle = instrument_module(model)
        with profile(path, ops=True, gpu="off", sample_hz=0):
            for _ in range(iters):
                model(*inputs)
        handle.remove()
    return path, analyze(load_trace(path))


def runtime_baselines(model, inputs, artifacts: dict | None = None) -> tuple[dict, dict[str, str]]:
    """ONNX Runtime and OpenVINO on the whole model at their default settings (ONNX Runtime with all
    graph optimizations, OpenVINO with the latency hint, both at torch's thread count; the plain
    export, without the index checks a build's programs carry), each on
    its own copy of the weights (each timed through our runner and as a user calls it,
    :func:`as_a_user_calls_it`, the faster counting); and why a runtime is absent
    (not installed, or the export or conversion failed). "openvino" computes in f32, as the build's
    default guard requires; "openvino-native" is OpenVINO's real default on CPUs with AVX512-BF16 or
    AMX, bf16, which races in the goals only where it passes the run's accuracy guard. ``artifacts``
    receives each runtime's exported file (the .onnx, the OpenVINO IR)."""
    import copy

    from cuvil_pgc.recompile import runtimes
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.runtime_build import plain_exports

    out, failed = {}, {}
    for backend in ("ort", "openvino", "openvino-native"):
        name, precision = backend.partition("-native")[0], "fp32"
        if not runtimes.check(name).ok:
            failed[backend] = runtimes.check(name).reason
            continue
        if backend == "openvino-native":     # the CPU plugin's own default precision, where it is not f32
            if not runtimes.openvino_native_bf16():
                continue
            precision = "bf16"
        try:
            with plain_exports():        # the export a user makes: without the build's index checks
                realized = realize(copy.deepcopy(model), Candidate("", name, precision=precision),
                                   ScopeInputs(tuple(inputs)), machine="benchmark")
            out[backend] = realized.module
            if artifacts is not None:
                artifacts[backend] = realized.artifact
        except Exception as exc:
            failed[backend] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out, failed


def as_a_user_calls_it(region):
    """The runtime behind a realized whole-model region, called the way a user calls it: ONNX
    Runtime's ``session.run`` with NumPy feeds, OpenVINO's infer request with shared inputs (our runner,
    timed beside it, copies small inputs into the request's buffers, OpenVINO's fastest call), the
    outputs wrapped as tensors; without our runner's argument flattening, signature check and output
    rebuilding (about 6% of a 1 ms model). The same session and compiled model, so the same result."""
    import torch

    from cuvil_pgc.recompile.openvino_runner import OpenVinoRunner
    from cuvil_pgc.recompile.ort_runner import OrtRunner

    runner = region.compiled
    if isinstance(runner, OrtRunner):
        session, names = runner.session, runner.input_names

        def call(*args):
            outs = session.run(None, {n: t.numpy() for n, t in zip(names, args, strict=True)})
            return [torch.from_numpy(o) for o in outs]
        return call
    if isinstance(runner, OpenVinoRunner):
        request = runner.compiled.create_infer_request()

        def call(*args):
            outs = request.infer([t.numpy() for t in args], share_inputs=True)
            return [torch.from_numpy(o) for o in outs.to_tuple()]
        return call
    return region


def baselines(model, inputs) -> dict:
    """Eager and both torch.compile baselines, each on its own copy of the weights.

    A deployment runs one of them, with its weights to itself. Sharing one set of weights among three
    of the four contenders would keep those weights warm in the cache for each other while the
    build's (AOTInductor packages hold their own) are evicted between its samples."""
    import copy

    import torch

    default = torch.compile(copy.deepcopy(model))
    mat = torch.compile(copy.deepcopy(model), mode="max-autotune-no-cudagraphs")
    with torch.no_grad():
        default(*inputs)
        mat(*inputs)
    return {"eager": copy.deepcopy(model), "compile": default, "compile-mat": mat}


def compute_floor_ms(model, inputs, peak_flops: float) -> float:
    """Milliseconds the model's FLOPs take at ``peak_flops``: the recompiler's own op census of one
    call, which counts the math inside oneDNN RNNs and the transformer fast path too."""
    from cuvil_pgc.recompile.features import op_census

    return op_census(model, tuple(inputs), {})["flops"] / peak_flops * 1e3


def measure_peak_flops() -> float:
    """This process's fp32 large-matmul FLOP/s on the CPU (the analyzer's microbenchmark)."""
    import torch

    from cuvil_pgc.analyze._microbench import Stopwatch, matmul_rate

    return matmul_rate(Stopwatch("cpu"), torch.float32, (256, 512, 1024), budget_s=2.0).value


def race(contenders: dict, inputs, rounds: int) -> dict[str, float]:
    """Medians of interleaved rounds, at least ``rounds`` and whole cycles of the balanced orders
    (every contender after every other equally often)."""
    import torch

    from cuvil_pgc.recompile.measure import time_interleaved, whole_cycles

    with torch.no_grad():
        samples = time_interleaved({k: (lambda m=m: m(*inputs)) for k, m in contenders.items()},
                                   rounds=whole_cycles(rounds, len(contenders)))
    return {k: s.median_ms for k, s in samples.items()}


def run_model(name: str, args, workdir: str, peak_flops: float) -> dict:
    import torch

    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.records import RecordDB
    model, inputs = load(name)
    reference, name = name, name.rpartition(":")[2]     # a MODULE:FACTORY reference is shown by its factory
    t0 = time.perf_counter()
    trace, analysis = profile_model(name, model, inputs, args.profile_iters, workdir)
    labels = {r.path: r.bottleneck for r in analysis.regions[:3]}
    records = RecordDB(os.path.join(workdir, "records"))   # shared by the zoo: other models' records help
    t1 = time.perf_counter()
    guard = {"rtol": args.rtol, "atol": args.atol}
    build = recompile(model, inputs, analysis=analysis, budget=args.budget, records=records, **guard)
    t2 = time.perf_counter()
    torch._dynamo.reset()
    artifacts: dict[str, str] = {}
    others, failed = runtime_baselines(model, inputs, artifacts)
    contenders = {**baselines(model, inputs), **others, "build": build.module}
    accurate = guard_passes(model, contenders, inputs, guard)
    interval = None
    if args.deployed:
        medians, dead, pooled = deployed_race(reference, build, artifacts, args, workdir)
        failed.update({k: f"its worker process failed: {why}" for k, why in dead.items()})
        interval = vs_best_interval(medians, accurate, pooled)
    else:
        if all(isinstance(t, torch.Tensor) for t in inputs):     # the runtimes also timed as a user calls them,
            plain, _ = runtime_baselines(model, inputs)         # on sessions of their own: two callers of one
            contenders.update({f"{k} plain": as_a_user_calls_it(m) for k, m in plain.items()})   # keep it warm
        medians = race(contenders, inputs, args.rounds)
        for k in others:       # each runtime's figure: the faster of its two calls (the strongest baseline)
            medians[k] = min(medians[k], medians.get(f"{k} plain", math.inf))
    row = {"model": name, "labels": labels, "medians_ms": medians, "plan": build.plan.to_json(), "runtime_failed": failed,
           "accurate": accurate, "vs_best_interval": interval,
           "measured": build.plan.measured_candidates, "space": build.plan.space_size,
           "search_s": t2 - t1, "profile_s": t1 - t0, "floor_ms": compute_floor_ms(model, inputs, peak_flops)}
    again = recompile(model, inputs, analysis=analysis, budget=args.budget, records=records, **guard)
    row["second_measured"] = again.plan.measured_candidates
    row["second_reused"] = again.plan.reused_records
    if {name, reference} & set(args.exhaustive_models.split(",")):     # a factory or a whole reference
        row["exhaustive"] = exhaustive(model, inputs, analysis, build, workdir, name, args.rounds)
    return row


def deployed_race(reference: str, build, artifacts: dict[str, str], args, workdir: str):
    """Eager, torch.compile, the runtimes on their exported files and the saved, signed build, each
    in a process of its own as deployed (see ``_deployed_race.py``); medians in ms, and the
    contenders whose worker failed."""
    from _deployed_race import race_samples

    from cuvil_pgc.recompile.signing import generate_keypair

    tag = f"m{len(os.listdir(workdir))}"
    key, pub = generate_keypair(os.path.join(workdir, f"{tag}.key"))
    path = build.save(os.path.join(workdir, f"{tag}.cuvilpkg"), signing_key=str(key))
    base = {"model": reference, "threads": args.threads}
    specs = {"eager": {**base, "kind": "eager"}, "compile": {**base, "kind": "compile"},
             **{k: {**base, "kind": k, "path": p} for k, p in artifacts.items()},
             "build": {**base, "kind": "build", "path": path, "pubkey": str(pub)}}
    min_sample_s = None if args.sample_ms is None else args.sample_ms / 1e3
    runs = [race_samples(specs, args.rounds, min_sample_s=min_sample_s) for _ in range(max(1, args.deployed_runs))]
    failed = {k: why for _, dead in runs for k, why in dead.items()}
    raced = [k for k in runs[0][0] if all(k in samples for samples, _ in runs)]
    medians = {k: statistics.median(samples[k].median_s for samples, _ in runs) for k in raced}
    pooled = {k: [t for samples, _ in runs for t in samples[k].seconds] for k in raced}   # rounds aligned per run
    return {k: v * 1e3 for k, v in medians.items()}, failed, pooled


def vs_best_interval(medians_ms: dict[str, float], accurate: dict[str, str],
                     pooled: dict[str, list[float]]) -> tuple[float, float] | None:
    """The 95% bootstrap interval of the best single runtime's median over the build's (the goal's
    ratio), resampling the deployed race's rounds jointly (each round times every contender);
    None where the race did not time both."""
    from cuvil_pgc.recompile.measure import ratio_ci

    best = best_rival(medians_ms, accurate)
    return ratio_ci(pooled[best], pooled["build"]) if best is not None and best in pooled and "build" in pooled else None


def guard_passes(model, contenders: dict, inputs, guard: dict) -> dict[str, str]:
    """Per contender, whether its outputs pass the build's accuracy guard against eager's
    ("yes" or "no (max rel err ...)"): a faster contender that fails it is not a like-for-like rival."""
    import torch

    from cuvil_pgc.recompile.accuracy import check_outputs

    with torch.no_grad():
        ref = model(*inputs)
        out = {}
        for k, m in contenders.items():
            r = check_outputs(ref, m(*inputs), **guard)
            out[k] = "yes" if r.ok else f"no (max rel err {r.max_rel_err:.1e}, abs {r.max_abs_err:.1e})"
    return out


def load(name: str):
    """(model, inputs) of a zoo name or a MODULE:FACTORY reference."""
    if ":" in name:
        from cuvil_pgc._modelspec import load_model_spec

        return load_model_spec(name)
    from cuvil_pgc.zoo import get

    return get(name)()


def exhaustive(model, inputs, analysis, guided, workdir: str, name: str, rounds: int) -> dict:
    import torch

    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.plan import FINAL_RACE_ROUNDS
    from cuvil_pgc.recompile.records import RecordDB

    t0 = time.perf_counter()
    full = recompile(model, inputs, analysis=analysis, exhaustive=True,
                     records=RecordDB(os.path.join(workdir, f"records-exhaustive-{name}")))
    elapsed = time.perf_counter() - t0
    torch._dynamo.reset()
    same = full.plan.candidates() == guided.plan.candidates()
    # a near tie between two builds is decided with as many rounds as the search's own final race
    medians = race({"guided": guided.module, "exhaustive": full.module}, inputs, max(2 * rounds, FINAL_RACE_ROUNDS))
    return {"measured": full.plan.measured_candidates, "space": full.plan.space_size,
            "guided_measured": guided.plan.measured_candidates, "identical": same,
            "reached": 1.0 if same else medians["exhaustive"] / medians["guided"], "medians_ms": medians,
            "chosen": [c.config for c in full.plan.choices], "search_s": elapsed}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def chosen_plan(row: dict) -> str:
    return ", ".join(f"{c['scope'] or '<model>'}: {c['config']}" for c in row["plan"]["choices"]) or "eager"


def tried(plan: dict) -> list[str]:
    """One line per candidate the search built (the chosen one included): predicted and measured
    ms, or why it was rejected; what to read when a plan surprises."""
    out = []
    for region in plan["regions"]:
        for alt in region["alternatives"] + ([{"config": region["chosen"], "status": "chosen",
                                               "predicted_ms": region["predicted_ms"],
                                               "measured_ms": region["measured_ms"], "reason": ""}]):
            if alt["status"] == "not_measured" or alt["config"] == "eager" or alt["config"].startswith("merged"):
                continue
            what = alt["reason"][:120] if alt["status"] not in ("ok", "chosen") else \
                f"predicted {alt['predicted_ms']} ms, measured {alt['measured_ms']} ms"
            out.append(f"{region['scope']}: {alt['config']} [{alt['status']}{', record' if alt.get('reused_record') else ''}] {what}")
    return out


#: the contenders a build must beat (issue 26): eager, torch.compile and the runtimes at their defaults
DEFAULT_CONTENDERS = ("eager", "compile", "ort", "openvino", "openvino-native")


def best_rival(m: dict[str, float], accurate: dict[str, str] | None = None) -> str | None:
    """The fastest of eager, torch.compile default, ONNX Runtime and OpenVINO (those that ran and
    pass the build's accuracy guard); None where none did."""
    return min((k for k in DEFAULT_CONTENDERS if k in m and (accurate or {}).get(k, "yes") == "yes"),
               key=m.get, default=None)


def best_single(m: dict[str, float], accurate: dict[str, str] | None = None) -> float:
    """The median of :func:`best_rival`."""
    best = best_rival(m, accurate)
    if best is None:
        raise ValueError("no baseline ran and passed the accuracy guard")
    return m[best]


def report(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="recompile_speedup: median ms per call (interleaved, one run)")
    for col in ("model", "eager", "compile", "compile-mat", "ort", "openvino", "openvino-native", "build", "vs eager",
                "vs compile",
                "vs ort", "vs openvino", "vs best single", "floor", "build / floor", "chosen", "measured / space",
                "2nd search measured"):
        table.add_column(col, justify="left" if col in ("model", "chosen") else "right")
    for r in rows:
        m = r["medians_ms"]

        def ratio(k, m=m):
            return f"{m[k] / m['build']:.2f}x" if k in m else "failed"
        table.add_row(r["model"], *(f"{m[k]:.4f}" if k in m else "-" for k in
                                    ("eager", "compile", "compile-mat", "ort", "openvino", "openvino-native",
                                     "build")),
                      ratio("eager"), ratio("compile"), ratio("ort"), ratio("openvino"),
                      f"{best_single(m, r['accurate']) / m['build']:.3f}x", f"{r['floor_ms']:.4f}", f"{m['build'] / r['floor_ms']:.1f}x",
                      chosen_plan(r), f"{r['measured']} / {r['space']}",
                      f"{r['second_measured']} ({r['second_reused']} reused)")
    Console(width=240).print(table)
    g_single = geomean([best_single(r["medians_ms"], r["accurate"]) / r["medians_ms"]["build"] for r in rows])
    worst_single = min(best_single(r["medians_ms"], r["accurate"]) / r["medians_ms"]["build"] for r in rows)
    print(f"geomean over the best single runtime (eager, compile, ORT, OpenVINO at defaults): {g_single:.2f}x "
          f"(goal >= 1.2x)")
    print(f"worst model vs its best single runtime: {worst_single:.3f}x (goal >= 0.98x)")
    intervals = {r["model"]: r["vs_best_interval"] for r in rows if r.get("vs_best_interval")}
    if intervals:        # the deployed race's noise: a model whose interval reaches 0.98 may meet the goal
        print("95% intervals of the best single runtime's median over the build's (deployed race, rounds "
              "resampled): " + ", ".join(f"{m} {lo:.3f}-{hi:.3f}" for m, (lo, hi) in intervals.items()))
        below = [m for m, (_, hi) in intervals.items() if hi < 0.98]
        print(f"models whose whole interval lies below 0.98x: {len(below)} of {len(intervals)}"
              + (f" ({', '.join(below)})" if below else ""))
    for r in rows:
        for backend, why in r.get("runtime_failed", {}).items():
            print(f"  {r['model']}: no {backend} baseline: {why}")
        m = r["medians_ms"]
        for k, ok in r["accurate"].items():
            if ok != "yes":
                print(f"  {r['model']}: {k} ({m[k]:.4f} ms, {m[k] / m['build']:.2f}x the build's time) fails the "
                      f"build's accuracy guard: {ok}; not counted as a rival")
    g_eager = geomean([r["medians_ms"]["eager"] / r["medians_ms"]["build"] for r in rows])
    g_comp = geomean([r["medians_ms"]["compile"] / r["medians_ms"]["build"] for r in rows])
    worst = min(min(r["medians_ms"][k] for k in ("eager", "compile", "compile-mat") if k in r["medians_ms"])
                / r["medians_ms"]["build"] for r in rows)
    print(f"geomean speedup vs eager: {g_eager:.2f}x (goal >= 2.5x)")
    print(f"geomean speedup vs torch.compile default: {g_comp:.2f}x (goal >= 2.0x)")
    print(f"worst model vs its best baseline: {worst:.3f}x (goal >= 0.98x)")
    for r in rows:
        print(f"  {r['model']}: chose {chosen_plan(r)}; profile {r['profile_s']:.0f}s, search {r['search_s']:.0f}s, "
              f"labels {r['labels']}")
        for line in tried(r["plan"]):
            print(f"    {line}")
        for race, medians in (("final race", r["plan"].get("final_medians_ms")),
                              ("in processes of their own", r["plan"].get("deployed_medians_ms"))):
            if medians:
                print(f"    {race}: " + ", ".join(f"{k} {v} ms" for k, v in medians.items()))
    for r in rows:
        ex = r.get("exhaustive")
        if ex:
            print(f"search efficiency on {r['model']}: guided measured {ex['guided_measured']} of the "
                  f"{ex['measured']} the exhaustive search measured ({ex['guided_measured'] / ex['measured']:.0%}; "
                  f"goal <= 25%), reaching {ex['reached']:.1%} of the exhaustive best (goal >= 97%"
                  f"{'; the same plan' if ex['identical'] else ''}); "
                  f"exhaustive chose {ex['chosen']} in {ex['search_s']:.0f}s; medians {ex['medians_ms']}")


def row_summary(r: dict) -> str:
    """One line per finished model (the table comes at the end; a long run shows its figures as it goes)."""
    m = r["medians_ms"]
    ex = r.get("exhaustive")
    ci = r.get("vs_best_interval")
    return (f"medians ms {({k: round(v, 4) for k, v in m.items()})}; build vs best single "
            f"{best_single(m, r['accurate']) / m['build']:.3f}x" + (f" (95%: {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
            + f"; chose {chosen_plan(r)}; measured {r['measured']}/{r['space']}"
            + (f"; exhaustive measured {ex['measured']}, guided reached {ex['reached']:.1%}" if ex else ""))


def main() -> int:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from cuvil_pgc.zoo import ZOO

    names = list(ZOO) if args.models == "all" else args.models.split(",")
    peak = measure_peak_flops()
    print(f"fp32 matmul peak at {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s (the floor column's rate)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cuvil-bench-") as workdir:
        for name in names:
            print(f"[{time.strftime('%H:%M:%S')}] {name} ...", file=sys.stderr, flush=True)
            rows.append(run_model(name, args, workdir, peak))
            print(f"[{time.strftime('%H:%M:%S')}] {name}: " + row_summary(rows[-1]), file=sys.stderr, flush=True)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
