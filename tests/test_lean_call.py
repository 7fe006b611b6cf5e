"""A built region's lean call (lean_call.py): the C version (_leancall.c) against the Python one, its
gate and its checks, and a built region's call with each: what it hands its runtime, what it leaves
to the checked path, and torch.jit's tracer, which must record a region's call rather than run it."""

from __future__ import annotations

import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import lean_call, realized, recorded_calls, runtimes
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.lean_call import (
    MISFIT,
    VALUE,
    python_ids_fit,
    python_keyword_positions,
    python_lean_arrays,
    python_lean_call,
)

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")

IMPLEMENTATIONS = [pytest.param(python_lean_arrays, id="python")]
CALLS = [pytest.param(python_lean_call, id="python")]
IDS_FIT = [pytest.param(python_ids_fit, id="python")]
if lean_call.ACCELERATED:
    from cuvil_pgc.recompile import _leancall

    IMPLEMENTATIONS.append(pytest.param(_leancall.lean_arrays, id="c"))
    CALLS.append(pytest.param(_leancall.lean_call, id="c"))
    IDS_FIT.append(pytest.param(_leancall.ids_fit, id="c"))

U64, U32 = np.dtype(np.uint64), np.dtype(np.uint32)
F = torch.Size([2, 3])


def _cases():
    """(name, positional, checks, ids, whether the call fits)."""
    x = torch.randn(2, 3)
    ids = torch.tensor([[0, 4, 9]])
    ids32 = ids.to(torch.int32)
    row_limit = np.array([[5, 5, 10]], dtype=np.uint64)        # element-wise: the last id may reach 9
    tensor = (F, torch.float32)
    id_check = (torch.Size([1, 3]), torch.int64)
    free, free_b = ([(0, 1, 8), 3], torch.float32), ([(1, 1, 8), 3], torch.float32)
    ids_free = ([(0, 1, 8), (2, 1, 64)], torch.int64)
    return [
        ("fits", (x,), [tensor], (), True),
        ("other shape", (torch.randn(3, 2),), [tensor], (), False),
        ("other dtype", (x.double(),), [tensor], (), False),
        ("not contiguous", (torch.randn(3, 2).t(),), [tensor], (), False),
        ("needs grad", (x.clone().requires_grad_(),), [tensor], (), False),
        ("a Parameter (a subclass)", (nn.Parameter(x.clone(), requires_grad=False),), [tensor], (), False),
        ("not a tensor", ([[0.0] * 3] * 2,), [tensor], (), False),
        ("fewer inputs", (x,), [tensor, tensor], (), False),
        ("None captured as None", (x, None), [tensor, (None, None)], (), True),
        ("a tensor where None was captured", (x, x), [tensor, (None, None)], (), False),
        ("the captured value", (x, 3), [tensor, (VALUE, 3)], (), True),
        ("another value", (x, 4), [tensor, (VALUE, 3)], (), False),
        ("a value of another type", (x, True), [tensor, (VALUE, 1)], (), False),
        ("ids in range", (ids,), [id_check], ((0, U64, 10, None),), True),
        ("an id at the table's end", (ids,), [id_check], ((0, U64, 9, None),), False),
        ("a negative id", (ids - 1,), [id_check], ((0, U64, 10, None),), False),
        ("int32 ids in range", (ids32,), [(torch.Size([1, 3]), torch.int32)], ((0, U32, 10, None),), True),
        ("a negative int32 id", (ids32 - 1,), [(torch.Size([1, 3]), torch.int32)], ((0, U32, 10, None),), False),
        ("ids below their element-wise limits", (ids,), [id_check], ((0, U64, 0, row_limit),), True),
        ("an id past its element-wise limit", (ids + torch.tensor([[0, 1, 0]]),), [id_check],
         ((0, U64, 0, row_limit),), False),
        ("ids of the second tensor", (x, None, ids), [tensor, (None, None), id_check], ((1, U64, 10, None),), True),
        ("a 0-dim tensor", (torch.tensor(0.5),), [(torch.Size([]), torch.float32)], (), True),
        # free shapes (a program for other sizes): per dimension a size or (name, smallest, largest)
        ("a free size in range", (torch.randn(5, 3),), [free], (), True),
        ("a free size at both ends", (torch.randn(1, 3), torch.randn(8, 3)), [free, free_b], (), True),
        ("a free size above its range", (torch.randn(9, 3),), [free], (), False),
        ("a free size below its range", (torch.randn(0, 3),), [free], (), False),
        ("a fixed size of a free shape", (torch.randn(5, 4),), [free], (), False),
        ("another rank than a free shape", (torch.randn(5, 3, 1),), [free], (), False),
        ("sizes of one name equal", (torch.randn(4, 3), torch.randint(0, 9, (4, 7))), [free, ids_free], (), True),
        ("sizes of one name unequal", (torch.randn(4, 3), torch.randint(0, 9, (5, 7))), [free, ids_free], (), False),
        ("two names apart", (torch.randn(4, 3), torch.randn(5, 3)), [free, free_b], (), True),
        ("free ids in range", (torch.randint(0, 9, (2, 30)),), [ids_free], ((0, U64, 9, None),), True),
        ("free ids past the table", (torch.randint(9, 10, (2, 30)),), [ids_free], ((0, U64, 9, None),), False),
        ("a free name out of bounds", (torch.randn(5, 3),), [([(16, 1, 8), 3], torch.float32)], (), False),
    ]


CASES = _cases()


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lean_arrays_takes_exactly_the_calls_that_fit(impl, case):
    _, positional, checks, ids, fits = case
    arrays = impl(positional, checks, ids, torch.Tensor, VALUE)
    if not fits:
        assert arrays is None
        return
    tensors = [a for a in positional if isinstance(a, torch.Tensor)]
    assert arrays is not None and len(arrays) == len(tensors)
    for array, tensor in zip(arrays, tensors, strict=True):
        assert isinstance(array, np.ndarray) and np.shares_memory(array, tensor.numpy())   # views, no copies


@pytest.mark.skipif(not lean_call.ACCELERATED, reason="the C lean call is not built")
def test_the_c_checks_answer_as_the_python_ones_on_random_calls():
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows = int(rng.integers(1, 50))
        ids = torch.from_numpy(rng.integers(-3, 55, size=(1, int(rng.integers(1, 40)))))
        limit = None if rng.random() < 0.5 else rng.integers(0, 60, size=tuple(ids.shape)).astype(np.uint64)
        checks = [(ids.shape, torch.int64)]
        spec = ((0, U64, rows, limit),)
        python = python_lean_arrays((ids,), checks, spec, torch.Tensor, VALUE)
        c = _leancall.lean_arrays((ids,), checks, spec, torch.Tensor, VALUE)
        assert (python is None) == (c is None), (ids, rows, limit)
        assert _leancall.ids_fit((ids,), spec) == python_ids_fit((ids,), spec) == (python is not None)
    for _ in range(300):                  # free shapes: named sizes, ranges, fixed sizes, ranks
        shapes = [tuple(int(n) for n in rng.integers(0, 5, size=int(rng.integers(0, 4)))) for _ in range(2)]
        checks = [([int(n) if rng.random() < 0.4 else (int(rng.integers(0, 3)), int(rng.integers(0, 3)),
                                                        int(rng.integers(2, 5))) for n in rng.integers(0, 5, size=len(shape))],
                   torch.float32) for shape in shapes]
        call = tuple(torch.zeros(shape) for shape in shapes)
        python = python_lean_arrays(call, checks, (), torch.Tensor, VALUE)
        c = _leancall.lean_arrays(call, checks, (), torch.Tensor, VALUE)
        assert (python is None) == (c is None), (shapes, checks)


@pytest.mark.parametrize("impl", IDS_FIT)
def test_ids_fit_checks_tensors_and_arrays_alike(impl):
    """What the direct call of an AOTInductor or torch.compile region asks of its CPU id inputs."""
    cases = [case for case in CASES if case[3]]
    assert len(cases) >= 8
    for name, positional, _, ids, fits in cases:
        tensors = [a for a in positional if isinstance(a, torch.Tensor)]
        assert impl(tensors, ids) is fits and impl([t.numpy() for t in tensors], ids) is fits, name
    assert impl([torch.zeros(3, dtype=torch.int64)], ()) is True


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_a_call_torch_jit_traces_does_not_fit(impl):
    """The tracer hands sizes out as tensors: a traced call must be recorded, not run."""
    seen = []

    def traced(x):
        seen.append(impl((x,), [(F, torch.float32)], (), torch.Tensor, VALUE))
        return x * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(traced, (torch.randn(2, 3),), check_trace=False)
    assert seen == [None]
    assert impl((torch.randn(2, 3),), [(F, torch.float32)], (), torch.Tensor, VALUE) is not None   # not traced: fits


def test_the_c_checks_are_built_where_a_compiler_is():
    """The install builds them when it can; losing them silently costs 3% of a tiny BERT's call."""
    if not (shutil.which("cc") or shutil.which("gcc")) or os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        pytest.skip("no C compiler here, or pure Python forced")
    assert lean_call.ACCELERATED, "pip install -e . did not build cuvil_pgc/recompile/_leancall.c"


# ----------------------------------------------------------------------------- keyword calls

KEYWORDS = [pytest.param(python_keyword_positions, id="python")]
if lean_call.ACCELERATED:
    KEYWORDS.append(pytest.param(_leancall.keyword_positions, id="c"))


@pytest.mark.parametrize("impl", KEYWORDS)
def test_keyword_positions_binds_the_captured_names_and_the_extras_seen(impl):
    ids, mask, past = object(), object(), object()
    names, strict, filled = ("input_ids", "past", "attention_mask"), (MISFIT,) * 3, (MISFIT, None, MISFIT)
    extras = {"return_dict": True, "scale": 1.0}
    cases = [
        ((), {"input_ids": ids, "past": past, "attention_mask": mask}, strict, (ids, past, mask)),
        ((ids,), {"attention_mask": mask, "past": past}, strict, (ids, past, mask)),      # any order
        ((ids, past, mask), {}, strict, (ids, past, mask)),
        ((), {"input_ids": ids, "attention_mask": mask}, strict, None),                   # left out, no default
        ((), {"input_ids": ids, "attention_mask": mask}, filled, (ids, None, mask)),      # left out: its default
        ((ids,), {"attention_mask": mask}, filled, (ids, None, mask)),
        ((), {"input_ids": ids}, filled, None),                                           # a required one left out
        ((ids, past, mask), {"return_dict": True}, strict, (ids, past, mask)),            # an extra seen, same value
        ((ids, past, mask), {"scale": 1.0}, strict, (ids, past, mask)),
        ((ids, past, mask), {"return_dict": False}, strict, None),                        # another value
        ((ids, past, mask), {"return_dict": 1}, strict, None),                            # another type
        ((ids, past, mask), {"output_attentions": False}, strict, None),                  # never seen
        ((ids, past), {"input_ids": ids, "attention_mask": mask}, strict, None),          # a position twice
        ((ids, past, mask, mask), {}, strict, None),                                      # more than captured
    ]
    for call, kwargs, fills, expected in cases:
        got = impl(call, kwargs, names, fills, extras)
        assert got is None if expected is None else got is not None and len(got) == len(expected) \
            and all(a is b for a, b in zip(got, expected, strict=True)), (call, kwargs, fills)


# ----------------------------------------------------------------------------- the gate


class FakeRegion:
    """What the lean call reads of a CompiledRegion: the hook counter it last found quiet at, its
    look again (``_quiet``), and its mode."""

    def __init__(self, quiet=True):
        self._quiet_at = torch.utils.hooks.RemovableHandle.next_id
        self.training = False
        self.looked = []
        self.quiet = quiet

    def _quiet(self):
        self.looked.append(1)
        if self.quiet:
            self.__dict__["_quiet_at"] = torch.utils.hooks.RemovableHandle.next_id
        return self.quiet


def _lean(run, single=True, build=None, ids=(), sized=True, layout=None, count=1):
    return (count, [(F, torch.float32)] * (count if layout is None else 2), run, single, build, ids, sized, layout)


@pytest.mark.parametrize("impl", CALLS)
def test_the_lean_call_runs_the_runtime_only_where_nothing_disturbs_the_call(impl):
    x = torch.randn(2, 3)
    ran = []

    def run(arrays):
        ran.append(arrays)
        return [torch.from_numpy(arrays[0]) * 2, "second"]

    region = FakeRegion()
    torch.testing.assert_close(impl(region, _lean(run), (x,)), x * 2)
    assert len(ran) == 1 and np.shares_memory(ran[0][0], x.numpy()) and region.looked == []
    assert impl(region, _lean(run), (x, x)) is MISFIT                   # another count
    assert impl(region, _lean(run), (x.double(),)) is MISFIT            # a check fails
    region.training = True
    assert impl(region, _lean(run), (x,)) is MISFIT
    region.training = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert impl(region, _lean(run), (x,)) is MISFIT
    assert len(ran) == 1
    handle = nn.Linear(1, 1).register_forward_hook(lambda *a: None)     # a handle was handed out: look again
    assert impl(region, _lean(run), (x,)) is not MISFIT and region.looked == [1]
    handle.remove()
    hooked = FakeRegion(quiet=False)
    nn.Linear(1, 1).register_forward_hook(lambda *a: None)
    assert impl(hooked, _lean(run), (x,)) is MISFIT and hooked.looked == [1]
    assert len(ran) == 2


@pytest.mark.parametrize("impl", CALLS)
def test_the_lean_call_rebuilds_the_output_and_lets_the_runtime_s_errors_through(impl):
    x = torch.randn(2, 3)
    outputs = [torch.ones(1), torch.zeros(1)]
    region = FakeRegion()
    assert impl(region, _lean(lambda a: outputs, single=False, build=tuple), (x,)) == tuple(outputs)
    nested = _lean(lambda a: [torch.from_numpy(a[0]) + torch.from_numpy(a[1])], layout=(("dict", ("a", "b")),))
    torch.testing.assert_close(impl(region, nested, ({"b": x, "a": x},)), x * 2)
    assert impl(region, nested, ({"a": x},)) is MISFIT

    def failing(arrays):
        raise ValueError("the runtime's own error")

    with pytest.raises(ValueError, match="the runtime's own error"):
        impl(region, _lean(failing), (x,))
    traced = []

    def scalar(t):
        traced.append(impl(region, (1, [(torch.Size([]), torch.float32)], lambda a: [t], True, None, (), False, None),
                           (t,)))
        return t * 2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(scalar, (torch.tensor(0.5),), check_trace=False)
    assert traced == [MISFIT]                                             # 0-dim inputs: the tracer asked


# ----------------------------------------------------------------------------- a region's call


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.emb(ids))


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.5))

    def forward(self, t):
        return torch.tanh(t * self.w)


@pytest.fixture(params=CALLS)
def checks_impl(request, monkeypatch):
    """Each region test runs with each version of the lean call."""
    monkeypatch.setattr(realized, "lean_call", request.param)
    return request.param


def _region(model, *inputs):
    region = realize(model, Candidate("", "ort"), ScopeInputs(inputs), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(1) or real_forward(*a, **k)
    return region, forwards


@needs_ort
def test_a_region_runs_its_ids_on_the_runtime_and_leaves_the_rest_to_the_checked_path(checks_impl):
    torch.manual_seed(0)
    model, ids = Tagger().eval(), torch.randint(0, 50, (2, 7))
    region, forwards = _region(model, ids)
    with torch.no_grad():
        other = torch.randint(0, 50, (2, 7))
        torch.testing.assert_close(region(other), model(other), rtol=1e-4, atol=1e-5)
        assert forwards == []                                     # the lean call
        for bad in (torch.full((2, 7), 50), torch.full((2, 7), -1)):
            with pytest.raises(IndexError):                       # eager's error, through the checked path
                region(bad)
        assert len(forwards) == 2
        torch.testing.assert_close(region(ids.t().contiguous().t()), model(ids), rtol=1e-4, atol=1e-5)
        assert len(forwards) == 3 and region.fallback_calls == 2  # not contiguous: copied, the program


class Doubled(nn.Module):
    """A module whose forward calls a built region: what torch.jit.trace records around it."""

    def __init__(self, region):
        super().__init__()
        self.region = region

    def forward(self, x):
        return self.region(x) * 2


def _traced(module, example):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")                   # the tracer's own warnings
        return torch.jit.trace(module, (example,), check_trace=False)


@needs_ort
def test_torch_jit_trace_records_a_region_not_its_runtimes_outputs(checks_impl):
    """Traced through the runtime, its outputs were the trace's constants: the traced program
    answered every input with the traced one's result (ONNX Runtime, OpenVINO), or failed the trace
    (AOTInductor). The tracer records the original module, the region's and its parent's trace alike."""
    torch.manual_seed(0)
    model, ids = Tagger().eval(), torch.randint(0, 50, (2, 7))
    region, forwards = _region(model, ids)
    traced_region, traced_parent = _traced(region, ids), _traced(Doubled(region), ids)
    assert len(forwards) == 2 and region.first_fallback == recorded_calls.TRACED
    other = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(traced_region(other), model(other))
        torch.testing.assert_close(traced_parent(other), model(other) * 2)
        calls = region.fallback_calls
        region(other)
        assert region.fallback_calls == calls and len(forwards) == 2      # not traced: the lean call again


@needs_ort
def test_a_region_of_0_dim_inputs_asks_the_tracer(checks_impl):
    """Sizes cannot tell a traced call of 0-dim tensors: the region asks torch.jit."""
    model = Scaled().eval()
    region, forwards = _region(model, torch.tensor(0.3))
    with torch.no_grad():
        torch.testing.assert_close(region(torch.tensor(0.7)), model(torch.tensor(0.7)))
    assert forwards == []                                         # the lean call
    traced = _traced(Doubled(region), torch.tensor(0.3))
    with torch.no_grad():
        torch.testing.assert_close(traced(torch.tensor(-0.9)), model(torch.tensor(-0.9)) * 2)
    assert forwards == [1]


def test_doctor_says_whether_a_builds_calls_are_checked_in_c(monkeypatch):
    from cuvil_pgc.cli.doctor import all_checks, check_call_accel

    assert check_call_accel in all_checks()
    monkeypatch.setattr(lean_call, "ACCELERATED", True)
    assert check_call_accel().ok
    monkeypatch.setattr(lean_call, "ACCELERATED", False)
    monkeypatch.setenv("CUVIL_PGC_PURE_PYTHON", "1")
    forced = check_call_accel()
    assert not forced.ok and "CUVIL_PGC_PURE_PYTHON" in forced.reason and "unset" in forced.fix
    monkeypatch.delenv("CUVIL_PGC_PURE_PYTHON")
    missing = check_call_accel()
    assert not missing.ok and "compiler" in missing.fix


@needs_ort
@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_torch_export_records_a_region_not_its_runtime(checks_impl, strict):
    """torch.export (and torch.onnx.export's dynamo=True) of a loaded build failed: its FakeTensors
    reached the runtime (".numpy() is not supported for tensor subclasses"), and Dynamo's strict
    export stopped at the tracer's test ("torch.* op returned non-Tensor")."""
    torch.manual_seed(0)
    model, ids = Tagger().eval(), torch.randint(0, 50, (2, 7))
    region, forwards = _region(model, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.export.export(Doubled(region), (ids,), strict=strict).module()
    other = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(exported(other), model(other) * 2)   # recorded, not a constant
        calls = len(forwards)
        torch.testing.assert_close(region(other), model(other))
    assert len(forwards) == calls and region.fallback_calls == 0    # (export ran a copy) the lean call


@needs_ort
def test_fake_tensors_run_the_original_module(checks_impl):
    """A tensor subclass (make_fx's or a FakeTensorMode's fakes) cannot be read by the build's
    programs: the original module answers, with fakes of eager's shapes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(0)
    model, ids = Tagger().eval(), torch.randint(0, 50, (2, 7))
    region, _ = _region(model, ids)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
        out = region(mode.from_tensor(ids))
    assert type(out).__name__ == "FakeTensor" and out.shape == (2, 7, 3)
    assert "FakeTensor" in region.first_fallback


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x, table):
        return torch.softmax(self.q(x) @ table.T, -1) @ table


class HandsItsTable(nn.Module):
    """Hands a Parameter of its own to a submodule, as DeBERTa's encoder its relative-position table."""

    def __init__(self):
        super().__init__()
        self.table, self.block, self.out = nn.Parameter(torch.randn(8, 16)), Attend(), nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.block(x, self.table))


@needs_ort
def test_a_parameter_handed_to_a_region_is_read_as_a_plain_tensor():
    """A Parameter is a plain tensor's memory: every call of such a region ran the original module
    ("an input is a Parameter"), so a search measured DeBERTa's attention as eager under every
    candidate. Under autograd the original module answers, as for any input that requires grad."""
    from cuvil_pgc.recompile import recompile

    torch.manual_seed(0)
    model, x = HandsItsTable().eval(), torch.randn(3, 16)
    build = recompile(model, (x,), plan={"block": Candidate("block", "ort")}, records=False, deployed_race=False,
                      rounds=3)
    region = build.module.block
    with torch.no_grad():
        torch.testing.assert_close(build.module(x), model(x))
    assert region.fallback_calls == 0
    build.module(x).sum().backward()
    assert region.fallback_calls == 1 and "requires grad" in region.first_fallback
    assert model.table.grad is not None


class Features(nn.Module):
    """A recommender fed one dict of features, and a list of dense blocks."""

    def __init__(self):
        super().__init__()
        self.user, self.item = nn.Embedding(30, 8), nn.Embedding(40, 8)
        self.top = nn.Linear(24, 1)

    def forward(self, batch, dense):
        h = torch.cat([self.user(batch["user"]), self.item(batch["item"]), dense[0] + dense[1]], -1)
        return {"score": self.top(h).squeeze(-1), "user": h[:, :8]}


def _features(seed):
    g = torch.Generator().manual_seed(seed)
    return ({"user": torch.randint(0, 30, (6,), generator=g), "item": torch.randint(0, 40, (6,), generator=g)},
            [torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)])


@needs_ort
def test_a_region_fed_a_dict_and_a_list_of_tensors_takes_the_lean_call(checks_impl):
    """Nested inputs went through nn.Module's dispatch, the hashed signature and pytree flattening
    on every call: a recommender's dict of features ran 74 µs built on ONNX Runtime, against 15 µs
    for the session called plainly and 40 µs for eager, so every search kept eager."""
    torch.manual_seed(0)
    model = Features().eval()
    region, forwards = _region(model, *_features(0))
    with torch.no_grad():
        for seed in (1, 2):                               # the first call learns the lean call
            batch, dense = _features(seed)
            out, ref = region(batch, dense), model(batch, dense)
            torch.testing.assert_close(out["score"], ref["score"], rtol=1e-4, atol=1e-5)
        assert forwards == [1]
        batch, dense = _features(3)
        swapped = {"item": batch["item"], "user": batch["user"]}          # the keys in another order
        torch.testing.assert_close(region(swapped, dense)["score"], model(batch, dense)["score"], rtol=1e-4, atol=1e-5)
        assert forwards == [1]
        with pytest.raises(IndexError):                   # an id past its table: eager's error
            region({"user": batch["user"], "item": batch["item"] + 40}, dense)
        more = {**batch, "extra": batch["user"]}          # other keys, another length: the checked path
        for call in ((more, dense), (batch, dense[:1] * 2 + dense[1:]), (batch, tuple(dense))):
            torch.testing.assert_close(region(*call)["score"], model(*call)["score"], rtol=1e-4, atol=1e-5)
    assert len(forwards) == 5


@pytest.mark.slow
def test_an_aoti_region_fed_a_dict_and_a_list_of_tensors_takes_the_direct_call(monkeypatch):
    """Through the package's own call (its call specs parsed, its arguments flattened, each call)
    the recommender's AOTInductor region took 66 µs against 42 µs for eager, so no search kept it:
    now its runner takes the tensors in the order the export flattened them."""
    torch.manual_seed(0)
    model = Features().eval()
    region = realize(model, Candidate("", "aoti"), ScopeInputs(_features(0)), machine="t").module
    forwards, runs = [], []
    real_forward, real_run = region.forward, region.compiled.loader.boxed_run
    region.forward = lambda *a, **k: forwards.append(1) or real_forward(*a, **k)
    monkeypatch.setattr(region.compiled, "loader", type("Loader", (), {
        "boxed_run": staticmethod(lambda flat: runs.append(1) or real_run(flat)),
        "get_call_spec": region.compiled.loader.get_call_spec}))
    with torch.no_grad():
        for seed in (1, 2):                               # the first call learns the direct call
            out, ref = region(*_features(seed)), model(*_features(seed))
            assert type(out) is dict and out.keys() == ref.keys()
            for key in ref:
                torch.testing.assert_close(out[key], ref[key], rtol=1e-4, atol=1e-5)
        assert forwards == [1] and len(runs) == 2
        batch, dense = _features(3)
        swapped = {"item": batch["item"], "user": batch["user"]}          # the keys in another order
        torch.testing.assert_close(region(swapped, dense)["score"], model(batch, dense)["score"], rtol=1e-4, atol=1e-5)
        assert forwards == [1] and len(runs) == 3
        with pytest.raises(IndexError):                   # an id past its table: eager's error
            region({"user": batch["user"], "item": batch["item"] + 40}, dense)
        for call in (({**batch, "extra": batch["user"]}, dense), (batch, tuple(dense)), (batch, dense[:1] * 2 + dense[1:])):
            torch.testing.assert_close(region(*call)["score"], model(*call)["score"], rtol=1e-4, atol=1e-5)
        assert len(forwards) == 5 and len(runs) == 3      # other structures: the checked path, the original module


def test_flat_leaves_takes_the_captured_structure_only():
    t = torch.zeros(1)
    layout = lean_call.nested_layout(({"a": t, "b": t}, [t, t], None, 3))
    assert layout == (("dict", ("a", "b")), ("list", 2), None, None)
    assert lean_call.flat_leaves(({"b": 2, "a": 1}, [3, 4], None, 5), layout) == [1, 2, 3, 4, None, 5]
    for other in (({"a": t}, [t, t], None, 3), ({"a": t, "c": t}, [t, t], None, 3),
                  ({"a": t, "b": t}, (t, t), None, 3), ({"a": t, "b": t}, [t], None, 3)):
        assert lean_call.flat_leaves(other, layout) is None
    assert lean_call.nested_layout(({"a": [t]},)) is None and lean_call.nested_layout(([t, None],)) is None


def test_a_time_measured_through_an_older_call_is_measured_again(tmp_path, monkeypatch):
    """A recorded time includes the region's call: one taken before nested inputs had a lean call
    (74 µs for 19) kept eager for the recommender in every later search on the machine."""
    from cuvil_pgc.recompile import apply
    from cuvil_pgc.recompile.records import Record, RecordDB
    from cuvil_pgc.recompile.search_records import SearchRecords

    db = RecordDB(tmp_path / "rec")
    inputs = {"": ScopeInputs((torch.randn(2, 4),))}
    records = SearchRecords(db, "m", {"": "s"}, {"": "settings"}, {"": "w"}, inputs)
    ort, eager = Candidate("", "ort"), Candidate("", "eager")
    for cand in (ort, eager):
        db.add(Record(structure=records._structure(""), candidate=apply.measurement_key(cand), machine="m",
                      inputs=inputs[""].signature, status="ok", median_us=74.0))
    assert records.reusable(ort) is not None and records.reusable(eager) is not None
    monkeypatch.setattr(apply, "CALL_VERSION", realized.CALL_VERSION + 1)     # the call changed since
    assert records.reusable(ort) is None
    assert records.reusable(eager) is not None            # eager runs no region's call
    assert apply.measurement_key(ort).startswith(apply.program_key(ort))        # cached programs stay keyed alike
