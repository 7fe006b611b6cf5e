"""generate(): a decoder's build for its decoding steps against what a user runs otherwise.

A Hugging Face decoder spends generation in its decoding steps, one call per new token with the
cache of the tokens before it. ``recompile`` given such a call builds the step with the cache opened
into tensors (:mod:`cuvil_pgc.recompile.cache_step`), and ``load_build`` makes the model's
``generate()`` run it. This races, per model, interleaved in one process at the deployment's thread
count, greedy ``generate()`` of ``--new`` tokens after a prompt of ``--prompt`` tokens:

- ``eager``: the model itself (Hugging Face's ``DynamicCache``);
- ``compile``: what Hugging Face documents for fast generation, a static cache
  (``cache_implementation="static"``) and ``model.forward = torch.compile(model.forward)``, warmed first;
- ``build``: ``recompile`` of one decoding step (``cuvil-pgc recompile`` at its defaults), saved and
  loaded with ``load_build`` as a service loads it;
- with ``--prefill``, ``steps`` (that build alone) and ``build``: the same with the prefill's build
  (``recompile`` of ``generate()``'s first call, the prompt's, with the cache still empty) loaded
  onto it, so that the prompt runs a build too;
- with ``--encoder`` (encoder-decoders), the encoder's build (``recompile(model.get_encoder(),
  generate_encoder_call(...))``, the source's call) loaded onto ``build`` too.

Every contender's tokens are checked against eager's. It prints each model's medians (ms per
``generate()``), the build over eager and over the faster of the two others, and their geometric
means over the models; and one step alone in the search's final race, where the step exported to
ONNX Runtime and OpenVINO at their defaults (what an Optimum-style export of the step runs) raced
beside the build's plan.

    python benchmarks/decode_steps.py --models llama,qwen2,phi3,gpt2 --threads 1
    python benchmarks/decode_steps.py --models llama,gpt2 --capture 32 --prompt 6000 --new 16   # long contexts
    python benchmarks/decode_steps.py --models llama,gpt2 --prefill --capture 32 --prompt 2000  # the prompt's build too
    python benchmarks/decode_steps.py --models t5,bart --prompt 128    # encoder-decoders: 128 source tokens
    python benchmarks/decode_steps.py --models t5,bart --prompt 512 --new 32 --encoder   # and the encoder's build

For an encoder-decoder (``t5``, ``bart``) ``--prompt`` is the source's length, and the step built is
the one ``generate()`` makes after ``--capture`` (default 4) decoder tokens, captured from its call.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import tempfile
import time
from typing import Any

MODELS = ("llama", "qwen2", "phi3", "gpt2")
ENCODER_DECODERS = ("t5", "bart")


def make(name: str, width: int, layers: int, positions: int = 1024) -> Any:
    import torch
    import transformers as T

    torch.manual_seed(0)
    common = dict(num_hidden_layers=layers, hidden_size=width, num_attention_heads=width // 32,
                  intermediate_size=width * 8 // 3, vocab_size=4096, max_position_embeddings=positions)
    if name == "t5":
        return T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=4096, d_model=width, d_kv=32, d_ff=width * 4, num_layers=layers, num_decoder_layers=layers,
            num_heads=width // 32, decoder_start_token_id=0, pad_token_id=0)).eval()
    if name == "bart":
        return T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=4096, d_model=width, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=width // 32, decoder_attention_heads=width // 32, encoder_ffn_dim=width * 4,
            decoder_ffn_dim=width * 4, max_position_embeddings=positions, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)).eval()
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_layer=layers, n_embd=width, n_head=width // 32, vocab_size=4096,
                                              n_positions=positions)).eval()
    config = {"llama": T.LlamaConfig, "qwen2": T.Qwen2Config, "phi3": T.Phi3Config}[name](
        num_key_value_heads=max(1, width // 64), **common, **({"pad_token_id": 0} if name == "phi3" else {}))
    return {"llama": T.LlamaForCausalLM, "qwen2": T.Qwen2ForCausalLM, "phi3": T.Phi3ForCausalLM}[name](config).eval()


def step_call(model: Any, prompt: int) -> dict[str, Any]:
    """One decoding step's call: the token after a prompt, the prompt's cache, the mask over both."""
    import torch

    if model.config.is_encoder_decoder:
        return generated_step_call(model, prompt, 4)

    ids = torch.randint(3, 4096, (1, prompt))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return {"input_ids": torch.randint(3, 4096, (1, 1)), "attention_mask": torch.ones(1, prompt + 1, dtype=torch.long),
            "cache": cache, "use_cache": True}


def prefill_call(model: Any, prompt: int) -> dict[str, Any]:
    """The prefill's call ``generate()`` makes for a prompt of ``prompt`` tokens (its cache empty)."""
    return generated_step_call(model, prompt, 0)


def generated_step_call(model: Any, source: int, step: int) -> dict[str, Any]:
    """The call ``generate()`` makes for decoder token ``step`` after a source of ``source`` tokens
    (the encoder's outputs, the cache, the source's mask), as a service makes it."""
    import torch

    from cuvil_pgc.recompile import generate_step_call

    ids = torch.randint(3, 4096, (1, source))
    return generate_step_call(model, ids, attention_mask=torch.ones_like(ids), step=step)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--capture", type=int, default=None,
                   help="the cache length of the step recompile is given (default: --prompt); a service's "
                        "profile may hold steps of other lengths than it serves")
    p.add_argument("--prefill", action="store_true",
                   help="also build the prefill (at a prompt of --capture tokens) and load it onto the step's build")
    p.add_argument("--encoder", action="store_true",
                   help="encoder-decoders: also build the encoder (at a source of --prompt tokens) and load it onto "
                        "the step's build")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    from cuvil_pgc.recompile import generate_encoder_call, load_build, recompile

    torch.set_num_threads(args.threads)
    print(f"{args.layers} layers, width {args.width}, prompt {args.prompt}, {args.new} new tokens, the step built "
          f"at a cache of {args.capture or args.prompt} (an encoder-decoder's: {args.capture or 4} decoder tokens after "
          f"a source of {args.prompt}), "
          f"{args.threads} thread(s); ms per generate(), medians of {args.rounds} interleaved rounds")
    layered = args.prefill or args.encoder          # builds loaded onto the step's: "steps" is that one alone
    steps_column = f" {'steps':>8}" if layered else ""
    print(f"{'model':<8} {'eager':>8} {'compile':>8}{steps_column} {'build':>8} {'plan':<36} {'vs eager':>9} "
          f"{'vs best':>8}")
    over_eager, over_best = [], []
    with tempfile.TemporaryDirectory(prefix="cuvil-decode-") as tmp:
        for name in args.models.split(","):
            model = make(name, args.width, args.layers, max(1024, args.prompt + args.new))
            call = generated_step_call(model, args.prompt, args.capture or 4) if name in ENCODER_DECODERS \
                else step_call(model, args.capture or args.prompt)
            build = recompile(copy.deepcopy(model), call, threads=args.threads)
            path = f"{tmp}/{name}.cuvilpkg"
            build.save(path)
            plan = "; ".join(f"{c.scope or '<model>'}: {c.candidate.config}" for c in build.plan.choices) or "eager"
            fast = load_build(path, copy.deepcopy(model), allow_unsigned=True)
            compiled = copy.deepcopy(model)
            compiled.generation_config.cache_implementation = "static"
            compiled.forward = torch.compile(compiled.forward)
            contenders = {"eager": model, "compile": compiled, "build": fast}
            ids = torch.randint(3, 4096, (1, args.prompt))
            built = fast
            if args.prefill:
                first = recompile(copy.deepcopy(model), prefill_call(model, args.capture or args.prompt),
                                  threads=args.threads)
                first.save(f"{tmp}/{name}-prefill.cuvilpkg")
                plan += "; prefill " + "; ".join(f"{c.candidate.config}" for c in first.plan.choices)
                built = load_build(f"{tmp}/{name}-prefill.cuvilpkg", built, allow_unsigned=True)
            if args.encoder and name in ENCODER_DECODERS:
                source = generate_encoder_call(model, ids, attention_mask=torch.ones_like(ids))
                encoder = recompile(copy.deepcopy(model).get_encoder(), source, threads=args.threads)
                encoder.save(f"{tmp}/{name}-encoder.cuvilpkg")
                plan += "; encoder " + "; ".join(f"{c.candidate.config}" for c in encoder.plan.choices)
                built = load_build(f"{tmp}/{name}-encoder.cuvilpkg", built, allow_unsigned=True)
            if layered:
                contenders = {"eager": model, "compile": compiled, "steps": fast, "build": built}

            def generate(m: Any, ids: torch.Tensor = ids) -> torch.Tensor:
                with torch.no_grad():
                    return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                      min_new_tokens=args.new, do_sample=False, pad_token_id=0)
            want = generate(model)
            for label, m in contenders.items():
                got = generate(m)           # (also the warm-up: torch.compile compiles here)
                if not torch.equal(got, want):
                    raise SystemExit(f"{name}: {label}'s tokens differ from eager's")
            times: dict[str, list[float]] = {k: [] for k in contenders}
            for _ in range(args.rounds):
                for label, m in contenders.items():
                    start = time.perf_counter()
                    generate(m)
                    times[label].append((time.perf_counter() - start) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            vs_eager, vs_best = med["eager"] / med["build"], min(med["eager"], med["compile"]) / med["build"]
            over_eager.append(vs_eager)
            over_best.append(vs_best)
            steps_ms = f" {med['steps']:>8.1f}" if layered else ""
            print(f"{name:<8} {med['eager']:>8.1f} {med['compile']:>8.1f}{steps_ms} {med['build']:>8.1f} "
                  f"{plan[:36]:<36} {vs_eager:>8.2f}x {vs_best:>7.2f}x")
            if layered:
                print(f"         plan: {plan}")
            region, steps = fast.forward.region, (1 + args.rounds) * (args.new - 1) * (2 if layered else 1)
            print(f"         the build's steps: {steps - fast.forward.outside_calls} of {steps} ran it; "
                  f"{fast.forward.outside_calls} were at a batch or cache length it does not run (the model's own forward), "
                  f"{getattr(region, 'fallback_calls', 0)} fell back inside it; cache lengths it runs: "
                  f"{getattr(getattr(region, 'other_shapes', None), 'ranges', None)}")
            if args.prefill:
                first_forward = contenders["build"].forward
                print(f"         the prefill's build: {1 + args.rounds - first_forward.outside_calls} of "
                      f"{1 + args.rounds} prompts ran it, {first_forward.region.fallback_calls} fell back inside it; "
                      f"sizes it runs: {getattr(getattr(first_forward.region, 'other_shapes', None), 'ranges', None)}")
            if args.encoder and name in ENCODER_DECODERS:
                print(f"         the encoder's build: {built.get_encoder().fallback_calls} of {1 + args.rounds} sources fell "
                      f"back to the encoder's own forward")
            # one step alone, in the search's final race (in processes of their own where it ran
            # there): each whole-step plan raced, the step on each runtime at its defaults among
            # them (what an Optimum-style export of the step would run)
            steps = build.plan.deployed_medians_ms or build.plan.final_medians_ms
            print("         one step: " + ", ".join(f"{k.removeprefix('<model>::')} {v:.3f} ms" for k, v in
                                                 sorted(steps.items(), key=lambda kv: kv[1] or 1e9) if v))
    print(f"geometric mean: build over eager {_geomean(over_eager):.2f}x, over the faster of eager and compile "
          f"{_geomean(over_best):.2f}x")
    return 0


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
