"""The state a session's contexts share (ocannl/backends/session_state.py), and its reset."""

from __future__ import annotations

import numpy as np

import ocannl as oc
from ocannl import session
from ocannl.backends.context import Context, default_context
from ocannl.backends.session_state import session_state


def test_a_routine_run_records_its_context_as_the_writer_once():
    ctx = Context("interp")
    t = oc.tensor(np.ones((2,), np.float32), label="t")
    y = (t * 2.0).materialize()
    routine = ctx.compile(y)
    routine.run()
    assert session_state.last_writer(y.value) is ctx and ctx in session_state.contexts_holding(y.value)
    epoch = session_state.epoch
    routine.run()  # nothing changed: the record and the epoch stay
    assert session_state.epoch == epoch
    other = Context("interp")
    other.compile(y).run()
    assert session_state.last_writer(y.value) is other and session_state.epoch > epoch


def test_a_session_reset_forgets_the_default_context_and_the_writers():
    ctx = default_context()
    y = (oc.tensor(np.ones((2,), np.float32), label="t") + 1.0).materialize()
    routine = ctx.compile(y)
    routine.run()
    epoch = session_state.epoch
    session.reset()
    assert session_state.default is None and session_state.last_writer(y.value) is None
    assert session_state.epoch > epoch  # routines compiled before run their checks again
    routine.run()
    assert session_state.last_writer(y.value) is ctx and default_context() is not ctx
