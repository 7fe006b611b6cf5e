"""tests/_profiled.py's counted times: what tests read from a recorded trace does not depend on
the machine or its load."""

import json

import torch
from torch import nn

from tests._profiled import GAP_US, OP_US, record_trace


def _timeline(path):
    return [(e["name"], e["ts"], e["dur"]) for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]


def test_two_recordings_have_the_same_times_and_the_recorded_nesting(tmp_path):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), torch.randn(2, 8)
    first = _timeline(record_trace(model, (x,), tmp_path / "a.json", calls=2))
    assert first == _timeline(record_trace(model, (x,), tmp_path / "b.json", calls=2))
    regions = {name: (ts, dur) for name, ts, dur in first if name.startswith("model")}
    (root_ts, root_dur), (relu_ts, relu_dur) = regions["model"], regions["model.1"]
    assert root_ts < relu_ts and relu_ts + relu_dur < root_ts + root_dur       # nested as recorded
    ops = [(ts, dur) for name, ts, dur in first if name == "aten::clamp_min"]
    assert len(ops) == 2 and all(dur == OP_US for _, dur in ops)              # an operator with none inside
    assert ops[0][0] + OP_US + GAP_US <= ops[1][0]
