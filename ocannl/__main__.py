"""``python -m ocannl doctor``: which backends work here, and why not.

Lists every registered backend, most preferred first, as available or not with the backend's own
reason (which, for an unavailable one, says how to fix it), then the backend ``Context.auto()``
picks and the settings that change the choice.
"""

from __future__ import annotations

import argparse
import sys

from ocannl import config
from ocannl.backends import registry
from ocannl.lowlevel.scalar_ops import LIBM_MAX_ULPS, LIBM_OPS


def doctor() -> int:
    """Prints the report; the exit status is 0 when some backend works (interp always does)."""
    print("ocannl backends (most preferred first):")
    for name in registry.registered_backends():
        ok, reason = registry.availability(name)
        print(f"  {name:<8} {'available' if ok else 'unavailable'}: {reason}")
    configured = config.get("backend")
    if configured:
        print(f"OCANNL_BACKEND={configured}: Context.auto() uses {configured}")
    else:
        # best_available() skips emulated backends (Triton's CPU interpreter, the Metal shim).
        print(f"Context.auto() picks: {registry.best_available()} (set OCANNL_BACKEND to choose another)")
    if "c" in registry.registered_backends():
        from ocannl.backends import cache
        from ocannl.backends.c.compiler import fast_mode, isa_setting

        print(f"C kernel cache: {cache.root() / 'c'} (OCANNL_CACHE_DIR moves it)")
        print(f"C target ISA: {isa_setting()} (OCANNL_C_ISA=portable builds kernels any CPU of this kind runs)")
        if fast_mode():
            mode = "fast (contraction): float results may differ from interp in the last bits"
        else:
            libm = ", ".join(sorted(op.value for op in LIBM_OPS))
            mode = (f"deterministic: bit-identical to interp except {libm} "
                    f"(numpy's and the C library's approximations: within {LIBM_MAX_ULPS} ulps)")
        print(f"C flags: {mode} (OCANNL_C_FAST=1 for the fast setting)")
    return 0  # best_available() above raised if nothing could run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ocannl", description="ocannl command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="list the backends that work here, and why the others do not")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    return 2


if __name__ == "__main__":
    sys.exit(main())
