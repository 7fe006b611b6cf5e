"""Runtime regions at other input sizes (``recompile(..., dynamic=True)``, see
:mod:`cuvil_pgc.recompile.other_shapes`): a service calling a build at another batch size or
sequence length runs an exported program, checked at other sizes, instead of the original module."""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import (
    free_size_programs,
    load_build,
    other_shapes,
    recompile,
    runtimes,
    size_probes,
    size_programs,
)
from cuvil_pgc.recompile.accuracy import AccuracyResult
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.package import open_build

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")
needs_ov = pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")
pytestmark = [pytest.mark.usefixtures("build_env"), pytest.mark.slow]    # ONNX exports: ~5-20 s each here


class Tagger(nn.Module):
    """Token ids (batch, seq) -> per-token scores and a pooled vector: sizes free in batch and seq,
    fixed in the hidden size the weights set."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc, self.head = nn.Embedding(50, 16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc(self.emb(ids)))
        return self.head(h), h.mean(dim=1)


def tagger():
    torch.manual_seed(0)
    return Tagger().eval(), (torch.randint(0, 50, (2, 8)),)


class Scaler(nn.Module):
    """A float input whose last dimension the weights fix."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), dim=-1)


def _build(backend, factory, **kw):
    model, inputs = factory()
    return model, inputs, recompile(model, inputs, plan={"": Candidate("", backend)}, records=False,
                                    deployed_race=False, rounds=3, dynamic=True, **kw)


@needs_ort
def test_a_loaded_build_runs_other_batch_sizes_and_lengths_on_its_runtime_in_a_service_process(tmp_path, keys):
    model, inputs, build = _build("ort", tagger)
    record = build.plan.choices[0].other_shapes
    (dtype, (batch, length)), = record["inputs"]
    assert record["artifact"] == "ort/0-shapes.onnx" and dtype == "int64"
    # checked from 1 up to 16x the captured size (at least 64): the model takes any batch and length
    assert record["ranges"] == {batch: [1, 64], length: [1, 128]}
    assert build.plan.choices[0].runtime["index_bounds"] == {"0": 50}     # the ids index 50 rows
    path = build.save(tmp_path / "t.cuvilpkg", signing_key=str(keys[0]))
    with open_build(path, pubkey=str(keys[1])) as vb:                # signed and verified like every member
        assert "ort/0-shapes.onnx" in vb.members()
    ids = torch.randint(0, 50, (5, 13))
    torch.save({"ids": ids, "state": model.state_dict()}, tmp_path / "in.pt")
    service = textwrap.dedent(f"""
        import json, sys, torch
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        from test_other_shapes import Tagger
        from cuvil_pgc import load_build
        saved = torch.load({str(tmp_path / "in.pt")!r})
        model = Tagger().eval()
        model.load_state_dict(saved["state"])
        fast = load_build({path!r}, model, pubkey={str(keys[1])!r})
        with torch.inference_mode():
            scores, pooled = fast(saved["ids"])
            ref_scores, ref_pooled = model(saved["ids"])
            fast(saved["ids"][:, :4].contiguous())
            refused = []          # ids outside the embedding's 50 rows: eager's IndexError, at either size
            for ids in (saved["ids"].clone().fill_(50), saved["ids"][:, :4].clone().fill_(-1)):
                try:
                    fast(ids)
                except IndexError:
                    refused.append(True)
            for _ in range(2):    # called often: the size gets a session of its own, in the background
                fast(saved["ids"])
            sizes = fast.other_shapes.size_programs
            sizes.wait(300)
            sized = fast(saved["ids"])[0]
        # a service that knows its sizes: their sessions made at load, from the verified build
        known = load_build({path!r}, model, pubkey={str(keys[1])!r},
                           size_examples=[(saved["ids"][:2, :7],), {{"ids": saved["ids"][:1]}}])
        with torch.inference_mode():
            known_err = float((known(saved["ids"][:1])[0] - model(saved["ids"][:1])[0]).abs().max())
        print(json.dumps({{"shape": list(scores.shape), "err": float((scores - ref_scores).abs().max()
                          + (pooled - ref_pooled).abs().max()), "other": fast.other_shape_calls,
                          "fallback": fast.fallback_calls, "refused": refused, "sizes": sizes.sizes(),
                          "sized_err": float((sized - ref_scores).abs().max()),
                          "known": known.cuvil_load_report.size_programs, "known_err": known_err}}))
    """)
    proc = subprocess.run([sys.executable, "-c", service], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["shape"] == [5, 13, 3] and got["err"] < 1e-5 and got["other"] == 5
    assert got["refused"] == [True, True] and got["fallback"] == 2
    assert got["sizes"] == [[[5, 13]]] and got["sized_err"] < 1e-5
    assert got["known"] == ["<model>: (2, 7); (1, 13)"] and got["known_err"] < 1e-5


@needs_ort
def test_a_build_from_one_request_serves_batches_on_its_program():
    """From a batch-1 example (one request, as services capture it) the exporter leaves the ids' and
    the mask's batch free under two names. In a Hugging Face encoder the mask's could change alone
    (a batch-1 mask broadcasts) and the ids' could not, so the ids' stayed fixed and every batched
    call ran the original module. Both vary together now; a call where they differ runs the
    original module."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=50, dim=16, hidden_dim=32, n_layers=1, n_heads=2)
    model = transformers.DistilBertModel(config).eval()
    ids, mask = torch.randint(0, 50, (1, 6)), torch.ones(1, 6, dtype=torch.long)
    build = recompile(model, (ids, mask), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    (_, (batch, length)), (_, (mask_batch, mask_length)) = build.plan.choices[0].other_shapes["inputs"]
    assert (batch, length) == (mask_batch, mask_length)
    assert build.plan.choices[0].other_shapes["ranges"][batch] == [1, 64]
    fast = build.module
    ids3, mask3 = torch.randint(0, 50, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    mask3[1, 5:] = 0
    with torch.no_grad():
        torch.testing.assert_close(fast(ids3, mask3).last_hidden_state, model(ids3, mask3).last_hidden_state)
        assert fast.other_shape_calls == 1 and fast.fallback_calls == 0
        broadcast = fast(ids3, mask3[:1]).last_hidden_state           # the original module's answer
        torch.testing.assert_close(broadcast, model(ids3, mask3[:1]).last_hidden_state)
    assert fast.other_shape_calls == 1 and fast.fallback_calls == 1


@needs_ov
def test_openvino_regions_get_one_too_and_fixed_dimensions_stay_with_the_original_module(tmp_path, caplog):
    model, inputs = Scaler().eval(), (torch.randn(3, 12),)
    build = recompile(model, inputs, plan={"": Candidate("", "openvino")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    (dtype, (batch, features)), = build.plan.choices[0].other_shapes["inputs"]
    assert dtype == "float32" and features == 12 and build.plan.choices[0].other_shapes["ranges"] == {batch: [1, 64]}
    fast = load_build(build.save(tmp_path / "s.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    assert fast.cuvil_load_report.applied == ["<model>: openvino (and other input sizes)"]
    x = torch.randn(7, 12)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
        assert fast.other_shape_calls == 1 and fast.fallback_calls == 0
        with pytest.raises(RuntimeError):                    # 13 features: the original module's own error
            fast(torch.randn(7, 13))
    assert fast.fallback_calls == 1


class Tempered(nn.Module):
    """A 0-dimensional tensor among the inputs (a sampling temperature): no size of it can vary."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x) / temperature, dim=-1)


@needs_ort
def test_a_scalar_tensor_input_stays_as_it_is_while_the_build_probes_other_sizes():
    """The probes resized every tensor input, and a 0-dimensional one has no size: the recompile
    ended in an internal error (an attention block given its temperature, seen on a model nobody
    here made)."""
    model, inputs = Tempered().eval(), (torch.randn(3, 12), torch.tensor(0.7))
    build = recompile(model, inputs, plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    (_, (batch, _)), (_, ()) = build.plan.choices[0].other_shapes["inputs"]
    assert build.plan.choices[0].other_shapes["ranges"][batch] == [1, 64]
    x, temperature = torch.randn(5, 12), torch.tensor(0.5)
    with torch.no_grad():
        torch.testing.assert_close(build.module(x, temperature), model(x, temperature))
    assert build.module.other_shape_calls == 1 and build.module.fallback_calls == 0


@needs_ort
def test_other_sizes_take_the_lean_call_of_the_program_for_other_sizes_after_the_first(tmp_path, monkeypatch):
    model, inputs, build = _build("ort", tagger)
    fast = load_build(build.save(tmp_path / "t.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    x, y = torch.randint(0, 50, (3, 11)), torch.randint(0, 50, (5, 2))
    with torch.no_grad():
        fast(x)                                  # the checked path, which makes the lean call
        assert fast._free_lean
        monkeypatch.setattr(type(fast), "_other_sizes", lambda self, args: pytest.fail("the checked path ran"))
        for z in (x, y, inputs[0][:1]):
            for got, want in zip(fast(z), model(z), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert fast.other_shape_calls == 4 and fast.fallback_calls == 0
        monkeypatch.undo()
        # what the checked path refuses, the lean call does too: a length past the checked range,
        # ids past the table (eager's error), a float where ids were captured
        fast(torch.randint(0, 50, (3, 129)))
        with pytest.raises(IndexError):
            fast(y.clone().fill_(50))
        with pytest.raises(RuntimeError, match="Long, Int"):     # the embedding's own error
            fast(y.float())
        assert fast.other_shape_calls == 4 and fast.fallback_calls == 3

        def broken(arrays):
            raise RuntimeError("a size its checks did not reach")
        count, checks, _, *rest = fast._free_lean
        fast.__dict__["_free_lean"] = (count, checks, broken, *rest)
        monkeypatch.setattr(fast.other_shapes.runner, "call_positional", lambda args: broken(args))
        torch.testing.assert_close(fast(y)[0], model(y)[0])      # the original module answers, counted
        assert fast.other_sizes_failures == 1 and fast.fallback_calls == 4


def _called_often(backend, tmp_path):
    """(model, path, loaded build, its size programs, x) once the build, loaded from ``path``, was
    called at x's size often enough for a program of its own, and that program was made."""
    model, _, build = _build(backend, tagger)
    path = build.save(tmp_path / "t.cuvilpkg")
    fast = load_build(path, copy.deepcopy(model), allow_unsigned=True)
    sizes = fast.other_shapes.size_programs
    x = torch.randint(0, 50, (3, 11))
    with torch.no_grad():
        for _ in range(sizes.after):
            fast(x)
    assert sizes.wait(120) and sizes.sizes() == [((3, 11),)]
    return model, path, fast, sizes, x


@needs_ort
def test_a_size_called_often_gets_an_onnx_runtime_session_of_its_own(tmp_path, monkeypatch):
    model, path, fast, sizes, x = _called_often("ort", tmp_path)
    with torch.no_grad():
        # the loaded build's file is gone: the session of this size was made from the program's bytes
        own = sizes.program(((3, 11),))
        assert own.session.get_inputs()[0].shape == [3, 11]
        for got, want in zip(fast(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert sizes.leans[((3, 11),)] is not None and fast.fallback_calls == 0
    # by default the program's bytes it keeps count against the budget of weight copies
    weights = sum(p.numel() * 4 for p in model.parameters())
    monkeypatch.setattr(size_programs, "WEIGHTS_BUDGET", 3 * weights)
    assert load_build(path, copy.deepcopy(model), allow_unsigned=True).other_shapes.size_programs.capacity == 2
    monkeypatch.setattr(size_programs, "WEIGHTS_BUDGET", weights)
    assert load_build(path, copy.deepcopy(model), allow_unsigned=True).other_shapes.size_programs is None


@needs_ov
def test_a_size_called_often_gets_an_openvino_program_compiled_for_it_alone_and_checked(tmp_path, monkeypatch):
    model, path, fast, sizes, x = _called_often("openvino", tmp_path)
    assert sizes.compiled == 1
    with torch.no_grad():
        own = sizes.runner((x,), (x,))
        assert [str(p.get_partial_shape()) for p in own.compiled.inputs] == ["[3,11]"]    # static, this size only
        for got, want in zip(fast(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert fast.other_shape_calls == sizes.after + 1 and fast.fallback_calls == 0
        # from then on the size's own lean call answers, past the checked path for other sizes
        assert sizes.leans[((3, 11),)] is not None
        monkeypatch.setattr(type(fast), "_other_sizes", lambda self, args: pytest.fail("the checked path ran"))
        for got, want in zip(fast(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert fast.other_shape_calls == sizes.after + 2
        monkeypatch.undo()
        seen = []                                    # a hook added since still sees every call
        handle = fast.original.emb.register_forward_hook(lambda *a: seen.append(1))
        fast(x)
        handle.remove()
        assert seen == [1]
    assert load_build(path, copy.deepcopy(model), allow_unsigned=True, size_programs=0).other_shapes.size_programs is None
    assert load_build(path, copy.deepcopy(model), allow_unsigned=True, size_programs=2).other_shapes.size_programs.capacity == 2
    monkeypatch.setattr(size_programs, "WEIGHTS_BUDGET", 3 * sum(p.numel() * 4 for p in model.parameters()))
    assert load_build(path, copy.deepcopy(model), allow_unsigned=True).other_shapes.size_programs.capacity == 3
    monkeypatch.undo()

    # the program of one size answers only after the accuracy guard passed it against the original module
    strict = load_build(path, copy.deepcopy(model), allow_unsigned=True)
    monkeypatch.setattr(size_probes, "check_outputs",
                        lambda reference, candidate, **kw: AccuracyResult(ok=False, reason="output[0]: max abs err 0.5"))
    with torch.no_grad():
        for _ in range(sizes.after):
            strict(x)
        assert strict.other_shapes.size_programs.wait(120)
        assert strict.other_shapes.size_programs.refused == 1 and strict.other_shapes.size_programs.sizes() == []
        torch.testing.assert_close(strict(x)[0], model(x)[0], rtol=1e-4, atol=1e-5)


@needs_ov
def test_a_service_that_knows_its_sizes_gets_their_programs_at_load(tmp_path, monkeypatch):
    model, _, build = _build("openvino", tagger)
    path = build.save(tmp_path / "t.cuvilpkg")
    x, y = torch.randint(0, 50, (3, 11)), torch.randint(0, 50, (1, 5))
    fast = load_build(path, copy.deepcopy(model), allow_unsigned=True, size_examples=[(x,), {"ids": y}])
    sizes = fast.other_shapes.size_programs
    assert sizes.sizes() == [((3, 11),), ((1, 5),)] and sizes.wait(0)       # made at load, nothing left pending
    assert fast.cuvil_load_report.size_programs == ["<model>: (3, 11); (1, 5)"]
    monkeypatch.setattr(type(fast), "_other_sizes", lambda self, args: pytest.fail("the checked path ran"))
    with torch.no_grad():
        for z in (x, y):                              # each size's own lean call answers from its first call
            for got, want in zip(fast(z), model(z), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert fast.fallback_calls == 0 and all(sizes.leans[k] is not None for k in sizes.sizes())
    monkeypatch.undo()

    with pytest.raises(BuildError, match=r"size_examples\[1\] .*IndexError"):     # ids past the table
        load_build(path, copy.deepcopy(model), allow_unsigned=True, size_examples=[(x,), (x.clone().fill_(50),)])
    with pytest.raises(BuildError, match="size_examples is a Tensor"):
        load_build(path, copy.deepcopy(model), allow_unsigned=True, size_examples=x)
    off = load_build(path, copy.deepcopy(model), allow_unsigned=True, size_programs=0, size_examples=[(x,)])
    assert off.cuvil_load_report.size_programs == [] and "size_programs=0" in off.cuvil_load_report.notes[-1]
    static = recompile(model, (x,), plan={"": Candidate("", "openvino")}, records=False, deployed_race=False, rounds=3)
    fixed = load_build(static.save(tmp_path / "static.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True,
                       size_examples=[(y,)])
    assert "made without `recompile --dynamic`" in fixed.cuvil_load_report.notes[-1]


@needs_ort
def test_a_program_that_fails_at_other_sizes_is_left_out_with_the_reason(monkeypatch, caplog, tmp_path):
    def guard(reference, candidate, **kw):            # the program answers wrongly at any size but the captured
        same = reference[0].shape == (2, 8, 3)
        return AccuracyResult(ok=same, reason="" if same else "output[0]: max abs err 0.5")
    monkeypatch.setattr(size_probes, "check_outputs", guard)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.build"):
        model, inputs, build = _build("ort", tagger)
    assert build.plan.choices[0].other_shapes is None and build.module.other_shapes is None
    assert "<model> (ort) runs only its captured input sizes" in caplog.text
    assert "failed the accuracy guard at sizes (1, 8): output[0]: max abs err 0.5" in caplog.text
    with torch.no_grad():
        build.module(torch.randint(0, 50, (3, 8)))
    assert build.module.fallback_calls == 1
    # the reason travels with the build: a service that loads it is not told to rebuild with --dynamic
    assert "max abs err 0.5" in build.plan.choices[0].other_sizes_refused
    fast = load_build(build.save(tmp_path / "t.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    note, = fast.cuvil_load_report.notes
    assert note.startswith("<model> runs its captured input sizes only") and "max abs err 0.5" in note
    with torch.no_grad():
        fast(torch.randint(0, 50, (3, 8)))
    assert "built with --dynamic, but its program for other sizes was left out: it failed the accuracy guard" \
        in fast.first_fallback and "adds programs" not in fast.first_fallback


@pytest.mark.slow    # torch.compile of a small model
def test_a_torch_compile_region_built_with_dynamic_says_it_serves_its_captured_sizes_only(tmp_path):
    """A Mixtral whose only build was torch.compile, recompiled with --dynamic, told its service
    "`recompile --dynamic` adds programs for other sizes"."""
    model, inputs, build = _build("compile", tagger)
    choice, = build.plan.choices
    assert "a compile region runs its captured sizes only" in choice.other_sizes_refused
    fast = load_build(build.save(tmp_path / "c.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    with torch.no_grad():
        fast(torch.randint(0, 50, (3, 8)))
    assert "built with --dynamic, but its program for other sizes was left out: a compile region" \
        in fast.first_fallback and "adds programs" not in fast.first_fallback


@needs_ort
def test_a_size_the_program_fails_at_stays_fixed_and_the_build_says_why(monkeypatch, caplog):
    def guard(reference, candidate, **kw):            # right at any length, wrong at any other batch
        same = reference[0].shape[0] == 2
        return AccuracyResult(ok=same, reason="" if same else "output[0]: max abs err 0.5")
    monkeypatch.setattr(size_probes, "check_outputs", guard)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.build"):
        model, inputs, build = _build("ort", tagger)
    (_, (batch, length)), = build.plan.choices[0].other_shapes["inputs"]
    assert batch == 2 and isinstance(length, str)
    assert "<model> (ort) runs other input sizes on its program, with some sizes fixed" in caplog.text
    assert "failed the accuracy guard at sizes (1, 8): output[0]: max abs err 0.5" in caplog.text


@needs_ort
def test_a_failure_at_serve_time_hands_the_call_to_the_original_module_and_counts_it(caplog):
    model, inputs, build = _build("ort", tagger)
    region = build.module
    assert region.other_shapes is not None

    class Broken:
        learns_template = False

        def call_positional(self, args):
            raise RuntimeError("ONNX Runtime: unexpected input")
    region.other_shapes.runner = Broken()
    ids = torch.randint(0, 50, (3, 5))
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"), torch.no_grad():
        out = region(ids)
        region(ids)
    torch.testing.assert_close(out[0], model(ids)[0].detach())
    assert region.fallback_calls == 2 and region.other_shape_calls == 0 and region.other_sizes_failures == 2
    assert caplog.text.count("program for other input sizes failed (RuntimeError: ONNX Runtime: unexpected input)") == 1
    assert region.other_shapes is not None                  # one bad request does not turn it off for good


def test_a_program_learning_its_outputs_structure_gets_the_regions_whole_call():
    """A loaded program whose output structure the plan could not hold (a T5's cache) learns it
    from the original module on its first call: it got the call's tensors alone, so a T5 called
    with ids and decoder ids, captured as (ids, None, decoder ids), had its decoder ids bound to
    the attention mask and raised, and every call at another size ran the original module."""
    calls = []

    class Learning:
        learns_template = True

        def __call__(self, *args):
            calls.append(args)
            return "built from the original's output"

        def call_positional(self, tensors):
            pytest.fail("the tensors alone reached a program that learns its output's structure")
    record = other_shapes.OtherShapes(runner=Learning(), inputs=[(torch.int64, ("b", "t")), None,
                                                                 (torch.int64, ("b", "d"))],
                                      ranges={"b": (1, 8), "t": (2, 32), "d": (1, 32)}, artifact="")
    ids, decoder_ids = torch.zeros(3, 9, dtype=torch.int64), torch.zeros(3, 4, dtype=torch.int64)
    assert record((ids, None, decoder_ids)) == "built from the original's output"
    assert calls == [(ids, None, decoder_ids)]


def test_other_shapes_takes_the_checked_sizes_only():
    record = other_shapes.OtherShapes(runner=None, inputs=[(torch.int64, ("b", "t")), (torch.float32, ("b", 4))],
                                      ranges={"b": (1, 8), "t": (2, 32)}, artifact="")
    ids = torch.zeros(3, 9, dtype=torch.int64)
    assert record.fits((ids, torch.zeros(3, 4)))
    assert record.misfit((ids, torch.zeros(3, 5))) == "dimension 1 of input 1 is 5, built for 4 only"
    assert "dimension 0 of input 1 is 2 where an earlier input's is 3" in record.misfit((ids, torch.zeros(2, 4)))
    assert "a size of 40 is outside the sizes 2-32" in record.misfit((torch.zeros(3, 40, dtype=torch.int64),
                                                                      torch.zeros(3, 4)))
    assert "a size of 9 is outside the sizes 1-8" in record.misfit((torch.zeros(9, 9, dtype=torch.int64),
                                                                    torch.zeros(9, 4)))
    assert not record.fits((ids.int(), torch.zeros(3, 4)))                                # another dtype
    assert not record.fits((ids[..., None], torch.zeros(3, 4)))                           # another rank
    assert not record.fits((ids,))                                                        # fewer inputs
    assert record.to_json("ort/0-shapes.onnx") == {"artifact": "ort/0-shapes.onnx",
                                                   "inputs": [["int64", ["b", "t"]], ["float32", ["b", 4]]],
                                                   "ranges": {"b": [1, 8], "t": [2, 32]}}


def test_the_checked_range_stops_where_the_model_refuses_or_the_program_fails():
    """``_range`` bisects to the largest size the original module takes (more positions than it
    has never reach the program) and checks both ends (a forward that branches on the size). A
    size the program fails at bounds the range the same way (a Speech2Text's program took decoder
    ids up to its position table's 64, where eager grows the table, and every other length stayed
    fixed); failing on both sides of the captured size, it stays fixed."""
    max_positions = 37
    assert size_probes.probe_range(lambda size: size <= max_positions, 8, 128) == (1, 37, None)
    assert size_probes.probe_range(lambda size: True, 8, 128) == (1, 128, None)
    assert size_probes.probe_range(lambda size: size >= 3, 8, 128) == (3, 128, None)     # a minimum length
    assert size_probes.probe_range(lambda size: True, 8, 1000) == (1, 1000, None)     # a ceiling the module names

    def fails(size):
        raise other_shapes.OtherShapesError(f"it failed the accuracy guard at sizes ({size},)")

    def branchy(size):                 # the program was traced through the other branch below 5
        return fails(size) if size <= 4 else True
    assert size_probes.probe_range(branchy, 8, 128) == (5, 128, "it failed the accuracy guard at sizes (1,)")

    def table(size):                   # the program's table holds 64 positions, eager grows its own
        return fails(size) if size > 64 else True
    lo, hi, why = size_probes.probe_range(table, 8, 128)
    assert (lo, hi) == (1, 64) and why.startswith("it failed the accuracy guard at sizes (") and int(why[39:-2]) > 64
    with pytest.raises(other_shapes.OtherShapesError, match=r"at sizes \(7,\)"):
        size_probes.probe_range(lambda size: fails(size) if size != 8 else True, 8, 128)
    with pytest.raises(other_shapes.OtherShapesError, match=r"at sizes \(9,\)"):     # the model refuses below
        size_probes.probe_range(lambda size: fails(size) if size > 8 else size == 8, 8, 128)


@needs_ort
def test_a_dimension_the_program_gets_wrong_stays_fixed_and_the_others_stay_free(monkeypatch):
    """Hugging Face GPT-2 exported with free sizes still computes with the captured batch: the
    dimensions that pass keep the program, the one that fails keeps its captured size."""
    def guard(reference, candidate, **kw):            # wrong at any batch size but the captured one
        same = reference[0].shape[0] == 2
        return AccuracyResult(ok=same, reason="" if same else "output[0]: max abs err 0.5")
    monkeypatch.setattr(size_probes, "check_outputs", guard)
    model, inputs, build = _build("ort", tagger)
    (dtype, (batch, length)), = build.plan.choices[0].other_shapes["inputs"]
    assert batch == 2 and isinstance(length, str)
    with torch.no_grad():
        build.module(torch.randint(0, 50, (2, 11)))          # another length: the program
        build.module(torch.randint(0, 50, (3, 8)))           # another batch: the original module
    assert build.module.other_shape_calls == 1 and build.module.fallback_calls == 1


def test_an_aoti_region_gets_a_package_for_other_sizes_and_loads_it(tmp_path, keys):
    model, inputs = Scaler().eval(), (torch.randn(3, 12),)
    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    (dtype, (batch, features)), = record["inputs"]
    assert record["artifact"] == "aoti/0-shapes.pt2" and features == 12 and record["ranges"] == {batch: [1, 64]}
    fast = load_build(build.save(tmp_path / "a.cuvilpkg", signing_key=str(keys[0])), copy.deepcopy(model),
                      pubkey=str(keys[1]))
    x = torch.randn(8, 12)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fast(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
    assert fast.other_shape_calls == 1 and fast.fallback_calls == 0


class Positions(nn.Module):
    """Token ids and their attention mask, with learned positions for at most 16 tokens: sizes the
    model refuses (more positions than it has) must never reach the runtime, which answered them
    and then answered valid calls wrongly (OpenVINO)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos, self.fc = nn.Embedding(30, 8), nn.Embedding(16, 8), nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        return self.fc(h * mask[..., None])


@needs_ov
def test_sizes_the_model_refuses_and_unequal_ids_and_mask_never_reach_the_runtime():
    torch.manual_seed(0)
    model, ids = Positions().eval(), torch.randint(0, 30, (2, 8))
    inputs = (ids, torch.ones(2, 8))
    build = recompile(model, inputs, plan={"": Candidate("", "openvino")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    (_, ids_dims), (_, mask_dims) = record["inputs"]
    assert ids_dims == mask_dims                            # ids and mask vary together, as one batch and length
    assert record["ranges"][ids_dims[1]] == [1, 16]         # up to the positions the model has
    fast = build.module
    with torch.no_grad():
        for bad in ((torch.randint(0, 30, (2, 20)), torch.ones(2, 20)),      # 20 positions: eager's IndexError
                    (torch.randint(0, 30, (3, 12)), torch.ones(2, 12))):     # unequal batches: eager's error
            with pytest.raises((IndexError, RuntimeError)):
                fast(*bad)
        good = (torch.randint(0, 30, (4, 12)), torch.ones(4, 12))
        torch.testing.assert_close(fast(*good), model(*good), rtol=1e-4, atol=1e-5)
    assert fast.other_shape_calls == 1 and fast.fallback_calls == 2


@needs_ort
def test_autograd_through_an_input_and_autocast_run_the_original_module(caplog):
    model, inputs, build = _build("ort", tagger)
    region = build.module
    scaler = recompile(Scaler().eval(), (torch.randn(3, 12),), plan={"": Candidate("", "ort")}, records=False,
                       deployed_race=False, rounds=3, dynamic=True).module
    x = torch.randn(3, 12, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
        for sample in (x, torch.randn(5, 12, requires_grad=True)):     # the captured size, and another
            scaler(sample).sum().backward()               # saliency: gradients with respect to the input
            assert sample.grad is not None
    assert scaler.fallback_calls == 2 and scaler.other_shape_calls == 0
    assert "an input requires grad: the build's programs record no autograd" in caplog.text
    with torch.no_grad():
        scaler(x)                                         # no recording: the build's program reads it as data
    assert scaler.fallback_calls == 2
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        scores, _ = region(*inputs)
    assert scores.dtype == torch.bfloat16 and region.fallback_calls == 1      # as eager returns under autocast


def test_an_aoti_program_for_other_sizes_reads_any_layout():
    seen = []

    class Package:
        def __call__(self, args):
            seen.extend(a.is_contiguous() for a in args)
            return args[0]
    runner = object.__new__(free_size_programs.AotiRunner)
    runner._call = Package()
    runner.call_positional((torch.randn(4, 6).t(), torch.randn(3)))
    assert seen == [True, True]


class SkipsACache(nn.Module):
    """GPT-2's order: the ids, a cache a service leaves None, then the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, input_ids, past_key_values=None, attention_mask=None):
        return self.fc(self.emb(input_ids) * attention_mask.unsqueeze(-1)).mean(1)


@needs_ort
def test_a_region_captured_with_none_among_its_inputs_serves_other_lengths_by_keyword(tmp_path):
    """A tokenizer's mapping that skips GPT-2's past_key_values is captured as (ids, None, mask): the
    program for other sizes takes the tensors, the None stays where it was, and a service's keyword
    calls at other lengths run it, in a loaded build too."""
    torch.manual_seed(0)
    model, ids = SkipsACache().eval(), torch.randint(0, 50, (1, 8))
    build = recompile(model, {"input_ids": ids, "attention_mask": torch.ones(1, 8)}, plan={"": Candidate("", "ort")},
                      records=False, deployed_race=False, rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    assert record is not None and record["inputs"][1] is None and len(record["inputs"]) == 3
    fast = load_build(build.save(tmp_path / "n.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    with torch.no_grad():
        for length in (5, 13, 8):
            longer = torch.randint(0, 50, (1, length))
            mask = torch.ones(1, length)
            torch.testing.assert_close(fast(input_ids=longer, attention_mask=mask), model(longer, None, mask),
                                       rtol=1e-4, atol=1e-5)
        assert (fast.other_shape_calls, fast.fallback_calls) == (2, 0)
        cache = torch.zeros(1, 5)               # a tensor where None was captured: the original module
        torch.testing.assert_close(fast(longer[:, :5], cache, mask[:, :5]), model(longer[:, :5], cache, mask[:, :5]))
    assert fast.fallback_calls == 1


class Lenient(nn.Module):
    """Takes token ids one longer than their mask in eager (as a Llama returning its cache did)."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return ids.float().sum(-1, keepdim=True) + mask[:, :1]


@pytest.mark.parametrize("backend,apart", [("ort", True), ("aoti", False)])
def test_an_aoti_program_is_never_probed_with_sizes_it_named_apart_varying_alone(monkeypatch, backend, apart):
    """A failed check in an AOTInductor kernel ends the process (it runs in OpenMP's threads, where
    the error reaches std::terminate): the recompile of such a Llama died probing ids 17 long with a
    mask 16 long. An AOTInductor program sees sizes captured equal varying together only; the
    runtimes, whose errors are exceptions, are still probed apart."""
    model, args = Lenient().eval(), (torch.randint(0, 9, (1, 16)), torch.ones(1, 16))
    seen = []

    def program(*call):
        seen.append(tuple(tuple(a.shape) for a in call))
        return model(*call)

    fake = lambda *a, **k: (program, "first", [["", "s0"], ["", "s1"]], {}, {})        # noqa: E731
    monkeypatch.setattr(other_shapes, "aoti_program", fake)
    monkeypatch.setattr(other_shapes, "runtime_program", fake)
    from cuvil_pgc.recompile.apply import ScopeInputs

    other_shapes.build_other_shapes(model, model, Candidate("", backend), ScopeInputs(args), key="k",
                                    rtol=None, atol=None)
    assert any(ids[1] != mask[1] for ids, mask in seen) is apart, seen


class MaskAtLeast(nn.Module):
    """Takes a mask longer than its ids (it crops it), not ids longer than their mask."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return ids.float() * mask[:, :ids.shape[1]]


def test_a_size_that_cannot_change_alone_ties_the_sizes_captured_equal_that_could(monkeypatch):
    """The ids' length could not change alone, the mask's could: each varied alone, the ids only
    up to the mask's captured length and the mask only down to it, so a call at any other length
    ran the original module. Both now vary together."""
    model, args = MaskAtLeast().eval(), (torch.randint(0, 9, (1, 16)), torch.ones(1, 16))
    fake = lambda *a, **k: (model, "first", [["", "s0"], ["", "s1"]], {}, {})        # noqa: E731
    monkeypatch.setattr(other_shapes, "runtime_program", fake)
    from cuvil_pgc.recompile.apply import ScopeInputs

    shapes = other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                             rtol=None, atol=None)
    for n in (9, 20):
        call = (torch.randint(0, 9, (1, n)), torch.ones(1, n))
        assert shapes.fits(call), shapes.misfit(call)


class DropsAnAllOnesMask(nn.Module):
    """Ignores an all-ones mask, so takes one of any batch beside its ids (as Hugging Face's BERT did)."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = ids.float() * 2
        return out if bool(mask.all()) else out * mask


def test_a_size_that_changes_alone_but_fails_further_out_is_tried_with_its_partners(monkeypatch):
    """A BERT's ids and mask got batch sizes of their own from the exporter; eager took ids of batch
    3 beside a mask of batch 2, and so did the program, but at batch 6 it answered otherwise (1.6e-4
    off): the ids' batch stayed fixed, and every call at another batch ran the original module for a
    call no service makes. Such a size is tried again tied to the sizes captured equal to it."""
    model, args = DropsAnAllOnesMask().eval(), (torch.randint(0, 9, (2, 8)), torch.ones(2, 8))

    def program(ids, mask):          # answers mismatched batches otherwise, beyond one apart
        return model(ids, mask) + (0.01 if ids.shape[0] > mask.shape[0] + 1 else 0.0)

    fake = lambda *a, **k: (program, "first", [["s0", "s1"], ["s2", "s1"]], {}, {})        # noqa: E731
    monkeypatch.setattr(other_shapes, "runtime_program", fake)
    from cuvil_pgc.recompile.apply import ScopeInputs

    shapes = other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                             rtol=None, atol=None)
    for batch in (1, 5):
        call = (torch.randint(0, 9, (batch, 8)), torch.ones(batch, 8))
        assert shapes.fits(call), shapes.misfit(call)


def test_indices_into_a_tensor_sized_by_the_inputs_are_checked_against_the_calls_own_size(monkeypatch):
    """A graph network's edge list indexes its nodes (``x[src]``): the program for other sizes
    checks each call's node ids against that call's nodes, found as the size the program names
    for the rows of ``x``; a size no input's dimension is refuses the program."""
    from cuvil_pgc.recompile.apply import ScopeInputs
    from tests.test_index_bounds import Graph

    torch.manual_seed(0)
    model = Graph().eval()
    args = (torch.randn(20, 8), torch.randint(0, 20, (2, 40)))
    free = [["s0", ""], ["", "s1"]]
    monkeypatch.setattr(other_shapes, "runtime_program", lambda *a, **k: (model, "first", free, {1: {"s0"}}, {}))
    shapes = other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                             rtol=None, atol=None, sized=frozenset({1}))
    assert shapes.index_bounds == {1: ("s0",)}
    assert shapes.to_json("m")["index_bounds"] == {"1": ["s0"]}
    edges = torch.randint(0, 30, (2, 50))
    assert shapes.fits((torch.randn(30, 8), edges))
    edges[0, 3] = 30
    assert "input 1 holds an index outside 0-29" in shapes.misfit((torch.randn(30, 8), edges))
    assert shapes.fits((torch.randn(31, 8), edges))
    monkeypatch.setattr(other_shapes, "runtime_program", lambda *a, **k: (model, "first", free, {1: {"s0 - 1"}}, {}))
    with pytest.raises(other_shapes.OtherShapesError, match=r"input 1 indexes a tensor sized by the inputs .*\(s0 - 1\)"):
        other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                        rtol=None, atol=None, sized=frozenset({1}))


@pytest.mark.parametrize("bounds,why", [({"1": ["s9"]}, "is malformed"), ({"5": ["s0"]}, "is malformed"),
                                        ({"1": [0]}, "is malformed"), (None, "does not check the indices")])
def test_a_loaded_program_for_other_sizes_that_would_not_check_its_indices_is_left_out(bounds, why, caplog):
    """A record whose index bounds name no size of the inputs, or none for an input the region
    bounds by the captured sizes (a graph's edge list), leaves other sizes to the original module."""
    from types import SimpleNamespace

    record = {"artifact": "ort/0-shapes.onnx", "inputs": [["float32", ["s0", 8]], ["int64", [2, "s1"]]],
              "ranges": {"s0": [20, 320], "s1": [1, 640]}}
    if bounds is not None:
        record["index_bounds"] = bounds
    choice = SimpleNamespace(other_shapes=record, candidate=Candidate("", "ort"), label="<model>")
    region = SimpleNamespace(other_shapes=None, sized_bounds=frozenset({1}))
    vb = SimpleNamespace(extract=lambda *a: pytest.fail("extracted a program it should leave out"))
    with caplog.at_level(logging.WARNING):
        other_shapes.load_other_shapes(vb, choice, region, "dir", "cpu")
    assert region.other_shapes is None and why in caplog.text


class Flagged(nn.Module):
    """A Hugging Face-style forward taking its ids, their mask and a flag (``use_cache``), which
    services pass as a value: the program holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, use_cache: bool = True) -> torch.Tensor:
        h = self.head(self.emb(ids)) * mask.unsqueeze(-1)
        return h + 1 if use_cache else h


@needs_ov
def test_an_input_captured_as_a_value_is_held_by_the_program_for_other_sizes(tmp_path, keys):
    """A region called with use_cache=False among its inputs got no program for other sizes
    ("called with other than positional CPU tensors"): an OPT service ran the original module at
    every other length."""
    torch.manual_seed(0)
    model = Flagged().eval()
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.long)
    build = recompile(model, (ids, mask, False), plan={"": Candidate("", "openvino")}, records=False,
                      deployed_race=False, rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    assert record is not None and record["inputs"][2] == {"value": False}
    path = build.save(tmp_path / "f.cuvilpkg", signing_key=str(keys[0]))
    fresh = Flagged().eval()
    fresh.load_state_dict(model.state_dict())
    fast = load_build(path, fresh, pubkey=str(keys[1]))
    longer, longer_mask = torch.randint(0, 50, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    with torch.inference_mode():
        torch.testing.assert_close(fast(longer, longer_mask, False), model(longer, longer_mask, False))
        torch.testing.assert_close(fast(longer, mask=longer_mask, use_cache=False), model(longer, longer_mask, False))
        assert fast.other_shape_calls == 2 and fast.fallback_calls == 0
        for flag in (True, 0):                        # another value, or another type: the original module
            torch.testing.assert_close(fast(longer, longer_mask, flag), model(longer, longer_mask, flag))
    assert fast.fallback_calls == 2 and "input 2 is True, built for False" in fast.first_fallback


class MaskedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.fc(x)) * scale
        return h * mask.unsqueeze(-1) if mask is not None else h


class KeywordParent(nn.Module):
    """Calls its block as a Hugging Face model calls its layers: the mask and a flag by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.block = nn.Embedding(50, 8), MaskedBlock()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.block(self.emb(ids), mask=mask.float(), scale=2.0)


@needs_ort
def test_a_region_its_parent_calls_by_keyword_gets_a_program_for_other_sizes(tmp_path):
    """A region called with keywords (``self.block(x, mask=mask)``) got no program for other sizes,
    and every other size ran the original module; its call is bound to the forward's positions."""
    torch.manual_seed(0)
    model = KeywordParent().eval()
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.long)
    build = recompile(model, (ids, mask), plan={"block": Candidate("block", "ort")}, records=False,
                      deployed_race=False, rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    assert record is not None and [spec if isinstance(spec, dict) else spec[0] for spec in record["inputs"]] == \
        ["float32", "float32", {"value": 2.0}]
    fast = load_build(build.save(tmp_path / "k.cuvilpkg"), copy.deepcopy(model), allow_unsigned=True)
    region = fast.block
    longer, longer_mask = torch.randint(0, 50, (3, 9)), torch.ones(3, 9, dtype=torch.long)
    longer_mask[1, 4:] = 0
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, mask), model(ids, mask))
        torch.testing.assert_close(fast(longer, longer_mask), model(longer, longer_mask))
        assert region.other_shape_calls == 1 and region.fallback_calls == 0
        x = torch.randn(3, 9, 8)            # a keyword the program does not hold: the original module
        torch.testing.assert_close(region(x, mask=longer_mask.float(), scale=3.0), model.block(x, longer_mask.float(), 3.0))
        torch.testing.assert_close(region(x, mask=longer_mask.float(), scale=2.0, bias=x),
                                   model.block(x, longer_mask.float(), 2.0, x))
    assert region.other_shape_calls == 1 and region.fallback_calls == 2


def test_what_a_runtime_writes_to_stderr_as_a_probe_fails_stays_off_the_terminal(capfd):
    """ONNX Runtime logs a failed run in red on fd 2 (GPT-2's program at batch 2) before it raises:
    the build's probes keep that off the user's terminal, and the reason says what failed."""
    import os

    def noisy(*args):
        os.write(2, b"[E:onnxruntime] Shape mismatch attempting to re-use buffer\n")
        raise RuntimeError("Shape mismatch attempting to re-use buffer")
    x = torch.randn(2, 12)
    with pytest.raises(other_shapes.OtherShapesError, match="re-use buffer"):
        size_probes.compare(noisy, Scaler().eval(), (x,), None, None, quiet=True)
    assert "re-use buffer" not in capfd.readouterr().err


@needs_ort
def test_a_build_from_one_request_to_gpt2_serves_batches_on_its_program():
    """torch.export fixes a size of 1 the program computes with: GPT-2's program exported at one
    request took ids of any batch and gave logits of batch 1, ONNX Runtime failed at a batch of two,
    and every batched call ran the original module. Exported at a batch of two, checked at one."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 50, (1, 6))
    build = recompile(model, (ids,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    record = build.plan.choices[0].other_shapes
    (_, (batch, length)), = record["inputs"][:1]
    assert isinstance(batch, str) and record["ranges"][batch][0] == 1 and isinstance(length, str)
    fast = build.module
    three = torch.randint(0, 50, (3, 9))
    with torch.no_grad():
        torch.testing.assert_close(fast(three).logits, model(three).logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(fast(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
    assert fast.other_shape_calls == 1 and fast.fallback_calls == 0


def test_a_dimension_the_exporter_fixed_as_a_number_is_no_size_name():
    """A Qwen2 step's key-value heads came out of torch.export as a SymInt reading "2", were taken for
    a free size, tied to the batch captured at 2, and the batch stayed fixed."""
    from cuvil_pgc.recompile.free_size_programs import size_name

    class Symbolic:
        def __init__(self, text):
            self.text = text

        def __str__(self):
            return self.text
    assert [size_name(d) for d in (4, Symbolic("2"), Symbolic("s33"), Symbolic("s81 + 1"))] == ["", "", "s33", "s81 + 1"]
