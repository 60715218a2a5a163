"""``bench/cpu_steps.py``: the models it times in PyTorch compute the same training steps as
ocannl's (the benchmark refuses to time them otherwise), and a quick run prints its table."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.backend_params import runs_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ and examples/

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not runs_here("c"), reason="the benchmark times the c backend")


def test_the_pytorch_models_train_as_ocannl_does():
    """Two steps of the MLP, the CNN and the moons demo from the same weights on the same
    batches: equal losses (the second step checks the gradients and the update too)."""
    from bench import cpu_steps

    built, inputs, labels = cpu_steps.build_mlp(batch=4)
    assert cpu_steps.check_losses("mlp", built.stepper(), cpu_steps.torch_mlp(torch, built, inputs, labels))
    built, inputs, labels = cpu_steps.build_cnn(batch=4)
    assert cpu_steps.check_losses("cnn", built.stepper(), cpu_steps.torch_cnn(torch, built, inputs, labels))
    assert cpu_steps.moons_check().startswith("loss ")


@pytest.mark.slow
def test_the_pytorch_transformer_trains_as_ocannl_does():
    from bench import cpu_steps

    built = cpu_steps.build_transformer()
    assert cpu_steps.check_losses("transformer", built.stepper(), cpu_steps.torch_transformer(torch, built))


def test_a_different_computation_is_refused():
    from bench import cpu_steps

    built, inputs, labels = cpu_steps.build_mlp(batch=4)
    eager = cpu_steps.torch_mlp(torch, built, inputs, labels)
    eager(1)  # PyTorch one step ahead: its losses are those of other weights
    with pytest.raises(RuntimeError, match=r"step 1's loss is .* on ocannl but .* on PyTorch"):
        cpu_steps.check_losses("mlp", built.stepper(), eager)


@pytest.mark.slow
def test_a_quick_run_prints_every_row(capsys):
    from bench import cpu_steps

    rows = cpu_steps.main(["--quick", "--repeat", "1", "--markdown"])
    out = capsys.readouterr().out
    workloads = [r.workload for r in rows]
    threads = os.cpu_count() or 1
    assert workloads[0] == "fp32 GEMM 128, 1 thread"
    assert threads == 1 or workloads[1] == f"fp32 GEMM 128, {threads} threads"
    assert any(w.startswith("MLP") for w in workloads) and any(w.startswith("CNN") for w in workloads)
    assert any(w.startswith("transformer") for w in workloads)
    assert "moons, one run() per step" in workloads and "moons, run_many" in workloads
    assert all(r.ratio > 0 and min(r.ours) > 0 for r in rows)
    assert "| workload |" in out and out.count("\n| ") >= len(rows) + 1
