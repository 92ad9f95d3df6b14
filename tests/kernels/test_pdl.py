"""gossamer/kernels/pdl.py on the CPU: PDL is off wherever it cannot run (the GPU side is
tests/kernels/test_triton_model.py::test_programmatic_dependent_launch_changes_no_bit)."""

from __future__ import annotations

import torch

from gossamer.kernels import pdl


def test_off_on_the_cpu():
    assert not pdl.enabled(torch.device("cpu"))
    assert pdl.launch_options(torch.device("cpu")) == {"PDL": False}


def test_off_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled(torch.device("cuda", 0))  # decided before asking the (absent) GPU


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.launch_options(torch.device("cuda", 0)) == {"PDL": False}
