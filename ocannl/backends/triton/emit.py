"""The Triton source emitter: one Python module per routine, one ``@triton.jit`` kernel per
launch, and a ``launch`` function calling them in order.

Each :class:`~ocannl.backends.partition.Kernel` comes with its plan (plan.py: tiling, blocks,
grid) and is written by the writer of its plan's kind (:data:`WRITERS`: flat.py, dot.py, on the
base writers of writer.py, whose docstring describes the register cache, bounds and
arithmetic). The partitioner's :func:`~ocannl.backends.partition.group` then puts kernels into
launches by their programs and the nodes they touch. A launch of one kernel is that kernel. A
grouped launch is a kernel of its own that calls its members, each written as a device
function taking its program number (``program``): the programs of segment
``s`` are those from the sum of the earlier segments' programs on, and a chain of
single-program kernels is called in order, with ``tl.debug_barrier()`` before a kernel that
touches a node an earlier one since the last barrier wrote (or writes one it read). The launch
takes the most warps and pipeline stages any member asks for: a member written for fewer warps
spreads its tiles over more threads, and the stages only apply to a member's ``tl.dot`` loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from ocannl.lowlevel.identifiers import Namespace, comment_text, sanitize_identifier
from ocannl.lowlevel.indexing import IndexSymbol
from ocannl.lowlevel.ir import RoutineIR

from ocannl.backends.partition import Kernel, Launch, conflicts, group, kernel_nodes
from ocannl.backends.triton.dot import DotKernelWriter
from ocannl.backends.triton.flat import FillKernelWriter, FlatKernelWriter
from ocannl.backends.triton.plan import DotPlan, FillPlan, FlatPlan, Plan, plan_kernel
from ocannl.backends.triton.writer import KernelSource, KernelWriter, Options, Param


@dataclass
class ModuleSource:
    routine: str
    """The routine's name sanitized: the stem of the module's file names."""
    kernels: list[KernelSource]
    text: str
    checks_positions: bool
    """Whether a kernel sets the error flag (a gather or scatter position, or an index through a
    symbol without a size, out of range)."""
    symbols: tuple[IndexSymbol, ...] = ()
    """The index symbols in the order of the symbol table ``launch`` takes (writer.Options.symbols)."""
    launches: tuple[Launch, ...] = ()
    """How the partition's kernels were grouped into the launches of ``kernels`` (partition.group)."""
    programs: tuple[int, ...] = ()
    """The programs each kernel of the partition runs (``launches`` refers to them by position)."""
    sites: dict[int, str] = field(default_factory=dict)
    """What each nonzero value of the error flag says went wrong (writer.ExpressionWriter.site)."""
    division_sites: frozenset[int] = frozenset()
    """The values of :attr:`sites` that are integer divisions by zero; the others are indices
    outside their axis."""


# ---------------------------------------------------------------------------------------------
# The module


def emit_module(routine: RoutineIR, kernels: list[Kernel], options: Options = Options(),
                plans: Sequence[Plan] | None = None) -> ModuleSource:
    """The Python source of the Triton module of ``routine``, partitioned into ``kernels``,
    planned as ``plans`` (one a kernel; by default each kernel's :func:`plan_kernel`)."""
    base = sanitize_identifier(routine.name) or "routine"
    options = replace(options, symbols=routine.static_symbols)
    plans = [plan_kernel(k) for k in kernels] if plans is None else plans
    written = [_write(f"{base}_{number}", kernel, plan, options)
               for number, (kernel, plan) in enumerate(zip(kernels, plans))]
    launches = group(kernels, [source.grid for _, source in written])
    sources: list[KernelSource] = []
    writers: list[KernelWriter] = []
    for number, launch in enumerate(launches):
        if len(launch.kernels) == 1:
            writer, source = written[launch.kernels[0]]
            writers.append(writer)
            sources.append(source)
            continue
        members = {k: _write(f"{base}_{k}", kernels[k], plans[k], options, segment=True) for k in launch.kernels}
        writers += [writer for writer, _ in members.values()]
        sources.append(_grouped(f"{base}_group{number}", launch, kernels,
                                {k: source for k, (_, source) in members.items()}))
    helpers = set().union(*(w.helpers for w in writers))
    native_bf16_dot = any(w.native_bf16_dot for w in writers)
    checks = any(p.is_error_flag for k in sources for p in k.params)
    sites: dict[int, str] = {}
    for w in writers:
        for number, message in w.sites.items():  # two messages of one digest: both are named
            sites[number] = message if sites.get(number, message) == message else f"{sites[number]}, or {message}"
    lines = [
        f'"""Triton kernels of routine {comment_text(routine.name)}: '
        f'{len(sources)} kernel{"s" if len(sources) != 1 else ""}.',
        "",
        "Generated by ocannl's Triton backend (ocannl/backends/triton) from the optimized loop IR",
        f'({comment_text(routine.name)}.ll); launch() runs the kernels in order."""',
        "",
        *(["import os", ""] if native_bf16_dot else []),
        "import triton",
        "import triton.language as tl",
        "",
    ]
    if helpers:
        lines.append(f"from ocannl.backends.triton.tlib import {', '.join(sorted(helpers))}")
        lines.append("")
    if native_bf16_dot:
        lines += ["NATIVE_BF16_DOT = tl.constexpr(os.environ.get(\"TRITON_INTERPRET\", \"0\") in (\"\", \"0\"))",
                  '"""bfloat16 tl.dot on the tensor cores; Triton\'s interpreter, which cannot multiply bfloat16',
                  'tiles, takes the equal TF32 dot of float32 tiles instead."""', ""]
    lines.append(f"FP_FUSION = {options.fp_fusion}")
    lines.append('"""Whether Triton may contract a * b + c into one rounding (the fast_math setting)."""')
    for k in sources:
        lines += ["", ""] + k.text.rstrip("\n").split("\n")
    lines += ["", "", *_launcher(routine, sources)]
    return ModuleSource(base, sources, "\n".join(lines) + "\n", checks, routine.static_symbols, tuple(launches),
                        tuple(source.grid for _, source in written), sites,
                        frozenset().union(*(w.division_sites for w in writers)))


def _write(name: str, kernel: Kernel, plan: Plan, options: Options,
           segment: bool = False) -> tuple[KernelWriter, KernelSource]:
    """``kernel`` written from ``plan`` (as a launch's device function when ``segment``)."""
    writer = WRITERS[type(plan)](name, kernel, plan, options, segment=segment)
    return writer, writer.emit()


WRITERS: dict[type, type[KernelWriter]] = {FillPlan: FillKernelWriter, FlatPlan: FlatKernelWriter,
                                           DotPlan: DotKernelWriter}
"""The writer of each kind of plan."""


def _argument(p: Param) -> object:
    """What a kernel parameter stands for, the same in every member of a launch."""
    if p.scratch is not None:
        return p.scratch[0]
    return p.node if p.node is not None else ("symbols" if p.symbols else "error")


def _grouped(name: str, launch: Launch, kernels: list[Kernel], members: dict[int, KernelSource]) -> KernelSource:
    """The kernel of a grouped launch (module docstring): its members' device functions, then a
    kernel that calls, in each program, the member its number falls to."""
    scope = Namespace({"pid", *(m.name for m in members.values())})  # a parameter would hide a member
    params: dict[object, Param] = {}
    for source in members.values():
        for p in source.params:
            key = _argument(p)
            if key not in params:
                pname = scope.claim(p.node.name, f"n{p.node.id}") if p.node is not None else scope.claim(p.name)
                params[key] = replace(p, name=pname)
    starts, programs, lines = [], 0, []
    for segment in launch.segments:
        starts.append(programs)
        count = members[segment[0]].grid
        test = f"pid < {programs + count}"
        lines.append(f"    {'if' if not lines else 'elif'} {test}:")
        number = "pid" if programs == 0 else f"pid - {programs}"
        since_barrier: list[int] = []
        for k in segment:
            if any(conflicts(kernel_nodes(kernels[k]), kernel_nodes(kernels[j])) for j in since_barrier):
                lines.append("        tl.debug_barrier()  # the stores of the calls above, visible to every thread")
                since_barrier = []
            since_barrier.append(k)
            m = members[k]
            args = [number] + [params[_argument(p)].name for p in m.params]
            args += [f"{c}={v}" for c, v in m.constexprs.items()]
            lines.append(f"        {m.name}({', '.join(args)})")
        programs += count
    doc = [f'    """One launch of {len(launch.kernels)} kernels over {programs} programs: segments of',
           "    programs that touch no node another segment writes (a chain: one program running its",
           "    kernels in order, with barriers).", ""]
    for start, segment in zip(starts, launch.segments):
        count = members[segment[0]].grid
        span = f"program {start}" if count == 1 else f"programs {start}-{start + count - 1}"
        doc.append(f"    {span}: {', '.join(members[k].name for k in segment)}")
    doc.append('    """')
    header = ["@triton.jit", f"def {name}({', '.join(p.name for p in params.values())}):"]
    text = "\n\n\n".join(members[k].text.rstrip("\n") for k in launch.kernels)
    text += "\n\n\n" + "\n".join(header + doc + ["    pid = tl.program_id(0)"] + lines) + "\n"
    stages = [m.num_stages for m in members.values() if m.num_stages is not None]
    return KernelSource(name, list(params.values()), {}, programs, max(m.num_warps for m in members.values()),
                        max(stages) if stages else None, text, "group",
                        any(m.uses_dot for m in members.values()), any(m.uses_atomics for m in members.values()))


def _launcher(routine: RoutineIR, kernels: list[KernelSource]) -> list[str]:
    lines = [
        "def launch(buffers, symbols, error):",
        '    """Run the kernels in order. ``buffers`` maps node names to tensors, ``symbols`` is the',
        '    int64 tensor of index symbol values (the symbol table), ``error`` a one-element int32',
        '    tensor (set when a position is out of range)."""',
    ]
    if not kernels:
        lines.append("    pass")
    for k in kernels:
        args = []
        for p in k.params:
            if p.node is not None:
                args.append(f'buffers["{p.node.name}"]')
            elif p.symbols:
                args.append("symbols")
            elif p.scratch is not None:
                args.append(f"buffers[{p.scratch[0]!r}]")
            else:
                args.append("error")
        args += [f"{name}={value}" for name, value in k.constexprs.items()]
        args.append(f"num_warps={k.num_warps}")
        if k.num_stages is not None:
            args.append(f"num_stages={k.num_stages}")
        args.append("enable_fp_fusion=FP_FUSION")
        call = f"    {k.name}[({k.grid},)]({', '.join(args)})"
        if len(call) <= 100:
            lines.append(call)
        else:
            lines.append(f"    {k.name}[({k.grid},)](")
            lines += [f"        {a}," for a in args]
            lines.append("    )")
    return lines


