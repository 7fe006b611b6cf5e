"""FLOP and byte estimates for the operators of traces recorded elsewhere.

Our operator sampler writes each op's estimate into the trace (``flops``, ``bytes``; see
:mod:`cuvil_pgc.instrument.samplers.op_cost`). A torch.profiler (Kineto) trace recorded with
``record_shapes=True`` carries the same shapes and dtypes (``Input Dims``, ``Input type``) but no
estimate (only ``with_flops=True`` adds FLOPs, for matmuls and convolutions), so its regions had
no work to weigh against the machine's roofs, and fusion candidates no intermediate bytes.
:func:`estimate_missing` makes the estimate from the recorded shapes where the trace has none,
once per distinct (op, shapes, dtypes): a loop repeats the same calls. Kineto does not keep the
scalar arguments (strides, padding), so a convolution's estimate is the one the shapes allow.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.instrument.samplers.op_cost import estimate_cost
from cuvil_pgc.trace.columns import Trace


def estimate_missing(trace: Trace, rows: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> None:
    """Fill ``flops`` and ``nbytes`` (per row of ``rows``, in place) from each op's recorded shapes
    where both are unknown (NaN); ops without shapes stay unknown."""
    todo = np.nonzero(np.isnan(flops) & np.isnan(nbytes))[0]
    if not len(todo) or not len(trace.args):
        return
    args = trace.args
    codes = args.shared_codes(rows[todo]) if hasattr(args, "shared_codes") else np.full(len(todo), -1)
    names = trace.events["name"][rows[todo]].astype(np.int64)
    shared = codes >= 0
    if shared.any():
        fill = todo[shared]
        pairs = np.stack([names[shared], codes[shared]], axis=1)
        _, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        costs = np.array([_cost(trace, int(rows[fill[i]])) for i in first.tolist()])
        flops[fill], nbytes[fill] = costs[inverse.reshape(-1), 0], costs[inverse.reshape(-1), 1]
    for i in todo[~shared].tolist():
        flops[i], nbytes[i] = _cost(trace, int(rows[i]))


def _cost(trace: Trace, row: int) -> tuple[float, float]:
    """(FLOPs, bytes) of one op row from its args' shapes; NaN where unknown."""
    a = trace.args.get(row)
    shapes = a.get("shapes") if isinstance(a, dict) else None
    if not shapes:
        return np.nan, np.nan
    cost = estimate_cost(trace.strings[int(trace.events["name"][row])], shapes, a.get("dtypes") or [],
                         a.get("concrete_inputs"))
    return (np.nan if cost.flops is None else float(cost.flops), np.nan if cost.bytes is None else float(cost.bytes))
