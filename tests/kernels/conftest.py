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
    import triton.language  # noqa: F401

    # NOTE: pdl.py's gdc_wait lives here; imported first by an interpreted copy (with
    # TRITON_INTERPRET=1 set while it loads), it would be interpreted for the compiled kernels too
    import triton.language.extra.cuda  # noqa: F401
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
