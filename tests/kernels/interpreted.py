"""The kernel modules as the non-GPU tests see them.

Without a GPU: private copies of gossamer/kernels/<name>.py whose kernels run in the Triton
interpreter. Triton chooses interpreter or compiler when a kernel is decorated (at import), so each
copy is loaded under its own module name with TRITON_INTERPRET=1, whatever was imported earlier; the
regular modules are left alone (tests/kernels/conftest.py makes Triton's own standard library
interpreted on such machines).

A copy imports its sibling kernel modules as copies too. The interpreter cannot call compiled jit
functions (nor compiled kernels interpreted ones), and a kernel module's imports of its siblings
are of two kinds: at load, for jit helpers (`from gossamer.kernels import pdl`, moe_grouped_gemv's
`from gossamer.kernels.moe_mxfp4 import _group_dot, ...`), and at call time, for a module that
imports the caller's helpers and so cannot be imported at the top (moe_mxfp4.moe_mxfp4 imports
moe_grouped_gemv inside the function). Both go through the import statement, so each copy runs
with its own `__builtins__` whose `__import__` answers `gossamer.kernels.<name>` with the copy of
<name> (loaded on first use, then shared by every copy and test of the process) and everything
else as usual. No sys.modules entry is swapped, even for a moment: a CPU test that calls copy
A, which imports module B at call time, gets the copy of B, and the regular modules (the warm-up
recorder's, tests/runner/test_warmup.py) keep their regular imports.

With a GPU: the regular, compiled modules, and the same tiny tests run on the device (DEVICE).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType, SimpleNamespace

import pytest
import torch

from gossamer.testing import REPO_ROOT

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
PACKAGE = "gossamer.kernels"
KERNELS_DIR = REPO_ROOT / "gossamer" / "kernels"


def load_interpreted(name: str) -> ModuleType:
    """The interpreted copy of gossamer/kernels/<name>.py (one per process)."""
    module_name = f"_gossamer_kernels_{name}_interpreted"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, KERNELS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # NOTE: exec keeps a __builtins__ already in the globals, and the module's functions take
    # theirs from there, so imports inside them (at call time) come here too.
    module.__builtins__ = _COPY_BUILTINS
    sys.modules[module_name] = module  # dataclasses look their module up here
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module


def _is_kernel_module(name: str) -> bool:
    return (KERNELS_DIR / f"{name}.py").is_file()


def _import_copies(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
    """`__import__` for the copies: kernel modules of the package come as interpreted copies.

    `from gossamer.kernels.<name> import a, b` gets the copy of <name>; `from gossamer.kernels
    import <name>, ...` a namespace with the copies of those that are kernel modules (other names
    from the package itself). Everything else, `import gossamer.kernels.<name>` included (it binds
    the top package), is the regular import."""
    if level == 0 and fromlist:
        prefix, _, module = name.rpartition(".")
        if prefix == PACKAGE and _is_kernel_module(module):
            return load_interpreted(module)
        if name == PACKAGE:
            package = builtins.__import__(name, globals, locals, fromlist, level)
            return SimpleNamespace(**{
                item: load_interpreted(item) if _is_kernel_module(item) else getattr(package, item)
                for item in fromlist
            })  # fmt: skip
    return builtins.__import__(name, globals, locals, fromlist, level)


_COPY_BUILTINS = {**vars(builtins), "__import__": _import_copies}


def kernel_module(name: str) -> ModuleType:
    """gossamer.kernels.<name> in the form this machine runs: the module a kernel_fixture yields,
    and the one a copy's `import` of <name> gets (for tests that spy on a module that another
    imports)."""
    if ON_GPU:
        return importlib.import_module(f"{PACKAGE}.{name}")
    return load_interpreted(name)


def kernel_fixture(name: str) -> Callable[..., Iterator[ModuleType]]:
    """A pytest fixture yielding gossamer.kernels.<name> in the form this machine can run."""

    @pytest.fixture
    def fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
        if not ON_GPU:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        yield kernel_module(name)

    return fixture


def interpreted_triton_ops(monkeypatch: pytest.MonkeyPatch):
    """TritonOps with this machine's gemv, norm, embed and moe_mxfp4 modules (interpreted copies
    without a GPU), for tests of which kernels an op picks."""
    import gossamer.ops.triton as triton_ops

    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        names = ("moe_mxfp4", "gemv", "norm", "embed")
        modules = {name: load_interpreted(name) for name in names}
        monkeypatch.setattr(triton_ops, "gemv", modules["gemv"])
        monkeypatch.setattr(triton_ops, "norm", modules["norm"])
        monkeypatch.setattr(triton_ops, "embed", modules["embed"])
        monkeypatch.setattr(triton_ops, "_kernel_module", modules.get)
    return triton_ops.TritonOps()
