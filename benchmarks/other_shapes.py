"""A build called at input sizes other than the captured ones (``recompile(..., dynamic=True)``).

Recompiles each model with its plan pinned to the whole model on one runtime, once with
``dynamic=True`` and once without, then times, interleaved in one process at the deployment's
thread count, calls at other batch sizes and sequence lengths:

- ``eager``: the model itself;
- ``static build``: the build without programs for other sizes (such calls run the original module);
- ``free build``: the build with them, loaded with ``size_programs=0``: every other size on the
  free-size program (``free/plain``: the plain runtime's time over this);
- ``sized build``: the build as loaded by default, after each size was called often enough to get a
  program compiled for it alone (:mod:`cuvil_pgc.recompile.size_programs`; OpenVINO only);
- ``plain runtime``: the runtime called plainly on the same free-size export (for AOTInductor the
  same package through ``aoti_load_package``), as a user who exported with dynamic axes would
  (``sized/plain`` is what the build gains over it);
- ``plain sized``: the runtime called plainly on the export compiled for the call's sizes alone
  (OpenVINO's ``reshape``, ONNX Runtime's free-dimension overrides), as a user who compiles one
  program per size would (``sized/plain-sized``: what the build's own call costs over that).

    python benchmarks/other_shapes.py --models transformer,tiny_bert --backend openvino
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="transformer,tiny_bert,gru_tagger",
                   help="comma-separated zoo names or MODULE_OR_FILE:FACTORY")
    p.add_argument("--backend", default="openvino", choices=("ort", "openvino", "aoti"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    sys.path.insert(0, HERE)
    from recompile_speedup import load

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate

    torch.set_num_threads(args.threads)
    columns = ("eager", "static", "free", "sized", "plain", "plain-sized")
    print(f"{'model':<14} {'sizes':<22} " + " ".join(f"{c:>11}" for c in columns)
          + f" {'free/plain':>11} {'sized/plain':>12} {'sized/p-sized':>14}")
    with tempfile.TemporaryDirectory(prefix="cuvil-shapes-") as tmp:
        for name in args.models.split(","):
            model, inputs = load(name)
            if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in inputs):
                print(f"{name}: skipped (needs tensor inputs with a batch and a second dimension)")
                continue
            built = {}
            for dynamic in (False, True):
                build = recompile(model, inputs, plan={"": Candidate("", args.backend)}, records=False,
                                  deployed_race=False, rounds=3, dynamic=dynamic)
                path = build.save(os.path.join(tmp, f"{name.replace('/', '_')}-{dynamic}.cuvilpkg"))
                built[dynamic] = load_build(path, model, allow_unsigned=True)
            built["free"] = load_build(path, model, allow_unsigned=True, size_programs=0)
            other = built[True].other_shapes
            if other is None:
                print(f"{name}: no program for other sizes (see the warning above)")
                continue
            program = _unpacked(path, build.plan.choices[0].other_shapes["artifact"], args.backend, tmp)
            plain = _plain_call(args.backend, program, args.threads)
            for batch, grow in ((inputs[0].shape[0] + 1, 0), (inputs[0].shape[0], -max(1, inputs[0].shape[1] // 2)),
                                (2 * inputs[0].shape[0] + 2, -max(1, inputs[0].shape[1] // 4))):
                x = tuple(_resized(t, batch, t.shape[1] + grow) if isinstance(sizes[1], str) else _resized(t, batch, t.shape[1])
                          for t, (_, sizes) in zip(inputs, other.inputs, strict=True))
                if not other.fits(x):
                    continue
                contenders = {"eager": model, "static": built[False], "free": built["free"], "sized": built[True],
                              "plain": plain}
                if other.size_programs is not None:         # called often enough at this size: its program is made
                    with torch.no_grad():
                        for _ in range(other.size_programs.after):
                            built[True](*x)
                    other.size_programs.wait(600)
                    contenders["plain-sized"] = _plain_call(args.backend, program, args.threads,
                                                            [tuple(t.shape) for t in x])
                ms = _race(contenders, x, args.rounds)
                ms.setdefault("plain-sized", float("nan"))
                print(f"{name:<14} {', '.join(str(tuple(t.shape)) for t in x):<22} "
                      + " ".join(f"{ms[c]:>9.3f}ms" for c in columns)
                      + f" {ms['plain'] / ms['free']:>10.3f}x {ms['plain'] / ms['sized']:>11.3f}x"
                      f" {ms['plain-sized'] / ms['sized']:>13.3f}x", flush=True)
            sizes = other.size_programs
            print(f"{name}: the build ran {built[True].other_shape_calls} calls at other sizes on its programs, "
                  f"{built[True].fallback_calls} on the original module; "
                  + ("no programs of their own (its runtime compiles none)" if sizes is None else
                     f"{sizes.compiled} sizes got one, {sizes.refused} refused"))
    return 0


def _race(contenders: dict, x: tuple, rounds: int) -> dict[str, float]:
    """Median milliseconds per call of each contender on ``x``, interleaved in this process."""
    import torch

    from cuvil_pgc.recompile.measure import time_interleaved

    with torch.no_grad():
        samples = time_interleaved({k: (lambda f=f: f(*x)) for k, f in contenders.items()}, rounds=rounds)
    return {k: s.median_s * 1e3 for k, s in samples.items()}


def _plain_call(backend: str, path: str, threads: int, shapes: list[tuple[int, ...]] | None = None):
    """The free-size export called the way a user calls the runtime (as ``_deployed_race.py``);
    with ``shapes``, compiled for those input sizes alone."""
    import torch

    if backend == "aoti":
        return torch._inductor.aoti_load_package(path)
    if backend == "ort":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.log_severity_level = 3       # as the build's: the export's output shapes name the captured sizes
        if shapes:
            free = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_inputs()
            for i, shape in zip(free, shapes, strict=False):
                for d, n in zip(i.shape, shape, strict=True):
                    if isinstance(d, str):
                        options.add_free_dimension_override_by_name(d, n)
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return lambda *xs: [torch.from_numpy(o) for o in session.run(None, {n: t.numpy() for n, t in zip(names, xs, strict=True)})]
    import openvino as ov

    from cuvil_pgc.recompile.openvino_runner import openvino_config

    core = ov.Core()
    read = core.read_model(path)
    if shapes:
        read.reshape({i: ov.PartialShape(list(shape)) for i, shape in enumerate(shapes)})
    request = core.compile_model(read, "CPU", openvino_config({"threads": str(threads)}, "fp32")).create_infer_request()
    return lambda *xs: [torch.from_numpy(a) for a in request.infer(
        {i: ov.Tensor(t.numpy(), shared_memory=True) for i, t in enumerate(xs)}).to_tuple()]


def _unpacked(path: str, member: str, backend: str, tmp: str) -> str:
    """The build's program for other sizes, unpacked from the verified build at ``path`` (the
    loaded build's own copy is gone once it is loaded)."""
    from cuvil_pgc.recompile.package import open_build

    stem = member.rsplit(".", 1)[0]
    with open_build(path) as vb:
        for name in vb.members():
            if name.rsplit(".", 1)[0] == stem:
                vb.extract(name, tmp)
    return os.path.join(tmp, member)


def _resized(t, batch: int, second: int):
    reps = [-(-batch // t.shape[0]), -(-second // t.shape[1])] + [1] * (t.dim() - 2)
    return t.repeat(*reps)[:batch, :second].contiguous()


if __name__ == "__main__":
    sys.exit(main())
