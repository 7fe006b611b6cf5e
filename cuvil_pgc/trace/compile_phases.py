"""Names of torch.compile's timed events -> the phases of the compile track.

torch times its compiler with ``dynamo_timed`` / ``chromium_event_timed``; each timed block is a
chromium begin/end pair named after the function or the phase (``bytecode_tracing``,
``create_aot_dispatcher_function``, ``GraphLowering.run``, ``compile_file``, ...). The names change
between releases, so unknown names fall back on prefix rules and finally on ``"other"``;
``None`` means the event is not recorded (a wrapper that duplicates another span).

Phases (``args.phase`` of ``cat: "compile"`` events):
``frame`` (one whole frame compile: ``entire_frame_compile``), ``dynamo`` (bytecode tracing, guards),
``backend_compile`` (hand-off to the backend), ``aot_autograd``, ``inductor`` (compile_fx /
compile_fx_inner glue), ``inductor_passes``, ``inductor_lowering``, ``inductor_scheduling``,
``inductor_codegen``, ``kernel_compile`` (C++/Triton compilation of the generated code),
``autotuning``, ``dynamic_shapes``, ``gc``, ``other``; and, for zero-length events,
``fx_graph_cache``, ``aot_autograd_cache``, ``graph_break``, ``recompile``.
"""

from __future__ import annotations

FRAME = "frame"
GRAPH_BREAK = "graph_break"
RECOMPILE = "recompile"
FX_CACHE = "fx_graph_cache"
AOT_CACHE = "aot_autograd_cache"

#: Timed-event names that span one whole frame compile (names differ across torch releases).
FRAME_EVENTS = frozenset({"entire_frame_compile", "_compile.compile_inner"})
#: Wrappers that only duplicate the frame span.
DROPPED = frozenset({"dynamo"})

_EXACT = {
    "bytecode_tracing": "dynamo", "build_guards": "dynamo", "compile_attempt": "dynamo",
    "backend_compile": "backend_compile", "OutputGraph.call_user_compiler": "backend_compile",
    "create_aot_dispatcher_function": "aot_autograd", "aot_collect_metadata": "aot_autograd",
    "aot_trace_joint_graph": "aot_autograd", "min_cut_rematerialization_partition": "aot_autograd",
    "inductor_compile": "inductor", "compile_fx_inner": "inductor", "fx_codegen_and_compile": "inductor",
    "additional_fake_tensor_prop": "inductor", "insert_deferred_runtime_asserts": "inductor",
    "inductor_codecache_torch_key": "inductor",
    "GraphLowering.run": "inductor_lowering",
    "Scheduler.codegen": "inductor_codegen", "code_gen": "inductor_codegen",
    "GraphLowering.codegen": "inductor_codegen", "GraphLowering.compile_to_fn": "inductor_codegen",
    "GraphLowering.compile_to_module": "inductor_codegen",
    "compile_file": "kernel_compile", "async_compile.wait": "kernel_compile",
    "PyCodeCache.load_by_key_path": "kernel_compile", "TritonBundler.collect": "kernel_compile",
    "automatic_dynamic": "dynamic_shapes", "gc": "gc",
}
_PREFIXES = (
    ("compile_attempt_", "dynamo"), ("bytecode_hooks_", "dynamo"), ("pgo.", "dynamo"), ("OutputGraph.", "dynamo"),
    ("aot_", "aot_autograd"), ("autograd_cache", AOT_CACHE), ("fx_graph_cache", FX_CACHE),
    ("compile_fx", "inductor"), ("pass.", "inductor_passes"), ("_recursive_", "inductor_passes"),
    ("Scheduler.", "inductor_scheduling"), ("PythonWrapperCodegen.", "inductor_codegen"),
    ("async_compile", "kernel_compile"), ("triton", "kernel_compile"), ("TritonBundler.", "kernel_compile"),
    ("AOTAutogradCache.", "aot_autograd"), ("FxGraphCache.", "inductor"), ("CacheBase.", "inductor"),
)
_AUTOTUNE_WORDS = ("autotun", "benchmark", "select_algorithm")


def phase_of(name: str) -> str | None:
    """The phase of a timed event; None for wrappers that are not recorded."""
    if name in DROPPED:
        return None
    if name in FRAME_EVENTS:
        return FRAME
    phase = _EXACT.get(name)
    if phase is not None:
        return phase
    lowered = name.lower()
    if any(word in lowered for word in _AUTOTUNE_WORDS):
        return "autotuning"
    for prefix, phase in _PREFIXES:
        if name.startswith(prefix):
            return phase
    return "other"
