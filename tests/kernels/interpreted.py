"""The kernel modules as the non-GPU tests see them.

Without a GPU: private copies of gossamer/kernels/<name>.py whose kernels run in the Triton
interpreter. Triton chooses interpreter or compiler when a kernel is decorated (at import), so each
copy is loaded under its own module name with TRITON_INTERPRET=1, whatever was imported earlier; the
regular modules are left alone (tests/kernels/conftest.py makes Triton's own standard library
interpreted on such machines).

With a GPU: the regular, compiled modules, and the same tiny tests run on the device (DEVICE).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType

import pytest
import torch

from gossamer.testing import REPO_ROOT

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def load_interpreted(name: str) -> ModuleType:
    path = REPO_ROOT / "gossamer" / "kernels" / f"{name}.py"
    module_name = f"_gossamer_kernels_{name}_interpreted"
    if module_name in sys.modules:
        return sys.modules[module_name]
    for helper in HELPER_MODULES:  # the regular modules, in this machine's mode, first
        importlib.import_module(f"gossamer.kernels.{helper}")
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up here
        with _interpreted_helpers(name):
            spec.loader.exec_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module


# Kernel files import jit helpers from these modules; an interpreted copy needs interpreted helpers
# (the interpreter cannot call compiled functions, nor compiled kernels interpreted ones).
HELPER_MODULES = ("pdl",)


@contextlib.contextmanager
def _interpreted_helpers(name: str) -> Iterator[None]:
    """While a copy of kernel module `name` is executed, `from gossamer.kernels import <helper>`
    gives interpreted copies of HELPER_MODULES; the regular (compiled) modules stay in place
    for everything else."""
    import gossamer.kernels as package

    helpers = [h for h in HELPER_MODULES if h != name]
    saved = {h: sys.modules[f"gossamer.kernels.{h}"] for h in helpers}
    try:
        for helper in helpers:
            copy = load_interpreted(helper)
            sys.modules[f"gossamer.kernels.{helper}"] = copy
            setattr(package, helper, copy)
        yield
    finally:
        for helper, regular in saved.items():
            sys.modules[f"gossamer.kernels.{helper}"] = regular
            setattr(package, helper, regular)


def kernel_fixture(name: str) -> Callable[..., Iterator[ModuleType]]:
    """A pytest fixture yielding gossamer.kernels.<name> in the form this machine can run."""

    @pytest.fixture
    def fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
        if ON_GPU:
            yield importlib.import_module(f"gossamer.kernels.{name}")
        else:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
            yield load_interpreted(name)

    return fixture
