"""An output holding tensors in an object torch's pytree leaves whole (a Hugging Face decoder's
``DynamicCache`` at the config's default ``use_cache=True``, a plain dataclass) is exported as its
tensors and rebuilt around the runtime's: such a decoder used to get no ONNX Runtime, OpenVINO or
AOTInductor candidate at all."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.export_error import ExportError
from cuvil_pgc.recompile.object_outputs import MAX_DEPTH, ObjectLeaf, opened, output_tensors, unchanged
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.output_values import check_constant_outputs
from tests._service import run_service


class Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values, self.ready, self.device = keys, values, True, keys.device


class Cache:
    """Like transformers' DynamicCache: a list of layers, each holding its tensors, and flags."""

    def __init__(self, layers: list[Layer], tag: object = "v1") -> None:
        self.layers, self.offloading, self.tag = layers, False, tag


class Decoder(nn.Module):
    def __init__(self, n_layers: int = 2, tag_from_input: bool = False) -> None:
        super().__init__()
        self.kv = nn.ModuleList(nn.Linear(8, 16) for _ in range(n_layers))
        self.head = nn.Linear(8, 5)
        self.tag_from_input = tag_from_input

    def forward(self, x: torch.Tensor):
        layers = [Layer(*fc(x).chunk(2, -1)) for fc in self.kv]
        tag = round(float(x.sum()), 3) if self.tag_from_input else "v1"
        return {"logits": self.head(x), "cache": Cache(layers, tag)}


def test_a_cache_s_tensors_are_outputs_and_each_build_is_a_new_cache_around_them():
    torch.manual_seed(0)
    model, x = Decoder().eval(), torch.randn(3, 8)
    with torch.no_grad():
        out = model(x)
    tensors = output_tensors(out)
    expected = [out["logits"]] + [t for layer in out["cache"].layers for t in (layer.keys, layer.values)]
    assert len(tensors) == 5 and all(a is b for a, b in zip(tensors, expected, strict=True))

    template = OutputTemplate.of(out)
    assert template.to_json() is None                       # a loaded build learns it from one call
    fresh = [torch.randn_like(t) for t in tensors]
    built = template.build(fresh)
    cache = built["cache"]
    assert type(cache) is Cache and cache is not out["cache"] and cache.layers is not out["cache"].layers
    assert [type(layer) for layer in cache.layers] == [Layer, Layer]
    assert built["logits"] is fresh[0] and cache.layers[1].values is fresh[4]
    assert (cache.offloading, cache.tag, cache.layers[0].ready, cache.layers[0].device) == (False, "v1", True, x.device)
    assert template.build(fresh)["cache"] is not cache      # a new object on every call


def test_what_holds_a_caches_tensors_tells_whether_anything_in_it_was_rebound():
    """A decoding step's next call passes the cache it wrote back: held() walks it by the leaf's
    skeleton, and unchanged() tells from identities alone whether it is still laid out so."""
    with torch.no_grad():
        cache = Decoder(n_layers=3).eval()(torch.randn(2, 8))["cache"]
    leaf = ObjectLeaf.of(cache)
    record, tensors = leaf.held(cache)
    assert all(a is b for a, b in zip(tensors, opened(cache)[1], strict=True)) and len(tensors) == 6
    assert unchanged(record)
    cache.layers[1].keys.add_(1)                  # in place: the same tensor, which the step reads
    assert unchanged(record)
    for rebind in (lambda c: setattr(c.layers[2], "keys", c.layers[2].keys * 1),     # a beam search's reorder
                   lambda c: setattr(c.layers[0], "ready", False),
                   lambda c: c.layers.append(Layer(*torch.randn(2, 2, 8).unbind())),
                   lambda c: setattr(c, "extra", 1)):
        with torch.no_grad():
            cache = Decoder(n_layers=3).eval()(torch.randn(2, 8))["cache"]
        record, _ = leaf.held(cache)
        rebind(cache)
        assert not unchanged(record) and (leaf.held(cache) is None or not unchanged(record))
    assert leaf.held(Cache([])) is None and leaf.held("not a cache") is None


def test_an_object_rebuilt_inside_a_compiled_function_keeps_its_attributes():
    """A torch.compile candidate of a decoding step traces the cache's rebuild: Dynamo lost what
    ``__dict__.update`` gave the new object, and every such candidate failed."""
    with torch.no_grad():
        cache = Decoder().eval()(torch.randn(3, 8))["cache"]
    leaf, tensors = ObjectLeaf.of(cache), opened(cache)[1]

    @torch.compile(backend="eager")
    def rebuilt(*t):
        c = leaf.build(list(t))
        return c.layers[1].values * 2, c.tag == "v1"
    torch._dynamo.reset()
    values, tagged = rebuilt(*tensors)
    torch.testing.assert_close(values, tensors[3] * 2)
    assert tagged


def test_a_count_of_what_a_tensor_holds_is_rebuilt_from_its_size_and_traced_as_that_size():
    """A sliding-window layer counts the tokens it has seen in a plain int: while that is its keys'
    length it is written as such, rebuilt from the keys (in its place among the attributes) and,
    in an export, is the keys' size as a symbol; once the window drops tokens it is the constant it is."""
    cache_utils = pytest.importorskip("transformers.cache_utils")

    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=8)
    layer.update(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4))
    cache = Cache([layer])
    text, tensors = opened(cache)
    assert "cumulative_length=keys.shape[-2]" in text and "sliding_window=8" in text
    leaf = ObjectLeaf.of(cache)
    longer = [torch.randn(1, 2, 7, 4) if t.dim() == 4 else t for t in tensors]
    built = leaf.build(longer).layers[0]
    assert built.cumulative_length == 7 and list(vars(built)) == list(vars(layer))
    assert opened(Cache([built]))[0] == text

    class Counted(nn.Module):
        def forward(self, keys, values, window):
            counted = leaf.build([keys, values, window]).layers[0]
            return keys.sum(-2) * counted.cumulative_length

    auto = {2: torch.export.Dim.AUTO}
    program = torch.export.export(Counted(), tuple(tensors), dynamic_shapes=(auto, auto, None), strict=False)
    torch.testing.assert_close(program.module()(*longer), longer[0].sum(-2) * 7)
    for _ in range(5):                     # 10 tokens seen, 7 kept
        layer.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4))
    assert "cumulative_length=10" in opened(cache)[0]


def test_objects_that_cannot_be_rebuilt_are_left_whole():
    t = torch.ones(2)

    class Slotted:
        __slots__ = ("t",)

        def __init__(self) -> None:
            self.t = t

    looped = Cache([Layer(t, t)])
    looped.layers[0].owner = looped
    deep: object = Layer(t, t)
    for _ in range(MAX_DEPTH):
        deep = Cache([deep])
    no_tensors = Cache([])
    for value in (Slotted(), looped, deep, no_tensors, t, None, 3):
        assert ObjectLeaf.of(value) is None, value
    assert output_tensors({"a": looped, "b": t}) == [t]     # what cannot be opened adds no tensors


def test_a_hugging_face_cache_opens_the_same_way_where_transformers_registered_it_with_the_pytree():
    """transformers' exporter registers its caches as pytree nodes, in that process only: the
    process that exports a region and the one that loads it must still agree on the order of the
    cache's tensors (else keys come back as values), so a cache is always opened here."""
    cache_utils = pytest.importorskip("transformers.cache_utils")
    from torch.utils import _pytree as pytree

    cache = cache_utils.DynamicCache()
    for i in range(2):
        cache.update(torch.full((1, 2, 3, 4), 2.0 * i), torch.full((1, 2, 3, 4), 2.0 * i + 1), i)
    out = {"logits": torch.zeros(2), "cache": cache}
    unregistered = output_tensors(out)
    template = OutputTemplate.of(out)
    assert type(cache) not in pytree.SUPPORTED_NODES and len(unregistered) == 5

    def flatten(c):          # another order than the walk's: every layer's values, then its keys
        return [layer.values for layer in c.layers] + [layer.keys for layer in c.layers], None

    pytree.register_pytree_node(type(cache), flatten, lambda values, context: None)
    try:
        registered, again = output_tensors(out), OutputTemplate.of(out)
    finally:
        pytree._deregister_pytree_node(type(cache))
    assert all(a is b for a, b in zip(registered, unregistered, strict=True))
    assert [float(t.flatten()[0]) for t in registered] == [0, 0, 1, 2, 3]
    assert [kind for kind, _ in again.leaves] == [kind for kind, _ in template.leaves] == ["t", "o"]


def test_a_cache_whose_other_contents_change_with_the_inputs_is_refused():
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    steady, changing = Decoder().eval(), Decoder(tag_from_input=True).eval()
    with torch.no_grad():
        check_constant_outputs(steady, ScopeInputs((x,)), steady(x), "torch.onnx.export")     # no error
        with pytest.raises(ExportError, match=r"output\['cache'\] is a Cache holding tensors whose other "
                                              r"contents change with the input values"):
            check_constant_outputs(changing, ScopeInputs((x,)), changing(x), "torch.onnx.export")


def _llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    return model, ids


def _cache(out):
    """The decoder's cache: ``cache`` in transformers 5, ``past_key_values`` before."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["ort", "openvino"])      # AOTInductor: test_aoti_structured_outputs
def test_a_decoder_left_at_use_cache_true_runs_on_the_backend_and_its_cache_feeds_the_next_step(backend):
    if not runtimes.check(backend).ok:
        pytest.skip(f"needs {backend}")
    model, ids = _llama()
    assert model.config.use_cache
    mask = torch.ones_like(ids)
    realized = realize(model, Candidate("", backend), ScopeInputs((ids, mask)), machine="test")
    other = torch.randint(3, 300, ids.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out, ref = realized.module(other, mask), model(other, mask)
        assert type(_cache(out)) is type(_cache(ref)) and _cache(out).get_seq_length() == _cache(ref).get_seq_length() == 12
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
        for a, b in zip(_cache_tensors(_cache(out)), _cache_tensors(_cache(ref)), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        step = torch.tensor([[7]])                  # the next token, decoded eagerly on each cache
        after_build = model(step, past_key_values=_cache(out)).logits
        after_eager = model(step, past_key_values=_cache(ref)).logits
    torch.testing.assert_close(after_build, after_eager, rtol=1e-4, atol=1e-5)
    assert realized.module.fallback_calls == 0


def test_a_decoder_s_output_is_rebuilt_by_the_fast_model_output_builder():
    """Built through its constructor (the pytree's rebuild), a ModelOutput holding a cache took
    17.8 µs warm against 3.9 µs built directly: the direct builder takes the rebuilt cache too."""
    pytest.importorskip("transformers")
    model, ids = _llama()
    with torch.no_grad():
        reference = model(ids)
    template = OutputTemplate.of(reference)
    tensors = output_tensors(reference)
    first, second = template.build(tensors), template.build(tensors)
    assert template.model_output is not None                         # proven when made
    assert type(second) is type(reference) and list(second.keys()) == list(reference.keys())
    assert second.logits is tensors[0] and _cache(second) is second[list(second.keys())[1]]
    assert _cache(second) is not _cache(first) and type(_cache(second)) is type(_cache(reference))
    assert all(a is b for a, b in zip(_cache_tensors(_cache(second)), tensors[1:], strict=True))


SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    import transformers
    from cuvil_pgc import load_build

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    model.load_state_dict(torch.load(sys.argv[1]))
    fast = load_build(sys.argv[2], model, pubkey=sys.argv[3])
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        outs = [fast(ids, torch.ones_like(ids)) for _ in range(3)]   # the first learns the output's structure
        ref = model(ids, torch.ones_like(ids))
    cache = lambda o: o.cache if hasattr(o, 'cache') else o.past_key_values   # transformers 5 | 4
    out = outs[-1]
    pairs = [(out.logits, ref.logits)] + [(a, b) for la, lb in zip(cache(out).layers, cache(ref).layers)
                                           for a, b in ((la.keys, lb.keys), (la.values, lb.values))]
    print(json.dumps({"applied": fast.cuvil_load_report.applied, "fallback_calls": fast.fallback_calls,
                      "cache": type(cache(out)).__name__, "diff": max(float((a - b).abs().max()) for a, b in pairs),
                      "distinct": cache(outs[1]) is not cache(outs[2]),
                      "lean": fast._lean is not None}))
''')


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_a_decoder_s_build_returns_its_cache_in_a_service(tmp_path, keys):
    if not runtimes.check("openvino").ok:
        pytest.skip("needs openvino")
    from cuvil_pgc.recompile import recompile

    model, ids = _llama()
    build = recompile(model, (ids, torch.ones_like(ids)), plan={"": Candidate("", "openvino")}, records=False,
                      deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == ["openvino"]
    path = build.save(tmp_path / "llama.cuvilpkg", signing_key=str(keys[0]))
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    report = run_service(SERVICE, tmp_path / "weights.pt", path, keys[1], cwd=tmp_path)
    assert report["applied"] == ["<model>: openvino"] and report["fallback_calls"] == 0, report
    assert report["cache"] == "DynamicCache" and report["distinct"] and report["diff"] < 1e-4, report
    assert report["lean"], report     # once the first call showed the output's structure: no dispatch per call
