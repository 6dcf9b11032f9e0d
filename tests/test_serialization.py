"""Pickling across real process boundaries: __main__ code, unpicklable exceptions, version checks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from fnmap.errors import RemoteError, RemoteTraceback
from fnmap.runtime.serialization import pack_exception, runtime_info, runtime_mismatch, unpack_exception


def run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items()}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=180, cwd=tmp_path)


def test_main_module_functions_classes_and_local_modules_run_remotely(tmp_path):
    (tmp_path / "helpers_mod.py").write_text("def triple(x):\n    return 3 * x\n")
    result = run_script(tmp_path, """
        import fnmap
        from helpers_mod import triple

        class Box:
            def __init__(self, v):
                self.v = v

        def work(x):
            return Box(triple(x))

        class Oops(Exception):
            pass

        def bad(x):
            raise Oops(f"bad {x}")

        if __name__ == "__main__":
            out = fnmap.map(work, range(4), backend="local")
            print([b.v for b in out], type(out[0]) is Box)
            out = fnmap.map(work, range(4))
            print([b.v for b in out], type(out[0]) is Box)
            try:
                fnmap.map(bad, [7])
            except Oops as e:
                print("caught", e, type(e.__cause__).__name__)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[0, 3, 6, 9] True"
    assert lines[1] == "[0, 3, 6, 9] True"
    assert lines[2] == "caught bad 7 RemoteTraceback"


class TwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(a)
        self.b = b


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = __import__("threading").Lock()  # neither the exception nor its state pickles

    def __reduce__(self):
        raise TypeError("no pickling for you")


def test_exception_with_two_argument_init_round_trips():
    try:
        raise TwoArgs("first", "second")
    except TwoArgs as e:
        data, tb = pack_exception(e)
    exc = unpack_exception(data, tb)
    assert type(exc) is TwoArgs and exc.args == ("first",) and exc.b == "second"
    assert isinstance(exc.__cause__, RemoteTraceback) and "TwoArgs" in str(exc.__cause__)


def test_unpicklable_exception_becomes_a_stand_in():
    try:
        raise Unpicklable("secret sauce")
    except Unpicklable as e:
        data, tb = pack_exception(e)
    exc = unpack_exception(data, tb)
    assert isinstance(exc, RemoteError)
    assert "Unpicklable" in str(exc) and "secret sauce" in str(exc)


def test_runtime_mismatch_in_plain_words():
    assert runtime_mismatch(runtime_info()) is None
    other = dict(runtime_info(), python="2.7")
    message = runtime_mismatch(other)
    assert "Python 2.7" in message and "same Python minor version" in message


@pytest.mark.parametrize("obj_factory, where", [
    (lambda: __import__("threading").Lock(), "lock"),
])
def test_unpicklable_argument_fails_before_anything_runs(obj_factory, where, storage_root):
    import fnmap

    with pytest.raises(fnmap.SerializationError) as info:
        fnmap.map(lambda x: x, [1, obj_factory()], backend="local")
    assert "item 1" in str(info.value) and where in str(info.value)
