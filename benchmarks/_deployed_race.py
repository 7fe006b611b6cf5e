"""Contenders raced each in its own process, as deployed (``recompile_speedup.py --deployed``).

A worker process sets up one contender the way a deployment runs it: the eager model,
``torch.compile`` of it, an AOTInductor package's runner, an ONNX Runtime session or an OpenVINO
compiled model made from the exported file, or the saved, signed build through ``load_build``;
then it serves timing requests
(``cuvil_pgc.recompile.process_race``, which the recompiler's own race in worker processes uses
too: balanced orders, 5 ms samples, three processes per contender, see its docstring for why).

    python benchmarks/_deployed_race.py '{"kind": "ort", "model": "mlp", "threads": 1, "path": "m.onnx"}'
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def race_in_processes(specs: dict[str, dict], rounds: int, replicas: int = 3,
                      min_sample_s: float | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """Median seconds per call of each contender in ``specs`` (see :func:`contender`), each in
    ``replicas`` worker processes of its own (samples of at least ``min_sample_s``, default
    process_race's); and why a contender's worker failed to start."""
    samples, failed = race_samples(specs, rounds, replicas, min_sample_s)
    return {k: s.median_s for k, s in samples.items()}, failed


def race_samples(specs: dict[str, dict], rounds: int, replicas: int = 3,
                 min_sample_s: float | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`race_in_processes`' per-round samples (``measure.Samples``, rounds in the same order
    for every contender: what a ratio's confidence interval resamples jointly)."""
    from cuvil_pgc.recompile import process_race

    commands = {k: [sys.executable, os.path.join(HERE, "_deployed_race.py"), json.dumps(spec)] for k, spec in specs.items()}
    return process_race.race_in_processes(commands, rounds, replicas,
                                          min_sample_s=min_sample_s or process_race.MIN_SAMPLE_S)


def contender(spec: dict):
    """A zero-argument call of the contender ``spec`` names, set up in this process."""
    import torch

    sys.path.insert(0, HERE)
    from recompile_speedup import load

    torch.set_num_threads(spec["threads"])
    model, inputs = load(spec["model"])
    kind = spec["kind"]
    # what an exported file takes: the tensors alone, in order (a tokenizer's mapping that skips a
    # parameter, GPT-2's attention_mask after past_key_values, leaves None in the positional call)
    tensors = [t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
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
    if kind == "aoti":       # the package's fastest call: its runner on the flat input list, no call spec parsed
        from cuvil_pgc.recompile.aoti_loader import load_aoti_package

        # loaded as the build loads it (with libstdc++ global, which CUDA packages need)
        loader = load_aoti_package(spec["path"]).loader
        return lambda: loader.boxed_run(list(tensors))
    if kind == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()                 # all graph optimizations: ONNX Runtime's default
        options.intra_op_num_threads = spec["threads"]
        session = ort.InferenceSession(spec["path"], options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda: [torch.from_numpy(o) for o in
                        session.run(None, {n: t.numpy() for n, t in zip(names, tensors, strict=True)})]
    if kind in ("openvino", "openvino-native"):
        import numpy as np
        import openvino as ov

        from cuvil_pgc.recompile.openvino_runner import openvino_config, openvino_input_buffers

        core = ov.Core()
        config = openvino_config({"threads": str(spec["threads"])}, "bf16" if kind == "openvino-native" else "fp32")
        compiled = core.compile_model(core.read_model(spec["path"]), "CPU", config)
        request = compiled.create_infer_request()
        buffers = openvino_input_buffers(request, compiled)

        def call():       # the fastest call measured: small inputs copied into the request's own buffers
            for i, (t, buffer) in enumerate(zip(tensors, buffers, strict=True)):  # (OpenVINO's documented
                if buffer is None:                  # direct data access), larger ones shared; the outputs
                    request.set_input_tensor(i, ov.Tensor(t.numpy(), shared_memory=True))   # infer() copies
                else:
                    np.copyto(buffer, t.numpy())
            return [torch.from_numpy(a) for a in request.infer().to_tuple()]
        return call
    raise ValueError(f"unknown contender kind {kind!r}")


def serve(spec: dict) -> None:
    if spec.get("pure_python"):          # the build's calls checked in Python (before cuvil_pgc is imported)
        os.environ["CUVIL_PGC_PURE_PYTHON"] = "1"
    import torch

    from cuvil_pgc.recompile.process_race import serve as serve_calls

    call = contender(spec)
    with torch.no_grad():
        serve_calls(call)


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
