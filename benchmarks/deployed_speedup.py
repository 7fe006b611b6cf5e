"""A build applied where it is deployed: a service process importing the model as a package module (issue 22).

The flow a user runs, each step in its own process, in a scratch directory:

1. a package ``shop`` whose ``shop/models.py`` holds the zoo's model classes (a copy of their
   source file) and a factory ``build`` (the zoo model of ``--model``, re-classed to these classes);
2. ``cuvil-pgc profile --model shop/models.py:build``, ``cuvil-pgc keygen``, and
   ``cuvil-pgc recompile ... --model shop/models.py:build --sign release.key --threads N``;
3. a service: ``from shop.models import build`` (the usual import, ``PYTHONPATH`` = the scratch
   directory), ``load_build(..., pubkey=...)``, then the plain model (its own copy of the weights)
   and the build timed interleaved in that one process (median per call, bootstrap 95 % CI of the
   ratio).

It prints the load report (applied regions, stale warnings) and eager vs build side by side.
Before issue 22 the service's classes (``shop.models.X``) never matched the build's
(``_cuvil_model_models.X``): every region was "changed since the build" and ran eagerly.

    python benchmarks/deployed_speedup.py [--model transformer] [--threads 1] [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

FACTORY = '''


def build():
    """The zoo's {name} model with this file's classes: what a service importing shop.models gets."""
    from cuvil_pgc import zoo

    model, inputs = zoo.get({name!r})()
    for module in model.modules():
        if type(module).__module__ == "cuvil_pgc.zoo._models":
            module.__class__ = globals()[type(module).__name__]
    return model, inputs
'''

SERVICE = textwrap.dedent('''
    import json, sys, warnings
    import torch

    torch.set_num_threads(int(sys.argv[3]))
    from shop.models import build               # the service's own import of the model
    from cuvil_pgc import load_build
    from cuvil_pgc.recompile.compare import compare_runnables

    model, inputs = build()
    eager, _ = build()                          # its own copy of the weights, as deployed side by side
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = load_build(sys.argv[1], model, pubkey=sys.argv[2], example_inputs=inputs)
    report = fast.cuvil_load_report
    result = compare_runnables(eager, fast, inputs, names=("eager", "build"), rounds=int(sys.argv[4]), warmup=10)
    print(json.dumps({"module": type(model).__module__, "applied": report.applied, "skipped": report.skipped,
                      "warnings": [str(w.message) for w in caught], "threads": torch.get_num_threads(),
                      "compare": result}))
''')


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="transformer", help="zoo model")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the search and the service")
    p.add_argument("--rounds", type=int, default=200, help="interleaved timing rounds in the service")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return p.parse_args()


def run(args: list[str], cwd: str, env: dict[str, str]) -> str:
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(args[:5])} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    print(f"  {' '.join(a for a in args[1:6])} ... {time.perf_counter() - started:.0f} s", flush=True)
    return proc.stdout


def main() -> int:
    args = parse_args()
    import cuvil_pgc.zoo._models as zoo_models

    work = tempfile.mkdtemp(prefix="cuvil-deployed-")
    os.makedirs(os.path.join(work, "shop"))
    open(os.path.join(work, "shop", "__init__.py"), "w").close()
    with open(zoo_models.__file__) as src, open(os.path.join(work, "shop", "models.py"), "w") as dst:
        dst.write(src.read() + FACTORY.format(name=args.model))
    env = {**os.environ, "CUVIL_CACHE_DIR": os.path.join(work, "cache"), "PYTHONPATH": ""}
    for name in ("CUVIL_TRUSTED_KEY", "CUVIL_ALLOW_UNSIGNED", "CUVIL_SIGNING_KEY"):
        env.pop(name, None)
    cli = [sys.executable, "-m", "cuvil_pgc"]
    spec, threads = "shop/models.py:build", str(args.threads)
    print(f"{args.model}: recompile from {spec}, service imports shop.models ({args.threads} thread(s); {work})")
    run([*cli, "profile", "--model", spec, "-o", "run.trace.json", "--threads", threads], work, env)
    run([*cli, "keygen", "-o", "release.key"], work, env)
    plan = json.loads(run([*cli, "recompile", "run.trace.json", "--model", spec, "-o", "shop.cuvilpkg",
                           "--sign", "release.key", "--threads", threads, "--json"], work, env))
    with open(os.path.join(work, "service.py"), "w") as fh:
        fh.write(SERVICE)
    out = run([sys.executable, "service.py", "shop.cuvilpkg", "release.key.pub", threads, str(args.rounds)], work,
              {**env, "PYTHONPATH": work})
    doc = json.loads(out.strip().splitlines()[-1])
    c = doc["compare"]
    print(f"search: measured {plan['measured_candidates']} of {plan['space_size']}, "
          f"recompile's own race {plan['speedup_vs_eager']}x")
    print(f"service: model class from {doc['module']}, {doc['threads']} thread(s)")
    print(f"  applied: {'; '.join(doc['applied']) or 'nothing'}")
    print(f"  stale:   {'; '.join(doc['skipped']) or 'none'}; warnings: {len(doc['warnings'])}")
    for w in doc["warnings"]:
        print(f"    {w[:200]}")
    print(f"  eager {c['a']['median_ms']:.4f} ms  build {c['b']['median_ms']:.4f} ms  "
          f"speedup {c['speedup']:.2f}x (95% CI {c['speedup_ci95'][0]:.2f}-{c['speedup_ci95'][1]:.2f}), "
          f"{c['rounds']} interleaved rounds, verdict: build {c['verdict']}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
