"""Checkpoints (ocannl/checkpoint.py, train.save_checkpoint / load_checkpoint): values round-trip
bit for bit on every backend, a file that does not fit is an error naming the tensor, writes are
atomic, and training resumed from a checkpoint in a fresh session (or process, with dropout and
batch norm in the model) gives the bits of an uninterrupted run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import safetensors
from safetensors.numpy import save_file

from backend_params import default_context
import ocannl as oc
import ocannl.session
from ocannl import checkpoint, nn, train
from ocannl.errors import CheckpointError
from ocannl.lowlevel import dtypes

BACKENDS = ("interp", "c", "metal", "triton")

RNG = np.random.default_rng(16)
X = RNG.normal(size=(4, 3)).astype(np.float32)
T = RNG.normal(size=(4, 2)).astype(np.float32)


def model(backend: str):
    """An MLP block and a few extra parameters of other precisions, with their output (Metal
    has no float64: float16 there)."""
    m = nn.mlp(hid_dims=(4,), label="mlp")
    scale = oc.param("scale", output=2, input=(), init=[1.5, -0.75], dtype="float16" if backend == "metal" else "float64")
    bias16 = oc.param("bias16", output=2, input=(), init=[0.1, 1.1], dtype="bfloat16")
    y = (m(oc.tensor(X, batch=1)) * scale + bias16).sum()
    return m, scale, bias16, y


def bits(t) -> np.ndarray:
    """A tensor's value as the bits its buffer holds (bfloat16 as uint16)."""
    return dtypes.to_storage(t.dtype, t.numpy(), t.label)


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_in_a_fresh_session_gives_the_same_bits(backend, tmp_path):
    path = tmp_path / "model.safetensors"
    ctx = default_context(backend)
    m, scale, bias16, y = model(backend)
    ctx.compile(y).run()
    saved = {p.label: bits(p) for p in [*m.params, scale, bias16]}
    out = y.numpy()
    oc.save(path, [m, scale, bias16])

    ocannl.session.reset()
    oc.seed(123)  # another initialization: only loading can give back the saved values
    ctx = default_context(backend)
    m, scale, bias16, y = model(backend)
    oc.load(path, [m, scale, bias16])
    ctx.compile(y).run()
    assert {p.label: bits(p) for p in [*m.params, scale, bias16]}.keys() == saved.keys()
    for p in [*m.params, scale, bias16]:
        np.testing.assert_array_equal(bits(p), saved[p.label], err_msg=p.label)
    np.testing.assert_array_equal(y.numpy(), out)


def test_bfloat16_is_stored_as_bf16_bits_other_frameworks_read(tmp_path):
    path = tmp_path / "bf16.safetensors"
    values = np.array([1.1, -3.0e38, 2.0**-130, 7.0], np.float32)  # rounded, large, subnormal
    p = oc.param("p", output=4, input=(), init=values, dtype="bfloat16")
    oc.save(path, p)
    [(name, info)] = safetensors.deserialize(path.read_bytes())
    assert (name, info["dtype"], info["shape"]) == ("p", "BF16", [4])
    stored = np.frombuffer(bytes(info["data"]), dtype="<u2")
    np.testing.assert_array_equal(stored, dtypes.float32_to_bfloat16_bits(values))
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    loaded = load_file(str(path))["p"]
    assert loaded.dtype == torch.bfloat16
    np.testing.assert_array_equal(loaded.float().numpy(), p.numpy())


def test_a_mapping_names_tensors_and_prefixes_blocks(tmp_path):
    path = tmp_path / "named.safetensors"
    enc = nn.mlp(hid_dims=(2,), label="mlp")
    w = oc.param("w", output=3, input=(), init=[1.0, 2.0, 3.0])
    (enc(oc.tensor(X, batch=1)) - oc.tensor(T, batch=1)).numpy()
    oc.save(path, {"encoder": enc, "weights": w})
    names = sorted(name for name, _ in safetensors.deserialize(path.read_bytes()))
    assert names == sorted(["weights"] + [f"encoder.{p.label}" for p in enc.params])


def test_two_tensors_with_one_label_are_an_error_naming_it(tmp_path):
    a = oc.param("w", output=2, input=(), init=0.0)
    b = oc.param("w", output=2, input=(), init=1.0)
    with pytest.raises(CheckpointError, match=r"both named 'w'.*distinct labels"):
        oc.save(tmp_path / "x.safetensors", [a, b])
    oc.save(tmp_path / "x.safetensors", {"a": a, "b": b})  # the fix the message gives
    oc.save(tmp_path / "y.safetensors", [a, a])  # one tensor listed twice is saved once


class TestMismatches:
    """Loading checks everything before assigning anything; each error names the tensor."""

    @pytest.fixture
    def saved(self, tmp_path):
        path = tmp_path / "ckpt.safetensors"
        w = oc.param("w", output=2, input=3, init=np.arange(6.0).reshape(2, 3))
        b = oc.param("b", output=2, input=(), init=[5.0, 6.0])
        oc.save(path, [w, b])
        ocannl.session.reset()
        return path

    def test_other_dims(self, saved):
        w = oc.param("w", output=2, input=4, init=0.0)
        b = oc.param("b", output=2, input=(), init=0.0)
        with pytest.raises(CheckpointError, match=r"'w' has dims \(2, 3\) in the file, but w has dims \(2, 4\)"):
            oc.load(saved, [b, w])
        np.testing.assert_array_equal(b.numpy(), [0.0, 0.0])  # b fit, but nothing was assigned

    def test_other_precision(self, saved):
        w = oc.param("w", output=2, input=3, init=0.0, dtype="float64")
        with pytest.raises(CheckpointError, match=r"'w' is float32 in the file, but w is float64"):
            oc.load(saved, w, strict=False)

    def test_missing_name(self, saved):
        v = oc.param("v", output=2, input=(), init=0.0)
        with pytest.raises(CheckpointError, match=r"no value for 'v' \(it holds: b, w\)"):
            oc.load(saved, v, strict=False)

    def test_names_left_over_need_strict_false(self, saved):
        w = oc.param("w", output=2, input=3, init=0.0)
        with pytest.raises(CheckpointError, match=r"names not being loaded: 'b'.*strict=False"):
            oc.load(saved, w)
        oc.load(saved, w, strict=False)
        np.testing.assert_array_equal(w.numpy(), np.arange(6.0).reshape(2, 3))

    def test_not_a_safetensors_file(self, tmp_path):
        path = tmp_path / "garbage.safetensors"
        path.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
        with pytest.raises(CheckpointError, match="not a readable safetensors file"):
            oc.load(path, oc.param("w", output=1, input=(), init=0.0))


def test_a_failed_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    w = oc.param("w", output=2, input=(), init=[1.0, 2.0])
    oc.save(path, w)
    before = path.read_bytes()
    w.set(np.array([3.0, 4.0], np.float32))

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        oc.save(path, w)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == [path.name]


def test_a_value_that_cannot_be_read_writes_nothing(tmp_path):
    ocannl.session.reset()
    i = oc.IndexSymbol("i", 4)
    x = oc.tensor(X, batch=1)
    row = x[i] * 2  # reading it needs a binding for i: an error, before anything is written
    with pytest.raises(oc.errors.IndexBindingError):
        oc.save(tmp_path / "ckpt.safetensors", [oc.param("w", output=1, input=(), init=1.0), row])
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Training checkpoints: resuming gives the bits of an uninterrupted run.

STEPS, SPLIT = 6, 3


def training(kind: str):
    w = oc.param("w", output=2, input=3)
    b = oc.param("b", output=2, input=(), init=0.1)
    loss = ((w @ oc.tensor(X, batch=1) + b - oc.tensor(T, batch=1)) ** 2).sum()
    update = train.grad_update(loss)
    opt = (train.sgd_update(update, lr=0.05, momentum=0.9, weight_decay=0.01) if kind == "sgd-momentum"
           else train.adam_update(update, lr=0.05, weight_decay=0.01))
    return update, opt, [w, b]


def final_state(opt, params, ctx) -> dict[str, np.ndarray]:
    """Every parameter and optimizer state value, as bits."""
    values = {p.label: ctx.get(p) for p in params}
    values.update({f"{p.label}.{what}": ctx.get(node) for p, what, node in opt.states})
    return values


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, through_context", [("sgd-momentum", True), ("adam", False), ("adam", True)])
def test_resumed_training_gives_the_bits_of_an_uninterrupted_run(backend, kind, through_context, tmp_path):
    path = tmp_path / "train.safetensors"
    oc.seed(7)
    ctx = default_context(backend)
    update, opt, params = training(kind)
    step = ctx.compile(update, opt)
    for _ in range(STEPS):
        step.run()
    uninterrupted = final_state(opt, params, ctx)
    assert any(what == "adam_step" for _, what, _ in opt.states) == (kind == "adam")

    ocannl.session.reset()
    oc.seed(7)
    ctx = default_context(backend)
    update, opt, params = training(kind)
    step = ctx.compile(update, opt)
    for _ in range(SPLIT):
        step.run()
    train.save_checkpoint(path, opt, context=ctx if through_context else None)

    ocannl.session.reset()
    oc.seed(99)  # the resumed run initializes differently: all its state must come from the file
    ctx = default_context(backend)
    update, opt, params = training(kind)
    if through_context:
        train.load_checkpoint(path, opt, context=ctx)
        step = ctx.compile(update, opt)
    else:  # loaded before any context holds them: the first compile starts from the file
        train.load_checkpoint(path, opt)
        step = ctx.compile(update, opt)
    for _ in range(STEPS - SPLIT):
        step.run()
    resumed = final_state(opt, params, ctx)
    assert resumed.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    if kind == "adam":
        assert resumed["w.adam_step"] == STEPS


def test_a_training_checkpoint_names_parameters_and_their_state(tmp_path):
    path = tmp_path / "train.safetensors"
    update, opt, params = training("adam")
    oc.Context("interp").compile(update, opt).run()
    train.save_checkpoint(path, opt)
    names = sorted(name for name, _ in safetensors.deserialize(path.read_bytes()))
    assert names == sorted(f"{p}{s}" for p in ("w", "b") for s in ("", ".adam_m", ".adam_v", ".adam_step"))
    with pytest.raises(CheckpointError, match=r"names not being loaded: 'b.adam_m'"):
        oc.load(path, params)  # the model alone: the optimizer state is left over
    oc.load(path, params, strict=False)


def test_without_safetensors_saving_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    import ocannl as oc
    from ocannl.errors import CheckpointError

    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails as if not installed
    t = oc.tensor(np.ones(2, np.float32), label="t")
    with pytest.raises(CheckpointError, match=r"ocannl\[checkpoints\]"):
        oc.save(tmp_path / "c.safetensors", [t])


# ---------------------------------------------------------------------------------------------
# Files that lie about their types, paths that are not plain files, and temporaries of killed saves.


def _saved_by_another_tool(path, dtypes_metadata: str) -> None:
    """An int32 ``w`` of dims (2, 3), whose ``ocannl.dtypes`` metadata is ``dtypes_metadata``."""
    save_file({"w": np.arange(6, dtype=np.int32).reshape(2, 3)}, str(path),
              metadata={"ocannl.dtypes": dtypes_metadata})


def test_the_header_type_is_the_truth_and_metadata_disagreeing_is_an_error(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    _saved_by_another_tool(path, json.dumps({"w": "float32"}))
    w = oc.param("w", output=2, input=3, init=0.0)
    with pytest.raises(CheckpointError, match=r"'w' is stored as I32 in the file's header, but its ocannl.dtypes "
                                              r"metadata records float32"):
        oc.load(path, w)
    np.testing.assert_array_equal(w.numpy(), np.zeros((2, 3)))


@pytest.mark.parametrize("recorded", ['["w", "float32"]', '"float32"', "{oops", '{"w": 32}', '{"w": "float8"}'])
def test_malformed_precision_metadata_is_an_error(tmp_path, recorded):
    path = tmp_path / "ckpt.safetensors"
    _saved_by_another_tool(path, recorded)
    with pytest.raises(CheckpointError, match=r"ocannl.dtypes metadata .* must be a JSON object mapping names to "
                                              r"ocannl precisions"):
        oc.load(path, oc.param("w", output=2, input=3, init=0.0, dtype="int32"))


def test_a_directory_is_no_checkpoint_path(tmp_path):
    w = oc.param("w", output=2, input=(), init=[1.0, 2.0])
    for step in (oc.save, oc.load):
        with pytest.raises(CheckpointError, match=r"is a directory: name a file in it"):
            step(tmp_path, w)
    assert os.listdir(tmp_path) == []


def test_a_file_that_is_not_there_is_an_error_naming_it(tmp_path):
    with pytest.raises(CheckpointError, match=r"there is no checkpoint file .*missing.safetensors"):
        oc.load(tmp_path / "missing.safetensors", oc.param("w", output=2, input=(), init=0.0))


def test_saving_through_a_link_replaces_the_file_it_points_to(tmp_path):
    (tmp_path / "runs").mkdir()
    target = tmp_path / "runs" / "ckpt.safetensors"
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)  # dangling until the first save
    w = oc.param("w", output=2, input=(), init=[1.0, 2.0])
    for value in ([1.0, 2.0], [3.0, 4.0]):
        w.set(np.array(value, np.float32))
        oc.save(link, w)
        assert link.is_symlink() and link.resolve() == target
        assert sorted(os.listdir(tmp_path / "runs")) == ["ckpt.safetensors"]
        v = oc.param("w", output=2, input=(), init=0.0)
        oc.load(target, v)
        np.testing.assert_array_equal(v.numpy(), value)


def test_saving_removes_the_temporaries_of_saves_killed_over_an_hour_ago(tmp_path):
    killed = tmp_path / ".ckpt.safetensors.k9_x2ab7.tmp"  # a save killed before its rename
    running = tmp_path / ".ckpt.safetensors.r4nn1ng0.tmp"  # a save that may still be writing
    unrelated = tmp_path / ".notes.tmp"  # not a name a save gives its temporary file
    hour_and_more = time.time() - 3700
    for f in (killed, running, unrelated):
        f.write_bytes(b"partial")
    for f in (killed, unrelated):
        os.utime(f, (hour_and_more, hour_and_more))
    oc.save(tmp_path / "other.safetensors", oc.param("w", output=2, input=(), init=[1.0, 2.0]))
    assert sorted(os.listdir(tmp_path)) == sorted([running.name, unrelated.name, "other.safetensors"])


# ---------------------------------------------------------------------------------------------
# Every value a routine updates across runs belongs to the checkpoint: dropout's run counters and
# batch norm's running statistics, beside the parameters and the optimizer state.

RESUME_AT, RESUMED_STEPS = 3, 3


def dropout_batch_norm_training():
    """The loss (stored by every run), gradient update and Adam step of a model with batch norm
    and dropout 0.2. The masks depend on the seed and the program as well as on the run counters:
    a resumed run rebuilds the same program under the same seed."""
    oc.seed(7)
    l1, bn, l2 = nn.linear(4, label="l1"), nn.batch_norm(label="bn"), nn.linear(2, label="l2")
    h = nn.dropout(oc.relu(bn(l1(oc.tensor(X, batch=1)))), 0.2, label="drop")
    loss = ((l2(h) - oc.tensor(T, batch=1)) ** 2).sum().materialize()
    update = train.grad_update(loss)
    return loss, update, train.adam_update(update, lr=0.05)


def run_steps(ctx, training, n: int) -> list[float]:
    """The losses of ``n`` steps of ``training`` (:func:`dropout_batch_norm_training`) on ``ctx``."""
    loss, update, opt = training
    step = ctx.compile(update, opt)
    losses = []
    for _ in range(n):
        step.run()
        losses.append(float(ctx.get(loss)))
    return losses


def resume(backend: str, directory: str) -> None:
    """Run in a fresh process: load ``resume_at.safetensors``, train on, save the final state as
    ``resumed.safetensors`` and print the losses."""
    ctx = oc.Context(backend)
    training = dropout_batch_norm_training()
    train.load_checkpoint(os.path.join(directory, "resume_at.safetensors"), training[2])
    losses = run_steps(ctx, training, RESUMED_STEPS)
    train.save_checkpoint(os.path.join(directory, "resumed.safetensors"), training[2], context=ctx)
    print(json.dumps(losses))


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_training_with_dropout_and_batch_norm_resumed_in_a_fresh_process_is_uninterrupted(backend, tmp_path):
    ctx = default_context(backend)
    training = dropout_batch_norm_training()
    uninterrupted = run_steps(ctx, training, RESUME_AT + RESUMED_STEPS)
    train.save_checkpoint(tmp_path / "uninterrupted.safetensors", training[2], context=ctx)

    ocannl.session.reset()
    ctx = default_context(backend)
    training = dropout_batch_norm_training()
    assert run_steps(ctx, training, RESUME_AT) == uninterrupted[:RESUME_AT]
    train.save_checkpoint(tmp_path / "resume_at.safetensors", training[2])

    tests = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests), str(tests.parent), os.environ.get("PYTHONPATH", "")]))
    code = f"from test_checkpoint import resume; resume({backend!r}, {str(tmp_path)!r})"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.splitlines()[-1]) == uninterrupted[RESUME_AT:]
    expected = dict(safetensors.deserialize((tmp_path / "uninterrupted.safetensors").read_bytes()))
    resumed = dict(safetensors.deserialize((tmp_path / "resumed.safetensors").read_bytes()))
    assert {"drop_draw_run", "bn_running_mean", "bn_running_var", "bn_gamma.adam_step"} <= expected.keys()
    assert resumed.keys() == expected.keys()
    for name, stored in expected.items():
        assert resumed[name] == stored, name  # precision, dims and bits


@pytest.mark.parametrize("backend", ["interp", "c"])
def test_a_batch_norm_loaded_into_a_fresh_block_evaluates_as_the_saved_one(backend, tmp_path):
    path = tmp_path / "bn.safetensors"
    ctx = default_context(backend)
    bn = nn.batch_norm(label="bn")
    training = ctx.compile(bn(oc.tensor(X, batch=1)))
    for _ in range(3):  # the running statistics move away from 0 and 1
        training.run()
    evaluated = bn(oc.tensor(T[:, :1] + X, batch=1), train=False).numpy()
    oc.save(path, bn)

    ocannl.session.reset()
    default_context(backend)
    bn = nn.batch_norm(label="bn")
    evaluation = bn(oc.tensor(T[:, :1] + X, batch=1), train=False)  # the first call makes the running statistics
    oc.load(path, bn)
    np.testing.assert_array_equal(evaluation.numpy(), evaluated)
    assert sorted(name for name, _ in safetensors.deserialize(path.read_bytes())) == [
        "bn_beta", "bn_gamma", "bn_running_mean", "bn_running_var"]


def test_a_checkpoint_without_the_state_is_an_error_naming_it_unless_allowed(tmp_path):
    path = tmp_path / "without_state.safetensors"
    ctx = default_context("interp")
    training = dropout_batch_norm_training()
    opt = training[2]
    run_steps(ctx, training, 2)
    held = {e.name: e for e in train.checkpoint_entries(opt)}
    # what a training checkpoint held before it held the state the forward code updates
    checkpoint.write(path, [e for e in held.values() if e.tensor is None or e.tensor.is_param])
    run_steps(ctx, training, 1)
    with pytest.raises(CheckpointError, match=r"no value for 'bn_running_mean', 'bn_running_var', 'drop_draw_run' "
                                              r"\(it holds: .*\); .*pass allow_missing_state=True"):
        train.load_checkpoint(path, opt)
    with pytest.warns(checkpoint.CheckpointWarning, match=r"no value for 'bn_running_mean', 'bn_running_var', "
                                                           r"'drop_draw_run'.*not continue the saved run"):
        train.load_checkpoint(path, opt, allow_missing_state=True)
    assert ctx.get(held["drop_draw_run"].node) == 3  # kept: three runs so far
    np.testing.assert_array_equal(ctx.get(held["l1_w.adam_step"].node), 2)  # loaded


def test_two_dropouts_named_alike_are_an_error_saying_how_to_label_them(tmp_path):
    h = oc.relu(nn.linear(3, label="l1")(oc.tensor(X, batch=1)))
    loss = (nn.dropout(h + 1.0, 0.1) * nn.dropout(h + 2.0, 0.1)).sum()  # both dropouts of an 'add'
    opt = train.sgd_update(train.grad_update(loss))
    with pytest.raises(CheckpointError, match=r"both named 'add_dropout_draw_run' .*nn.dropout\(x, rate, label=...\)"):
        train.save_checkpoint(tmp_path / "ckpt.safetensors", opt)
