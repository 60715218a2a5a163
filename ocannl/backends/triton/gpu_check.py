"""Compile generated kernels for a GPU without one: Triton's compiler (to PTX, then ``ptxas`` to a
cubin) runs on the CPU given an explicit target. The interpreter accepts code the compiler rejects
(loop-carried values that change type, ``tl.dot`` tiles under 16, a block stored through a scalar
pointer...), so the tests compile what they interpret.

It runs in a child process: ``@triton.jit`` functions (Triton's own ``tl.sum`` among them) are
interpreted or compiled according to ``TRITON_INTERPRET`` when triton is imported, and the tests
import it interpreted. ::

    from ocannl.backends.triton import generate
    from ocannl.backends.triton.gpu_check import compile_for_gpu
    compile_for_gpu([generate(routine.ir)])     # {kernel name: cubin size}, for sm_90 (H100)

or ``python -m ocannl.backends.triton.gpu_check DIR`` on modules written with their
``.json`` descriptions (what :func:`compile_for_gpu` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ocannl.backends.triton.emit import ModuleSource


class GpuCompileError(Exception):
    """A generated kernel that Triton's compiler rejects."""


def compile_for_gpu(sources: list[ModuleSource], arch: int = 90, timeout: float = 1800) -> dict[str, int]:
    """Compile every kernel of ``sources`` for an NVIDIA GPU of compute capability ``arch``; the
    size of each cubin by ``module:kernel``. Raises :class:`GpuCompileError` naming the kernels
    that do not compile, with Triton's message."""
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
    return result["sizes"]


def _compile_dir(directory: Path, arch: int) -> dict:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    sizes, errors = {}, {}
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
            try:
                compiled = triton.compile(ASTSource(fn=getattr(module, name), signature=signature,
                                                    constexprs=k["constexprs"]), target=target, options=options)
                sizes[f"{path.stem}:{name}"] = len(compiled.asm["cubin"])
            except Exception as exc:  # noqa: BLE001 - reported per kernel
                errors[f"{path.stem}:{name}"] = f"{type(exc).__name__}: {exc}"
    return {"sizes": sizes, "errors": errors}


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
