"""Compile generated kernels for a GPU without one: Triton's compiler (to PTX, then ``ptxas`` to a
cubin) runs on the CPU given an explicit target. The interpreter accepts code the compiler rejects
(loop-carried values that change type, ``tl.dot`` tiles under 16, a block stored through a scalar
pointer...), so the tests compile what they interpret.

**What will run.** A launch specializes each kernel on its arguments: torch allocates every
buffer 16-byte aligned, so Triton compiles the pointer arguments as divisible by 16, which
changes vector widths and register use; the check compiles with that same specialization
(index symbols are never specialized: ``do_not_specialize``). For each kernel it reports the
cubin size, registers per thread, the bytes of register spills ``ptxas`` reports, and whether
the PTX uses Hopper's warp-group tensor-core instructions (``wgmma``); by default a kernel that
spills is an error (:class:`GpuCompileError`), as a spill on every program is a slow kernel.

It runs in a child process: ``@triton.jit`` functions (Triton's own ``tl.sum`` among them) are
interpreted or compiled according to ``TRITON_INTERPRET`` when triton is imported, and the tests
import it interpreted. ::

    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu
    compile_for_gpu([generate(routine.ir)])     # {"module:kernel": KernelBinary}, for sm_90 (H100)

or ``python -m ocannl.backends.triton.gpu_check DIR`` on modules written with their
``.json`` descriptions (what :func:`compile_for_gpu` does).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ocannl.backends.triton.emit import ModuleSource


class GpuCompileError(Exception):
    """A generated kernel that Triton's compiler rejects, or that spills registers."""


@dataclass(frozen=True)
class KernelBinary:
    """What compiling one kernel gave: the cubin's size in bytes, registers per thread, bytes
    of spill stores and loads per thread, and whether the PTX issues ``wgmma`` instructions."""

    cubin_bytes: int
    registers: int
    spill_stores: int
    spill_loads: int
    wgmma: bool

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def compile_for_gpu(sources: list[ModuleSource], arch: int = 90, timeout: float = 1800,
                    allow_spills: bool = False) -> dict[str, KernelBinary]:
    """Compile every kernel of ``sources`` for an NVIDIA GPU of compute capability ``arch``, with
    the specialization a launch uses; what each gave, by ``module:kernel``. Raises
    :class:`GpuCompileError` naming the kernels that do not compile, with Triton's message, or
    (unless ``allow_spills``) that spill registers."""
    with tempfile.TemporaryDirectory() as tmp:
        for n, source in enumerate(sources):
            stem = f"m{n}_{source.routine[:40]}"
            Path(tmp, f"{stem}.py").write_text(source.text)
            meta = {k.name: {"signature": {p.name: p.signature for p in k.params}, "constexprs": k.constexprs,
                             "num_warps": k.num_warps, "num_stages": k.num_stages} for k in source.kernels}
            Path(tmp, f"{stem}.json").write_text(json.dumps(meta))
        env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0")
        done = subprocess.run([sys.executable, "-m", "ocannl.backends.triton.gpu_check", tmp, "--arch", str(arch)],
                              capture_output=True, text=True, env=env, timeout=timeout)
        if done.returncode != 0 and not done.stdout.strip():
            raise GpuCompileError(done.stderr[-4000:])
        result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise GpuCompileError("\n\n".join(f"{name}: {err}" for name, err in result["errors"].items()))
    binaries = {name: KernelBinary(**info) for name, info in result["kernels"].items()}
    spilling = {name: b for name, b in binaries.items() if b.spills}
    if spilling and not allow_spills:
        raise GpuCompileError("kernels spill registers on sm_%d: " % arch + "; ".join(
            f"{name}: {b.spill_stores} bytes stored, {b.spill_loads} loaded per thread ({b.registers} registers)"
            for name, b in spilling.items()))
    return binaries


def _compile_dir(directory: Path, arch: int) -> dict:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from triton import knobs

    knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report (registers, spills) goes to stdout
    target = GPUTarget("cuda", arch, 32)
    kernels, errors = {}, {}
    for path in sorted(directory.glob("*.py")):
        meta = json.loads(path.with_suffix(".json").read_text())
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        for name, k in meta.items():
            signature = dict(k["signature"])
            signature.update({c: "constexpr" for c in k["constexprs"]})
            options = {"num_warps": k["num_warps"], "enable_fp_fusion": False}
            if k["num_stages"]:
                options["num_stages"] = k["num_stages"]
            fn = getattr(module, name)
            aligned = {(fn.arg_names.index(p),): [["tt.divisibility", 16]]
                       for p, kind in k["signature"].items() if kind.startswith("*")}
            log = io.StringIO()
            try:
                with contextlib.redirect_stdout(log):
                    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=k["constexprs"],
                                                        attrs=aligned), target=target, options=options)
            except Exception as exc:  # noqa: BLE001 - reported per kernel
                errors[f"{path.stem}:{name}"] = f"{type(exc).__name__}: {exc}"
                continue
            report = log.getvalue() or _ptxas_log(compiled.asm["ptx"], arch)  # a cached kernel ran no ptxas
            kernels[f"{path.stem}:{name}"] = dict(cubin_bytes=len(compiled.asm["cubin"]), **_ptxas_report(report),
                                                  wgmma="wgmma.mma_async" in compiled.asm["ptx"])
    return {"kernels": kernels, "errors": errors}


def _ptxas_log(ptx: str, arch: int) -> str:
    """``ptxas -v``'s report on ``ptx``, assembled as Triton does (no fused multiply-add, its
    register allocation setting) for the same GPU."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "kernel.ptx")
        source.write_text(ptx)
        done = subprocess.run([get_ptxas(arch).path, "-v", "--fmad=false", "--regAllocOptLevel=2",
                               f"--gpu-name={sm_arch_from_capability(arch)}", str(source), "-o", str(Path(tmp, "k.o"))],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise GpuCompileError(f"ptxas failed on a kernel Triton compiled: {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def _ptxas_report(log: str) -> dict[str, int]:
    """Registers and spill bytes from ``ptxas -v``'s log (``Used 40 registers``, ``8 bytes spill
    stores, 8 bytes spill loads``)."""
    registers = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not registers:
        raise GpuCompileError(f"no register report in the ptxas log: {log[-2000:]!r}")
    return {"registers": max(map(int, registers)),
            "spill_stores": sum(int(a) for a, _ in spills), "spill_loads": sum(int(b) for _, b in spills)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("run with TRITON_INTERPRET=0: interpreted functions cannot be compiled", file=sys.stderr)
        return 2
    result = _compile_dir(args.directory, args.arch)
    print(json.dumps(result))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
