"""Data-parallel training: replicas of one model on several contexts and processes, their
gradients averaged before every update (docs/distributed.md).

Every replica is a :class:`~ocannl.backends.context.Context` holding its own buffers for the same
tensor graph; it is given its own slice of each global batch (:func:`shard`). A training step of
:class:`DataParallel` is three phases:

1. each replica runs the gradient routine (forward and backprop) on its slice;
2. the gradients are summed: first the replicas of this process, into the first of them (the
   *owner*), the way OCANNL's merge buffers do it -- each gradient is copied into a merge node on
   the owner and a compiled routine adds it in (``p.grad =+ p.grad.merge``), replica after
   replica in a fixed order; then the owners of all processes, with one ``torch.distributed``
   all-reduce per gradient (gloo for host buffers, NCCL for CUDA ones), in place on the owner's
   buffers where the precision allows (a zero-copy DLPack view of the context's own buffer);
3. the owner runs a routine that divides each gradient by the number of replicas and then the
   optimizer step; the other replicas of the process receive the new parameters.

Every process divides the same all-reduced sums by the same count with the same compiled code,
so all replicas hold the same bits after every step; :meth:`DataParallel.check_replicas` verifies
it. torch is imported only when processes are involved (:func:`init_process_group`, :func:`launch`,
or a process group already set up): one process with several contexts needs only ocannl.
"""

from __future__ import annotations

import hashlib
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ocannl.backends.context import Context, default_context
from ocannl.errors import IndexBindingError, OcannlError, ShapeError
from ocannl.lowlevel import dtypes
from ocannl.lowlevel.assignments import Accum, Block, Computation
from ocannl.lowlevel.scalar_ops import Binop, Unop
from ocannl.lowlevel.tnode import TNode, sanitize_identifier
from ocannl.shape.projections import identity_projections

DEFAULT_TIMEOUT_S = 300.0
"""How long a collective (and :func:`launch`'s wait for its workers) may take before it fails
instead of hanging on a replica that died or never came."""

_REAP_TIMEOUT_S = 5.0
"""How long :func:`launch` waits for a killed worker to be gone (SIGKILL ends even a stopped
process at once; only one blocked in the kernel, in uninterruptible I/O, outlives it)."""

_REDUCED_IN_PLACE = (dtypes.float32, dtypes.float64)
"""Gradient precisions all-reduced in the context's own buffer. float16 and bfloat16 gradients are
summed in float32 on the host and rounded once to their precision: summing in half precision
would round at every addition, and numpy has no bfloat16 for a view to share."""


# -- torch.distributed --------------------------------------------------------------------------


def _require_torch() -> Any:
    """``torch.distributed``, imported on first need; an :class:`OcannlError` with the fix when
    torch is not installed or was built without distributed support."""
    try:
        import torch.distributed as torch_dist
    except ImportError as e:
        raise OcannlError(
            f"data-parallel training across processes needs torch.distributed, which cannot be imported here "
            f"({e}): pip install torch (the CPU build is enough for gloo), or install ocannl with the "
            f"'triton' extra") from None
    if not torch_dist.is_available():
        raise OcannlError("this torch was built without torch.distributed: install a build that has it "
                          "(the wheels on pypi.org do)")
    return torch_dist


def _process_group() -> Any | None:
    """``torch.distributed`` when a default process group is set up in this process, else None.
    Never imports torch: a process that did not import it cannot have a group."""
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is None or not torch_dist.is_available() or not torch_dist.is_initialized():
        return None
    return torch_dist


def default_backend() -> str:
    """``gloo`` for host buffers, and NCCL for CUDA buffers when torch sees a GPU (one process
    group serving both: ``cpu:gloo,cuda:nccl``)."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(backend: str | None = None, *, init_method: str | None = None, rank: int | None = None,
                       world_size: int | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Join the default ``torch.distributed`` process group. Without arguments it reads what
    ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); ``backend``
    defaults to :func:`default_backend`. On a machine with GPUs the process also selects the GPU
    ``LOCAL_RANK`` (so that each process's Triton context uses its own device) before joining."""
    torch_dist = _require_torch()
    if torch_dist.is_initialized():
        raise OcannlError("init_process_group: this process already belongs to a process group "
                          "(torch.distributed.destroy_process_group() leaves it)")
    if rank is None and "RANK" not in os.environ:
        raise OcannlError("init_process_group: no rank given and RANK is not set: launch the script with "
                          "torchrun, or pass rank=, world_size= and init_method=")
    import torch

    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", rank if rank is not None else 0))
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    given = {k: v for k, v in (("init_method", init_method), ("rank", rank), ("world_size", world_size))
             if v is not None}  # the others come from the environment
    torch_dist.init_process_group(backend or default_backend(), timeout=timedelta(seconds=timeout), **given)


def launch(fn: Callable[..., Any], nproc: int, *args: Any, backend: str | None = None,
           timeout: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Run ``fn(*args)`` in ``nproc`` fresh worker processes joined in one process group (a
    rendezvous file in a private temporary folder: no port to pick), and return their results in
    rank order. ``fn`` must be importable by the workers (a module-level function). A worker that
    fails makes this kill the others and raise an :class:`OcannlError` holding the traceback of
    the first worker that reported one (the others typically fail because of it). When
    ``timeout`` seconds pass first, every worker is killed and the error names those that had not
    finished: a worker waiting on a collective, or stopped (SIGSTOP, a debugger), is never waited
    on past the timeout."""
    if not isinstance(nproc, int) or nproc < 1:
        raise OcannlError(f"launch: nproc must be a positive int, got {nproc!r}")
    _require_torch()
    import torch.multiprocessing as torch_mp

    with tempfile.TemporaryDirectory(prefix="ocannl-launch-") as folder:
        deadline = time.monotonic() + timeout
        workers = torch_mp.start_processes(
            _worker, args=(fn, nproc, folder, backend, timeout, args), nprocs=nproc, join=False,
            start_method="spawn").processes
        try:
            _await_workers(workers, deadline, fn, timeout, folder)
        finally:
            _kill(workers)
        results = [_report_file(folder, rank, "result") for rank in range(nproc)]
        return [pickle.loads(path.read_bytes()) if path.exists() else None for path in results]


def _await_workers(workers: list[Any], deadline: float, fn: Callable[..., Any], timeout: float,
                   folder: str) -> None:
    """Return once every worker has exited cleanly; raise an :class:`OcannlError` as soon as one
    exits otherwise, or when ``deadline`` (a ``time.monotonic()`` value) passes."""
    running = {worker.sentinel: rank for rank, worker in enumerate(workers)}
    while running:
        left = deadline - time.monotonic()
        if left <= 0:
            late = ", ".join(f"worker {rank} (pid {workers[rank].pid})" for rank in sorted(running.values()))
            raise OcannlError(f"launch: {late} of {_name(fn)} did not finish within {timeout:g} s (stopped, or "
                              f"waiting on a collective that another worker never reached?): all "
                              f"{len(workers)} workers were killed; pass a longer timeout= if the work needs it")
        for sentinel in multiprocessing.connection.wait(list(running), timeout=left):
            rank = running.pop(sentinel)
            workers[rank].join()  # it has exited: this only reaps it
            if workers[rank].exitcode != 0:
                raise OcannlError(f"a data-parallel worker of {_name(fn)} failed; "
                                  f"{_first_failure(folder, rank, workers[rank].exitcode)}")


def _first_failure(folder: str, rank: int, exitcode: int) -> str:
    """The traceback reported first by any worker, else how worker ``rank`` ended."""
    reported = sorted(Path(folder).glob(_report_file(folder, "*", "error").name),
                      key=lambda path: path.stat().st_mtime_ns)
    if reported:
        first = reported[0]
        return f"worker {first.name.split('.')[1]} raised:\n{first.read_text(errors='replace')}"
    if exitcode < 0:
        return f"worker {rank} was killed by signal {-exitcode} ({signal.strsignal(-exitcode)})"
    return f"worker {rank} exited with code {exitcode} without raising an exception"


def _kill(workers: list[Any]) -> None:
    """Kill the workers still running, and reap them. SIGKILL, unlike SIGTERM, also ends a
    stopped process at once, so this never waits on one."""
    for worker in workers:
        if worker.is_alive():
            worker.kill()
    for worker in workers:
        worker.join(_REAP_TIMEOUT_S)


def _worker(rank: int, fn: Callable[..., Any], nproc: int, folder: str, backend: str | None,
            timeout: float, args: tuple) -> None:
    """One process of :func:`launch`: join the group, run ``fn``, leave its pickled result (or
    the traceback of what failed) in ``folder`` for the parent, leave the group. Reports are files
    rather than messages on a pipe, so a worker stopped or killed in the middle of one can never
    block the parent."""
    os.environ.setdefault("LOCAL_RANK", str(rank))
    try:
        init_process_group(backend, init_method="file://" + os.path.join(folder, "rendezvous"), rank=rank,
                           world_size=nproc, timeout=timeout)
        _report_file(folder, rank, "result").write_bytes(pickle.dumps(fn(*args)))
        _require_torch().barrier()  # no process leaves while another may still need it in a collective
    except Exception:
        # Reported before leaving the group: leaving makes the others fail, and the first
        # report is the one launch shows.
        _report_file(folder, rank, "error").write_text(traceback.format_exc())
        sys.exit(1)  # (re-raising would make torch write a copy of the traceback to a file it never removes)
    finally:
        group = _process_group()
        if group is not None:
            group.destroy_process_group()


def _report_file(folder: str, rank: int | str, kind: str) -> Path:
    """Where worker ``rank`` of :func:`launch` leaves its ``result`` or its ``error``."""
    return Path(folder) / f"worker.{rank}.{kind}"


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def rank() -> int:
    """This process's rank in the process group (0 without one)."""
    group = _process_group()
    return group.get_rank() if group is not None else 0


def world_size() -> int:
    """The number of processes in the process group (1 without one)."""
    group = _process_group()
    return group.get_world_size() if group is not None else 1


# -- data ---------------------------------------------------------------------------------------


def shard(array: Any, index: int, count: int, axis: int = 1) -> np.ndarray:
    """Slice ``index`` of ``count`` equal slices of ``array`` along ``axis``: a replica's part of
    every global batch when ``array`` is laid out as ``(batches, batch size, ...)`` (the default
    axis). The batch size must divide evenly, so that the average of the replicas' gradients is the
    gradient of the whole batch."""
    array = np.asarray(array)
    if not 0 <= index < count:
        raise OcannlError(f"shard: index {index} is outside [0, {count})")
    size = array.shape[axis]
    if size % count:
        raise ShapeError(f"shard: axis {axis} of an array of shape {array.shape} ({size} rows) does not split into "
                         f"{count} equal slices: choose a global batch size that {count} replicas divide")
    step = size // count
    return np.take(array, np.arange(index * step, (index + 1) * step), axis=axis)


# -- the training step --------------------------------------------------------------------------


class DataParallel:
    """Training ``update`` (``train.grad_update(loss)``) with ``optimizer`` (``train.sgd_update``,
    ``train.adam_update``, ...) on every context of ``contexts`` (default: the process default
    context) and of every process of the process group, if there is one.

    Constructing compiles the routines (the gradient routine on every context; merging, averaging
    and the optimizer step on the owner) and makes every replica start from the parameters and
    optimizer state of the first context of process 0. The contexts hold the same tensor graph;
    then give each its slice of the data, ``ctx.set(xs, shard(all_xs, dp.replica_index(ctx),
    dp.replicas))``: the next step reads it. Every process must construct its ``DataParallel``,
    and call :meth:`step`, :meth:`mean` and :meth:`check_replicas`, in the same order: each is a
    collective over the processes.
    """

    def __init__(self, update: Any, optimizer: Any, contexts: Context | Sequence[Context] | None = None):
        if contexts is None:
            contexts = [default_context()]
        elif isinstance(contexts, Context):
            contexts = [contexts]
        self.contexts: list[Context] = list(contexts)
        if not self.contexts:
            raise OcannlError("DataParallel needs at least one context")
        if len(set(map(id, self.contexts))) != len(self.contexts):
            raise OcannlError("DataParallel: a context is listed twice; each replica needs a context of its own")
        differentiated = {id(p) for p in update.params}
        missing = [p.label for p in optimizer.params if id(p) not in differentiated]
        if missing:
            raise OcannlError(f"DataParallel: the optimizer updates {', '.join(missing)}, which the gradient update "
                              f"does not differentiate")
        self.params = list(optimizer.params)
        self.grads: list[TNode] = [p.grad for p in self.params]
        self._state: list[TNode] = list(dict.fromkeys(node for _, _, node in optimizer.states))
        self._group = _process_group()
        self.rank = self._group.get_rank() if self._group is not None else 0
        self.world_size = self._group.get_world_size() if self._group is not None else 1
        counts = self._gather_ints([len(self.contexts)])[:, 0]
        self.replicas = int(counts.sum())
        """Replicas in all processes: the count each summed gradient is divided by."""
        self._first_replica = int(counts[:self.rank].sum())

        name = sanitize_identifier(update.loss.label) or "loss"
        self._grad_routines = [ctx.compile(update) for ctx in self.contexts]
        self._merge_nodes: list[TNode] = []
        self._merge_routine = None
        if len(self.contexts) > 1:
            self._merge_nodes = [TNode(f"{g.grad_of.label}_grad_merge", dims=g.dims, dtype=g.dtype)
                                 for g in self.grads]
            self._merge_routine = self.owner.compile(Computation(f"{name}_merge_grads", Block(tuple(
                _accumulate(g, Binop.ADD, merge) for g, merge in zip(self.grads, self._merge_nodes)),
                comment="add a replica's gradients")))
        average = ()
        if self.replicas > 1:
            average = (Computation(f"{name}_average_grads", Block(tuple(
                _accumulate(g, Binop.DIV, float(self.replicas)) for g in self.grads),
                comment=f"divide the summed gradients by the {self.replicas} replicas")),)
        self._update_routine = self.owner.compile(*average, optimizer)
        self.broadcast_state()

    @property
    def owner(self) -> Context:
        """The context of this process that sums the gradients and runs the optimizer."""
        return self.contexts[0]

    def replica_index(self, ctx: Context) -> int:
        """The position of ``ctx`` among all replicas of all processes (its data slice)."""
        return self._first_replica + self.contexts.index(ctx)

    def step(self, /, **bindings: int) -> None:
        """One training step, every replica with the same index bindings (``batch_n=3``); each
        routine takes the bindings of the symbols it reads (``step_n`` of a learning-rate schedule
        goes to the optimizer step only)."""
        read = {s.name for r in (*self._grad_routines, self._update_routine) for s in r.ir.static_symbols}
        unknown = sorted(set(bindings) - read)
        if unknown:
            raise IndexBindingError(f"DataParallel.step: no routine of this training step reads index symbol(s) "
                                    f"{', '.join(unknown)} (they read: {', '.join(sorted(read)) or 'none'})")
        for routine in self._grad_routines:
            routine.run(**_bindings_for(routine, bindings))
        for ctx in self.contexts[1:]:
            for g, merge in zip(self.grads, self._merge_nodes):
                _copy(ctx, g, self.owner, merge)
            self._merge_routine.run()
        if self._group is not None and self.world_size > 1:
            self._all_reduce(self.grads)
        self._update_routine.run(**_bindings_for(self._update_routine, bindings))
        for ctx in self.contexts[1:]:
            for p in self.params:
                _copy(self.owner, p.value, ctx, p.value)

    def broadcast_state(self) -> None:
        """Give every replica the parameters (and every process's owner the optimizer state) of the
        first context of process 0: replicas initialized alike, or one loaded from a checkpoint,
        all continue from the same values."""
        nodes = [p.value for p in self.params] + self._state
        if self._group is not None and self.world_size > 1:
            self._collective(nodes, lambda tensor: self._group.broadcast(tensor, src=0, async_op=True))
        for ctx in self.contexts[1:]:
            for p in self.params:
                _copy(self.owner, p.value, ctx, p.value)

    def mean(self, t: Any) -> float:
        """The mean over every replica of the scalar ``t`` (a loss, say: each replica's is the
        mean over its slice, so this is the mean over the global batch)."""
        node = t.value if hasattr(t, "value") else t
        local = sum(float(np.asarray(ctx.get(node), dtype=np.float64).sum()) for ctx in self.contexts)
        return float(self._sum_floats([local])[0]) / self.replicas

    def check_replicas(self) -> None:
        """Raise an :class:`OcannlError` naming the first parameter whose bits differ between two
        replicas (of this process or of any other): they must stay identical, step after step."""
        digests = [_digest(self.owner, p.value) for p in self.params]
        for ctx in self.contexts[1:]:
            for p, digest in zip(self.params, digests):
                if _digest(ctx, p.value) != digest:
                    raise OcannlError(f"data-parallel replicas diverged: parameter {p.label!r} differs between "
                                      f"context 0 and context {self.contexts.index(ctx)} of process {self.rank}")
        gathered = self._gather_ints(digests)
        for other in range(self.world_size):
            for p, mine, theirs in zip(self.params, digests, gathered[other]):
                if mine != theirs:
                    raise OcannlError(f"data-parallel replicas diverged: parameter {p.label!r} differs between "
                                      f"process {self.rank} and process {other}")

    # -- collectives ----------------------------------------------------------------------------

    def _all_reduce(self, nodes: list[TNode]) -> None:
        """Sum ``nodes`` over the owners of all processes, in place."""
        op = self._group.ReduceOp.SUM
        self._collective(nodes, lambda tensor: self._group.all_reduce(tensor, op=op, async_op=True))

    def _collective(self, nodes: list[TNode], start: Callable[[Any], Any]) -> None:
        """Run the collective ``start`` on the owner's buffer of every node, all in flight at
        once: on a zero-copy torch view of the buffer when its precision allows, else on a float32
        host copy written back (rounded once) when every collective is done."""
        import torch

        staged, pending = [], []
        for node in nodes:
            view = _torch_view(torch, self.owner, node)
            if view is None:
                view = torch.from_numpy(np.ascontiguousarray(self.owner.get(node), dtype=np.float32))
                staged.append((node, view))
            pending.append(start(view))
        for work in pending:
            work.wait()
        for node, view in staged:
            self.owner.set(node, view.numpy())

    def _gather_ints(self, values: list[int]) -> np.ndarray:
        """``values`` of every process, as an array of shape ``(world_size, len(values))``."""
        mine = np.asarray(values, dtype=np.int64).reshape(1, -1)
        if self._group is None or self.world_size == 1:
            return mine
        import torch

        local = torch.from_numpy(mine.copy())
        gathered = [torch.empty_like(local) for _ in range(self.world_size)]
        self._group.all_gather(gathered, local)
        return torch.cat(gathered).numpy()

    def _sum_floats(self, values: list[float]) -> np.ndarray:
        mine = np.asarray(values, dtype=np.float64)
        if self._group is None or self.world_size == 1:
            return mine
        import torch

        total = torch.from_numpy(mine.copy())
        self._group.all_reduce(total, op=self._group.ReduceOp.SUM)
        return total.numpy()


def _bindings_for(routine: Any, bindings: dict[str, int]) -> dict[str, int]:
    names = {s.name for s in routine.ir.static_symbols}
    return {name: value for name, value in bindings.items() if name in names}


def _accumulate(target: TNode, accum: Binop, operand: TNode | float) -> Accum:
    """``target <accum>= operand`` cell by cell (``operand`` a node of target's dims, or a number)."""
    dims = target.dims
    operand_dims = dims if isinstance(operand, TNode) else ()
    return Accum(target, accum, Unop.ID, (operand,), lambda: identity_projections(dims, [operand_dims]), spec=".")


def _torch_view(torch: Any, ctx: Context, node: TNode) -> Any | None:
    """A torch tensor sharing ``node``'s buffer on ``ctx`` (DLPack of the numpy array; the tensor
    itself on Triton), or None when the gradient is not reduced in place (see
    :data:`_REDUCED_IN_PLACE`) or the buffer cannot be shared."""
    if node.dtype not in _REDUCED_IN_PLACE:
        return None
    buffer = ctx.buffer(node)
    if isinstance(buffer, torch.Tensor):
        return buffer
    if isinstance(buffer, np.ndarray) and buffer.flags.writeable and buffer.flags.c_contiguous:
        return torch.from_dlpack(buffer)
    return None


def _copy(src: Context, src_node: TNode, dst: Context, dst_node: TNode) -> None:
    """``dst_node`` on ``dst`` := ``src_node`` on ``src``: into the existing buffer when both are
    numpy arrays or both torch tensors of one layout (no allocation per step), else through
    ``get``/``set``, which any backend supports."""
    source = src.buffer(src_node)
    if dst.has_value(dst_node):
        target = dst.buffer(dst_node)
        if isinstance(source, np.ndarray) and isinstance(target, np.ndarray):
            if source.shape == target.shape and source.dtype == target.dtype and target.flags.writeable:
                np.copyto(target, source)
                return
        elif type(source) is type(target) and hasattr(target, "copy_") and source.shape == target.shape \
                and source.dtype == target.dtype:
            target.copy_(source)
            return
    dst.set(dst_node, src.get(src_node))


def _digest(ctx: Context, node: TNode) -> int:
    """The first 63 bits of the sha256 of ``node``'s bytes on ``ctx`` (one int64 per parameter for
    :meth:`DataParallel.check_replicas` to gather)."""
    data = np.ascontiguousarray(ctx.get(node))
    return int.from_bytes(hashlib.sha256(data.tobytes()).digest()[:8], "little") >> 1
