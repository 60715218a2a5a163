"""The cyclic garbage collector is paused while the framework builds (ocannl/collector.py), and
only then."""

import gc
import threading

import numpy as np
import pytest

import ocannl as oc
from ocannl import collector, train


def test_pauses_nest_and_restore_the_collector():
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_what_a_build_made_waits_in_the_oldest_generation_not_the_youngest():
    with collector.paused():
        made = [[k] for k in range(10_000)]
        assert gc.get_count()[0] >= 10_000
    assert gc.get_count()[0] < 1_000 and gc.get_freeze_count() == 0
    assert gc.is_tracked(made[0])


def test_objects_the_user_froze_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector.paused():
            [[k] for k in range(100)]
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ends_when_the_build_fails():
    with pytest.raises(ValueError, match="a failed build"):
        with collector.paused():
            raise ValueError("a failed build")
    assert gc.isenabled()


def test_the_collector_runs_again_once_the_last_thread_ends_its_pause():
    inside, release = threading.Event(), threading.Event()

    def build():
        with collector.paused():
            inside.set()
            release.wait()

    worker = threading.Thread(target=build)
    worker.start()
    inside.wait()
    with collector.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread still builds
    release.set()
    worker.join()
    assert gc.isenabled()


def test_compiling_and_differentiating_pause_the_collector_and_leave_it_running():
    seen = []
    oc.session.reset()
    x = oc.tensor(np.ones((2, 3), np.float32), batch=1, label="x")
    w = oc.param("w", output=4)
    loss = (w @ x).sum()
    real_disable = gc.disable

    def disable():
        seen.append("paused")
        real_disable()

    gc.disable = disable
    try:
        update = train.grad_update(loss)
        assert seen == ["paused"]
        oc.Context("interp").compile(update)
        assert seen == ["paused", "paused"]
    finally:
        gc.disable = real_disable
    assert gc.isenabled()
