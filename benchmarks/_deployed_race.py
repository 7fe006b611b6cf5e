"""Contenders raced each in its own process, as deployed (``recompile_speedup.py --deployed``).

A worker process sets up one contender the way a deployment runs it: the eager model,
``torch.compile`` of it, an ONNX Runtime session or an OpenVINO compiled model made from the
exported file, or the saved, signed build through ``load_build``. It warms the contender up, then
answers the parent on stdin: a line ``N`` runs N calls and replies the seconds they took. The
parent takes one sample per worker per round in the balanced orders ``time_interleaved`` uses, so
drifts of the machine hit every contender alike, while each contender runs with a process of its
own instead of inside the long-lived one that searched and compiled. (Measured in that one
process, two ONNX Runtime sessions of the same file differed by up to 25%: the build's, made
early in the search, and one made after it.)

    python benchmarks/_deployed_race.py '{"kind": "ort", "model": "mlp", "threads": 1, "path": "m.onnx"}'
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: a sample lasts at least this long: a worker wakes from its pipe read on a cold core, and with
#: samples of one or two calls (the in-process race's 0.5 ms) every contender measured ~1.7x slower
#: and two processes of one ONNX Runtime contender up to 19% apart; at 5 ms, within 1-4%
MIN_SAMPLE_S = 0.005


def race_in_processes(specs: dict[str, dict], rounds: int, replicas: int = 3) -> tuple[dict[str, float], dict[str, str]]:
    """Median seconds per call of each contender, each in ``replicas`` worker processes of its own
    (their samples pooled); and why a worker failed to start (its contender is then absent).

    A process's memory layout alone moves a contender's time (two processes of the same ONNX
    Runtime contender measured up to 4% apart with 5 ms samples); more rounds do not average that
    out, more processes do."""
    from cuvil_pgc.recompile.measure import balanced_orders, median

    workers, failed, logs = {}, {}, {}
    for name, spec in ((f"{k}#{i}", spec) for k, spec in specs.items() for i in range(replicas)):
        logs[name] = tempfile.TemporaryFile("w+")          # a pipe would fill with warnings and block the worker
        workers[name] = subprocess.Popen([sys.executable, os.path.join(HERE, "_deployed_race.py"), json.dumps(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[name], text=True)
    for name, proc in list(workers.items()):
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            logs[name].seek(0)
            failed[name.partition("#")[0]] = (logs[name].read().strip().splitlines() or ["no output"])[-1][:200]
            del workers[name]
    for name in [n for n in workers if n.partition("#")[0] in failed]:     # a contender runs whole or not at all
        workers.pop(name).kill()
    try:
        once = {name: _sample(proc, 1) for name, proc in workers.items()}
        calls = max(1, min(math.ceil(MIN_SAMPLE_S / max(t, 1e-7)) for t in once.values()))
        names = list(workers)
        orders = balanced_orders(len(names))
        rounds = -(-rounds // len(orders)) * len(orders)
        samples: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for i in orders[r % len(orders)]:
                samples[names[i]].append(_sample(workers[names[i]], calls) / calls)
    finally:
        for proc in workers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
        for log in logs.values():
            log.close()
    pooled: dict[str, list[float]] = {}
    for name, s in samples.items():
        pooled.setdefault(name.partition("#")[0], []).extend(s)
    return {name: median(s) for name, s in pooled.items()}, failed


def _sample(proc: subprocess.Popen, calls: int) -> float:
    proc.stdin.write(f"{calls}\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def contender(spec: dict):
    """A zero-argument call of the contender ``spec`` names, set up in this process."""
    import torch

    sys.path.insert(0, HERE)
    from recompile_speedup import load

    torch.set_num_threads(spec["threads"])
    model, inputs = load(spec["model"])
    kind = spec["kind"]
    if kind == "eager":
        return lambda: model(*inputs)
    if kind == "compile":
        compiled = torch.compile(model)
        return lambda: compiled(*inputs)
    if kind == "build":
        from cuvil_pgc import load_build

        fast = load_build(spec["path"], model, pubkey=spec["pubkey"])
        if fast.cuvil_load_report.skipped:           # regions running eagerly would time another build
            raise RuntimeError(f"the build loaded with regions skipped: {fast.cuvil_load_report.skipped}")
        return lambda: fast(*inputs)
    if kind == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()                 # all graph optimizations: ONNX Runtime's default
        options.intra_op_num_threads = spec["threads"]
        session = ort.InferenceSession(spec["path"], options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda: [torch.from_numpy(o) for o in
                        session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})]
    if kind in ("openvino", "openvino-native"):
        import openvino as ov

        from cuvil_pgc.recompile.runtime_region import openvino_config

        core = ov.Core()
        config = openvino_config({"threads": str(spec["threads"])}, "bf16" if kind == "openvino-native" else "fp32")
        compiled = core.compile_model(core.read_model(spec["path"]), "CPU", config)
        request = compiled.create_infer_request()

        def call():       # the fastest call measured: shared input tensors, the outputs infer() copies; a
            for i, t in enumerate(inputs):          # tiny BERT's infer(..., share_inputs=True) ran 9-13% slower
                request.set_input_tensor(i, ov.Tensor(t.numpy(), shared_memory=True))
            return [torch.from_numpy(a) for a in request.infer().to_tuple()]
        return call
    raise ValueError(f"unknown contender kind {kind!r}")


def serve(spec: dict) -> None:
    import torch

    call = contender(spec)
    with torch.no_grad():
        for _ in range(5):
            call()
        print("ready", flush=True)
        for line in sys.stdin:
            n = int(line)
            start = time.perf_counter()
            for _ in range(n):
                call()
            print(repr(time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
