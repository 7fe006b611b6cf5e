"""What the index checks inside an ONNX program cost (:mod:`cuvil_pgc.recompile.onnx_index_checks`).

Exports the model as a region is exported and as a user exports it (the plain
``torch.onnx.export``, :func:`~cuvil_pgc.recompile.runtime_build.plain_exports`), and times ONNX Runtime and OpenVINO on both, called plainly with NumPy inputs, in one
process, in interleaved rounds (medians), at one thread. The default model is a small Hugging Face
LayoutLM, which embeds each box's width and height (``bbox[..., 2] - bbox[..., 0]``): two indices
no check before the call bounds.

    python benchmarks/index_checks.py [--model MODULE_OR_FILE:FACTORY] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path


def layoutlm():
    """A 2-layer LayoutLM: token ids and their boxes (x0, y0, x1, y1 in 0-1000)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LayoutLMConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                           vocab_size=300, max_2d_position_embeddings=1024)
    g = torch.Generator().manual_seed(2)
    x0, y0 = torch.randint(0, 500, (2, 16), generator=g), torch.randint(0, 500, (2, 16), generator=g)
    box = torch.stack([x0, y0, x0 + torch.randint(1, 400, (2, 16), generator=g),
                       y0 + torch.randint(1, 400, (2, 16), generator=g)], -1)
    return T.LayoutLMModel(cfg).eval(), {"input_ids": torch.randint(0, 300, (2, 16), generator=g), "bbox": box,
                                         "attention_mask": torch.ones(2, 16, dtype=torch.long)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="MODULE_OR_FILE:FACTORY (default: a small LayoutLM)")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()

    import onnx
    import onnxruntime as ort
    import openvino as ov
    import torch

    from cuvil_pgc._modelspec import load_model_spec
    from cuvil_pgc.recompile.apply import ScopeInputs
    from cuvil_pgc.recompile.measure import time_interleaved
    from cuvil_pgc.recompile.onnx_index_checks import CHECK_OUTPUT
    from cuvil_pgc.recompile.output_template import OutputTemplate
    from cuvil_pgc.recompile.runtime_build import export_onnx, plain_exports
    from cuvil_pgc.recompile.runtime_region import tensor_leaves

    model, inputs = layoutlm() if args.model is None else load_model_spec(args.model)
    scope = ScopeInputs(*((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {}))
    with torch.no_grad():
        reference = model(*scope.args, **scope.kwargs)
    feeds = [t.numpy() for t in tensor_leaves(scope.args, scope.kwargs)]
    work = Path(tempfile.mkdtemp(prefix="cuvil-index-checks-"))
    checked, plain = work / "checked.onnx", work / "plain.onnx"
    outputs = len(OutputTemplate.of(reference).tensors)
    export_onnx(model, scope, checked, outputs)
    with plain_exports():
        export_onnx(model, scope, plain, outputs)
    graph = onnx.load(str(checked)).graph
    if graph.output[-1].name != CHECK_OUTPUT:
        print("the program has no index to check: nothing to measure")
        return 0
    checks = sum(n.op_type == "ReduceSum" and n.output[0].startswith("cuvil_") for n in graph.node)

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    core = ov.Core()
    contenders = {}
    for name, path in (("unchecked", plain), ("checked", checked)):
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        contenders[f"ONNX Runtime, {name}"] = (lambda s=session, f=dict(zip(names, feeds, strict=True)): s.run(None, f))
        request = core.compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": "1", "PERFORMANCE_HINT": "LATENCY",
                                                        "INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
        contenders[f"OpenVINO, {name}"] = (lambda r=request: r.infer(feeds))
    samples = time_interleaved(contenders, rounds=args.rounds)
    medians = {name: statistics.median(s.seconds) * 1e6 for name, s in samples.items()}
    print(f"{checks} checked indices; medians of {args.rounds} interleaved rounds, 1 thread")
    for name, us in medians.items():
        print(f"  {name:28s} {us:8.1f} µs")
    for runtime in ("ONNX Runtime", "OpenVINO"):
        ratio = medians[f"{runtime}, checked"] / medians[f"{runtime}, unchecked"]
        print(f"  {runtime}: checked / unchecked = {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
