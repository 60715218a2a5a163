"""``bench/cpu_steps.py``: the models it times in PyTorch and JAX (``bench/peers.py``) compute the
same training steps as ocannl's (the benchmark refuses to time them otherwise), a side run as its
own process checks its losses against ocannl's, the table names a missing peer and compares with
the strongest one, and a quick run prints its table."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.backend_params import runs_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ and examples/

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not runs_here("c"), reason="the benchmark times the c backend"),
              # The benchmark runs each side in its own process; here JAX shares one with the C compiler's.
              pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")]

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")


def _agree(workload: str, peer: str) -> str:
    """Two steps of ``workload`` (its quick sizes) on ocannl and on ``peer`` from the same
    weights on the same batches: equal losses (the second step checks the gradients and the
    update too)."""
    from bench import cpu_steps, peers

    built = cpu_steps.WORKLOAD_KEYS[workload].built(quick=True)
    return cpu_steps.check_losses(workload, built.stepper(), peers.stepper(peer, built.experiment), peer)


def test_the_pytorch_models_train_as_ocannl_does():
    from bench import cpu_steps, peers

    assert _agree("mlp", peers.EAGER) and _agree("cnn", peers.EAGER)
    assert cpu_steps.moons_check().startswith("loss ")


@needs_jax
def test_the_jax_models_train_as_ocannl_does():
    from bench import peers

    assert _agree("mlp", peers.JAX) and _agree("cnn", peers.JAX)


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["PyTorch eager", pytest.param("JAX jit", marks=needs_jax)])
@pytest.mark.parametrize("workload", ["transformer", "gpt", "mlp-large"])
def test_the_transformers_train_as_ocannl_does(workload, peer):
    assert _agree(workload, peer)


@pytest.mark.slow
def test_the_compiled_pytorch_model_trains_as_ocannl_does():
    assert _agree("gpt", "torch.compile")


def test_a_different_computation_is_refused():
    from bench import cpu_steps, peers

    built = cpu_steps.WORKLOAD_KEYS["mlp"].built(quick=True)
    eager = peers.stepper(peers.EAGER, built.experiment)
    eager(1)  # PyTorch one step ahead: its losses are those of other weights
    with pytest.raises(RuntimeError, match=r"step 1's loss is .* on ocannl but .* on PyTorch eager"):
        cpu_steps.check_losses("mlp", built.stepper(), eager)


def test_a_side_starts_from_the_experiment_ocannl_wrote_and_checks_its_losses(tmp_path):
    """ocannl's side writes the experiment; a peer's side loads it, trains to ocannl's first
    losses and times its rounds, and refuses other losses before timing."""
    from bench import cpu_steps, peers

    workload, experiment = cpu_steps.WORKLOAD_KEYS["mlp"], tmp_path / "experiment.npz"
    ours = cpu_steps.run_side(cpu_steps.OURS, workload, True, experiment, None, repeat=1, round_seconds=1e-3)
    assert experiment.exists() and ours.cold > 0 and len(ours.rounds) == 1
    sides = [peers.EAGER] + ([peers.JAX] if peers.missing(peers.JAX) is None else [])
    for side in sides:
        theirs = cpu_steps.run_side(side, workload, True, experiment, ours.losses, repeat=1, round_seconds=1e-3)
        assert theirs.losses == pytest.approx(ours.losses, rel=cpu_steps.LOSS_RTOL) and min(theirs.rounds) > 0
    with pytest.raises(RuntimeError, match=r"step 2's loss is .* on ocannl but .* on PyTorch eager"):
        cpu_steps.run_side(peers.EAGER, workload, True, experiment, [ours.losses[0], ours.losses[1] + 1.0],
                           repeat=1, round_seconds=1e-3)


def test_the_table_names_a_missing_peer_and_compares_with_the_strongest(capsys, monkeypatch):
    from bench import cpu_steps, peers

    monkeypatch.setitem(sys.modules, "jax", None)  # as if JAX were not installed
    assert peers.missing(peers.JAX) == "jax" and peers.missing(peers.EAGER) is None
    row = cpu_steps.Row("MLP step", [1e-3, 2e-3], {peers.EAGER: [3e-3], peers.COMPILED: [1.5e-3], peers.JAX: None})
    assert row.strongest == peers.COMPILED and row.ratio == pytest.approx(1.5)
    cold = cpu_steps.Row("cold compile: MLP", [2.0], {peers.COMPILED: [5.0, 4.0], peers.JAX: None})
    cpu_steps.print_table([row, cold], markdown=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| workload | ocannl c, best [median] | PyTorch eager, best [median] | torch.compile, best "
                        "[median] | JAX jit, best [median] | strongest peer / ocannl | note |")
    assert lines[2] == ("| MLP step | 1 ms [1.5 ms] | 3 ms [3 ms] | 1.5 ms [1.5 ms] | not installed | "
                        "1.50x (torch.compile) |  |")
    assert lines[3] == "| cold compile: MLP | 2 s [2 s] |  | 4 s [4.5 s] | not installed | 2.00x (torch.compile) |  |"


@pytest.mark.slow
def test_a_quick_run_prints_every_row(capsys):
    from bench import cpu_steps, peers

    rows = cpu_steps.main(["--quick", "--repeat", "1", "--markdown"])
    out = capsys.readouterr().out
    workloads = [r.workload for r in rows]
    threads = os.cpu_count() or 1
    assert workloads[0] == "fp32 GEMM 128, 1 thread"
    assert threads == 1 or workloads[1] == f"fp32 GEMM 128, {threads} threads"
    for start in ("MLP 64-", "CNN", "transformer", "MLP 784-", "GPT", "cold compile: MLP", "cold compile: GPT"):
        assert any(w.startswith(start) for w in workloads), start
    assert "moons, one run() per step" in workloads and "moons, run_many" in workloads
    steps = next(r for r in rows if r.workload.startswith("GPT"))
    assert set(steps.references) == set(peers.PEERS)
    assert all(r.ratio > 0 and min(r.ours) > 0 for r in rows)
    assert "| workload |" in out and out.count("\n| ") >= len(rows) + 1
