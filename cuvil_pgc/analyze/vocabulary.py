"""The bottleneck vocabulary: every class a region can be given, defined once.

Each :class:`BottleneckClass` says what the class is called (the ``bottleneck`` value of
``analyze --json``), the colour and terminal style the viewer draws it in, what it means, and what
the recompiler can do about it (``remedy``). The analyzer's rules (:mod:`.bottleneck`) are matched to
these entries by name, one rule per class; ``CLASSES`` is also the rule order (on a tie in explained
time the earlier class wins, and the last one is what an empty region gets).

A new class is one entry here plus its rule in :mod:`.bottleneck`: the analyzer, the console and HTML
viewers (badges, the CSS classes ``b-<name>``, figure colours) and the recompiler's candidate
generator and cost models all read this table.

``remedy`` (what the recompiler tries for a region of the class, see ``recompile.candidates``):
- ``"overhead"``: remove per-op / per-call cost (rewrites, AOTInductor, cpp_wrapper, CUDA graphs);
- ``"work"``: make the work itself cheaper (fusion, layout, autotuning, freezing, precision);
- ``"compile"``: a plain torch.compile is worth measuring, nothing more specific;
- ``"none"``: recompiling the region does not address it (the time is spent elsewhere).

``memory_share``: prior share of the region's work that is memory traffic, for the cost models when
a region's FLOPs and bytes are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass

REMEDIES = ("overhead", "work", "compile", "none")


@dataclass(frozen=True)
class BottleneckClass:
    name: str
    color: str            # report badge / figure colour (CSS ``.b-<name>``)
    style: str            # rich style in the terminal
    description: str      # one sentence, shown in the report's legend and docs
    remedy: str           # one of REMEDIES
    memory_share: float = 0.5


CLASSES: tuple[BottleneckClass, ...] = (
    BottleneckClass("launch_overhead", "#b5179e", "magenta",
                    "fixed per-op cost: eager dispatch and kernel-launch calls, and the GPU idle gaps they cause",
                    "overhead"),
    BottleneckClass("memory_bandwidth", "#0077b6", "cyan",
                    "the work is bound by memory traffic (arithmetic intensity below the ridge point)",
                    "work", memory_share=0.8),
    BottleneckClass("compute", "#2a9d3f", "green",
                    "the work is bound by arithmetic (arithmetic intensity above the ridge point)",
                    "work", memory_share=0.2),
    BottleneckClass("communication", "#7b2cbf", "bright_magenta",
                    "collective communication (NCCL / gloo) not hidden behind compute",
                    "none"),
    BottleneckClass("sync_wait", "#d62828", "red",
                    "the host blocks on the GPU (device / stream / event synchronize, blocking copies) "
                    "while the GPU has none of the region's work to run",
                    "compile"),
    BottleneckClass("allocation", "#e07b39", "bright_red",
                    "device or pinned memory allocation calls (cudaMalloc, cudaFree, cudaHostAlloc, ...) "
                    "with the GPU idle",
                    "overhead"),
    BottleneckClass("setup", "#264653", "blue",
                    "one-time CUDA context / device setup calls (device properties, stream priorities, ...)",
                    "none"),
    BottleneckClass("host_bound", "#c77d00", "yellow",
                    "the host runs code outside the profiled ops (Python, data handling) while the device waits",
                    "overhead"),
    BottleneckClass("idle", "#8a8a8a", "dim",
                    "the process waited (sleep, I/O, locks): nothing to recompile",
                    "none"),
)

BY_NAME: dict[str, BottleneckClass] = {c.name: c for c in CLASSES}
NAMES: tuple[str, ...] = tuple(c.name for c in CLASSES)
UNKNOWN_COLOR = "#6c757d"


def of(name: str | None) -> BottleneckClass | None:
    """The class called ``name``, None for a name this version does not know."""
    return BY_NAME.get(name or "")


def color(name: str | None) -> str:
    c = of(name)
    return c.color if c else UNKNOWN_COLOR


def with_remedy(*remedies: str) -> frozenset[str]:
    """Names of the classes whose remedy is one of ``remedies``."""
    return frozenset(c.name for c in CLASSES if c.remedy in remedies)


def css() -> str:
    """The report's badge rules, one per class (``.b-<name>``), plus ``.b-unknown``."""
    rules = [f".b-{c.name} {{ background: {c.color}; }}" for c in CLASSES]
    return "\n".join([*rules, f".b-unknown {{ background: {UNKNOWN_COLOR}; }}"])
