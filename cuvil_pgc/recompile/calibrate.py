"""Per-machine calibration of the backends' fixed per-call cost (the BackendOverheadModel's data).

A probe module with two pointwise ops is measured once per machine (and thread count) in every
backend variant — eager, torch.compile, torch.compile with cpp_wrapper, an AOTInductor package,
CUDA graphs on CUDA, and the runtimes usable here (ONNX Runtime, OpenVINO, TensorRT on CUDA) —
interleaved, like any candidate. The measurements go to the record database
as ordinary records of the probe, so the cost models' refit sees them with every other record of
this machine: the fixed costs are measured here, not assumed. Runs only when the database holds no
probe records for this machine; costs one AOTInductor compile (~30 s on a small CPU).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.apply import ScopeInputs, measurement_key, realize
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.matching import structural_hash
from cuvil_pgc.recompile.measure import time_interleaved
from cuvil_pgc.recompile.records import STARTED, Journal, Record, RecordDB
from cuvil_pgc.recompile.search_records import probe_features

log = logging.getLogger(__name__)

#: the reason recorded for a probe that ended the process of an earlier calibration
ENDED_PROBE = "its probe ended the process of an earlier calibration"
PROBE_CONFIGS = (Candidate(""), Candidate("", "compile"), Candidate("", "compile", cpp_wrapper=True),
                 Candidate("", "aoti"))


class OverheadProbe(nn.Module):
    """Two pointwise ops on a tiny tensor: the time is the backend's fixed cost."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


def calibrate_backends(db: RecordDB, machine_key: str, device: str = "cpu", rounds: int = 25) -> int:
    """Measure the probe in every backend variant unless already recorded; returns records added."""
    probe = OverheadProbe().eval()
    inputs = ScopeInputs((torch.randn(1, 8, device=device),))
    structure = structural_hash(probe)
    configs = list(PROBE_CONFIGS) + ([Candidate("", "cudagraphs", mode="reduce-overhead")]
                                     if device.startswith("cuda") else [])
    configs += [Candidate("", backend) for backend in runtimes.available(device)]

    journal = Journal(db)

    def mark(cand: Candidate) -> Record:
        return Record(structure, measurement_key(cand), machine_key, inputs.signature, STARTED)

    todo = [c for c in configs if journal.settled(db.lookup(*mark(c).key), ENDED_PROBE, _ended_warning(c)) is None]
    if not todo:
        return 0
    fns = {}
    try:
        for cand in todo:
            journal.started(mark(cand))     # replaced by its own record below
            try:
                module = realize(probe, cand, inputs, device=device, machine=machine_key).module
                with torch.no_grad():
                    module(*inputs.args)
                fns[cand.config] = (cand, module)
                journal.leave(mark(cand).key)      # built, to be timed: a fault from here on is not its own
            except Exception as exc:   # a backend that does not work here is not calibrated, and not tried again
                log.info("calibration of %s failed: %s", cand.config, exc)
                db.add(replace(mark(cand), status="compile_error", reason=f"{type(exc).__name__}: {exc}"[:500]))
                journal.done(mark(cand).key)
        with torch.no_grad():
            samples = time_interleaved({"eager": lambda: probe(*inputs.args),
                                        **{k: (lambda m=m: m(*inputs.args)) for k, (_, m) in fns.items()}},
                                       rounds=rounds)
    except BaseException:      # an interrupt: no fault of the probes, the next calibration measures them
        journal.leave()
        raise
    eager_us = samples["eager"].median_s * 1e6
    # on a GPU its three kernels of 8 elements take next to nothing: all of eager's time is the host's
    feats = ScopeFeatures(scope="", path="", bottleneck="launch_overhead", eager_us=eager_us, ops=3,
                          pointwise_ops=3, flops=32, bytes=128, labels=["launch_overhead"],
                          evidence={"gpu_us": 0.0} if device.startswith("cuda") else {})
    measured = {"eager": (Candidate(""), None), **fns}
    for key, (cand, _) in measured.items():
        db.add(Record(structure=structure, candidate=measurement_key(cand), machine=machine_key, inputs=inputs.signature,
                      status="ok", median_us=samples[key].median_s * 1e6, eager_us=eager_us,
                      features=probe_features(cand, feats)))
    return len(measured)


def _ended_warning(cand: Candidate) -> str:
    return (f"cuvil-pgc: the {cand.backend} backend is not calibrated on this machine: its probe ended the process "
            "of an earlier calibration (a native fault of the runtime, or the process was killed); `cuvil-pgc cache "
            "clear --kind records` measures it again")
