"""Import Triton once, before any kernel test module does, in the mode this machine can run.

Triton builds its standard library (tl.zeros, tl.cdiv, tl.sigmoid, ...) when it is first imported, as
interpreted or compiled functions depending on TRITON_INTERPRET at that moment, and kernels of the
other mode cannot call them. The CPU tests load interpreted copies of the kernel modules
(tests/kernels/interpreted.py); the GPU tests use the compiled modules. So: without a GPU, Triton is
first imported in interpreter mode (every kernel is interpreted, nothing is compiled); with a GPU, in
compiled mode (the GPU tests work; run CPU interpreter tests in a separate, GPU-less process if their
kernels use standard-library functions).
"""

from __future__ import annotations

import os

import torch

if torch.cuda.is_available():
    import importlib
    import pkgutil

    import triton.language  # noqa: F401

    import gossamer.kernels

    # NOTE: the regular kernel modules are imported here, compiled. An interpreted copy loads with
    # TRITON_INTERPRET=1 set, and a regular module first imported then (through the copy's other
    # imports) would get interpreted jit functions: on the H200 (seventh session) every GPU test
    # of a process whose first test module loaded copies failed to compile ("Unsupported function
    # referenced: InterpretedFunction" at pdl.wait).
    for _module in pkgutil.iter_modules(gossamer.kernels.__path__):
        importlib.import_module(f"gossamer.kernels.{_module.name}")
else:
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if _previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _previous
