"""What cannot travel to the Dask workers is named: the object and the chain that holds it.

The flows themselves run as scripts in tests/flows/test_user_scripts.py; this file checks the
search on objects built here (functions of a module cloudpickle sends by value, as it sends
a script's ``__main__``).
"""

from __future__ import annotations

import functools
import sys
import threading
import types

import cloudpickle
import pytest
from prefect import flow, task

from prefect_dask_profiling.errors import CannotShip, Unpicklable
from prefect_dask_profiling.prefect.flow_run import check_task_pickles, find_unpicklable
from prefect_dask_profiling.prefect.runner import profiled


@pytest.fixture
def by_value():
    """A module whose functions cloudpickle sends by value, like a script's ``__main__``."""
    module = types.ModuleType("user_script_by_value")
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    yield module
    cloudpickle.unregister_pickle_by_value(module)
    del sys.modules[module.__name__]


def define(module: types.ModuleType, source: str) -> types.ModuleType:
    exec(compile(source, f"<{module.__name__}>", "exec"), module.__dict__)
    return module


def test_a_lock_in_a_flow_factorys_closure_is_named(by_value):
    define(by_value, """
import threading
from prefect import flow
from prefect_dask_profiling import profiled

def make():
    lock = threading.Lock()
    @flow(name="factory")
    @profiled
    def nightly():
        with lock:
            return 1
    return nightly
""")
    held = find_unpicklable(by_value.make(), "flow 'factory'")
    assert held.path == ("flow 'factory' → function make.<locals>.nightly → "
                         "closure variable 'lock'"), held.path
    assert "_thread.lock" in held.error
    message = held.message("This flow")
    assert "closure variable 'lock'" in message and "inside the task" in message


def test_a_lock_two_globals_deep_in_a_task_is_named(by_value):
    define(by_value, """
import threading
from prefect import task

LOCK = threading.Lock()

def helper(x):
    with LOCK:
        return x

@task
def square(x):
    return helper(x) ** 2
""")
    with pytest.raises(Unpicklable, match=r"task 'square' → function square → global "
                                          r"'helper' → global 'LOCK' cannot be pickled"):
        check_task_pickles(by_value.square)
    assert issubclass(Unpicklable, CannotShip) and issubclass(Unpicklable, TypeError)


def test_what_pickles_raises_nothing(by_value):
    define(by_value, """
from prefect import task
OFFSET = 3

@task
def add(x):
    return x + OFFSET
""")
    check_task_pickles(by_value.add)


def test_items_attributes_and_wrapped_functions_are_searched():
    class Holder:
        def __init__(self) -> None:
            self.config = {"conn": [1, threading.Lock()]}

    assert find_unpicklable(Holder(), "obj").path == (
        "obj → attribute 'config' → item 'conn' → item 1")

    lock = threading.Lock()

    def inner():
        return lock

    @functools.wraps(inner)
    def outer():
        return 1

    assert find_unpicklable(outer, "fn").path == (
        "fn → the function it wraps → closure variable 'lock'")


def test_a_self_referencing_structure_ends():
    loop: list = [threading.Lock()]
    loop.append(loop)
    assert find_unpicklable(loop, "x").path == "x → item 0"


def test_profiled_above_flow_is_refused():
    with pytest.raises(ValueError, match="@profiled is above @flow on 'reversed'"):
        profiled(flow(name="reversed")(lambda: 1))


def test_profiled_below_flow_is_a_flow():
    @flow(name="ordered")
    @profiled
    def ordered() -> int:
        return 1

    @task
    def unused() -> int:
        return 1

    assert ordered.name == "ordered" and ordered.fn.__wrapped__.__name__ == "ordered"
    assert unused.name == "unused"
