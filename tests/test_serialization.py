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


# -- large buffers out of band (issue 16: bigarg) ------------------------------------------------


def _big_bytes(fill: int) -> bytes:
    return bytes([fill]) * (1 << 20)


def test_large_buffers_travel_out_of_band_and_come_back_as_their_own_objects():
    """A large bytes argument and a NumPy array are written after the pickle, straight from the
    caller's memory; read back from a stream, the bytes is the very object read (no copy after
    the read) and the array is writable, as an array unpickled the ordinary way is."""
    import io

    import numpy as np

    from fnmap.runtime.serialization import FRAMED_MAGIC, dump_parts, load_stream, loads, out_of_band

    big, array = _big_bytes(7), np.arange(100_000, dtype=np.float64)
    parts = dump_parts(("one", [out_of_band(big), array, out_of_band(b"small")]))
    assert parts[0].startswith(FRAMED_MAGIC) and len(parts) == 4
    assert parts[2].obj is big  # a view of the caller's bytes, not a copy
    joined = b"".join(parts)
    for mode, (b, a, small) in (load_stream(io.BytesIO(joined)), loads(joined)):
        assert mode == "one" and type(b) is bytes and b == big and small == b"small"
        assert a.flags.writeable and (a == array).all()
        a[0] = -1.0


def test_small_values_stay_one_ordinary_pickle():
    from fnmap.runtime.serialization import dump_parts, loads, out_of_band

    parts = dump_parts(("one", [out_of_band(b"x" * 1000), list(range(10))]))
    assert len(parts) == 1 and parts[0][:1] == b"\x80"
    assert loads(parts[0]) == ("one", [b"x" * 1000, list(range(10))])


def test_a_truncated_stored_object_is_an_unpickling_error_not_a_short_value():
    import io
    import pickle

    from fnmap.runtime.serialization import dump_parts, load_stream, out_of_band

    joined = b"".join(dump_parts(("one", [out_of_band(_big_bytes(1))])))
    with pytest.raises(pickle.UnpicklingError, match="ends"):
        load_stream(io.BytesIO(joined[:-10]))


def _length_and_first(blob):
    return len(blob), blob[0], type(blob).__name__


def _scaled_in_place(array):
    array *= 2  # fails on a read-only array
    return float(array.sum())


def _inputs_in_storage(value, root: str) -> list:
    """``(size, framed)`` of every call input in the storage at ``root`` while this call runs."""
    from pathlib import Path

    from fnmap.runtime.serialization import FRAMED_MAGIC

    return [(p.stat().st_size, p.read_bytes()[:4] == FRAMED_MAGIC)
            for p in sorted(Path(root).glob("jobs/*/in/*/*")) if p.is_file()]


@pytest.mark.parametrize("backend", ["emulator", "local"])
def test_large_arguments_go_through_storage_by_reference(backend, tmp_path):
    """Arguments over ``inline_limit`` (256 KiB by default) are stored for their call, framed, and
    named by the signed request; the worker reads them back as the types they were."""
    import numpy as np

    import fnmap

    storage = tmp_path.as_uri()
    blobs = [_big_bytes(i) for i in (3, 4, 5)]
    assert fnmap.map(_length_and_first, blobs, backend=backend, storage=storage) == [
        (1 << 20, i, "bytes") for i in (3, 4, 5)]
    with fnmap.Executor(backend=backend, storage=storage) as ex:
        assert ex.submit(_length_and_first, blobs[0]).result() == (1 << 20, 3, "bytes")
        assert ex.submit(_scaled_in_place, np.ones(100_000)).result() == 200_000.0
        # While a call runs its input is stored, framed (the buffer after the pickle, not copied
        # into it); the calls before it left nothing (their workers deleted theirs).
        [(size, framed)] = ex.submit(_inputs_in_storage, blobs[1], str(tmp_path)).result()
        assert framed and (1 << 20) < size < (1 << 20) + 4096
        [(size, framed)] = ex.submit(_inputs_in_storage, np.ones(100_000), str(tmp_path)).result()
        assert framed and 800_000 < size < 800_000 + 4096


def _exits_with_4(x):
    sys.exit(4)


def test_a_reducer_another_library_registers_for_exceptions_is_not_used(monkeypatch):
    """``distributed`` and ``dask.multiprocessing`` install tblib's pickling support, a copyreg
    reducer for every exception class that rebuilds it without ``__init__``: a remote
    ``sys.exit(4)`` then came back with no exit code.  fnmap pickles exceptions their own way."""
    import copyreg

    import fnmap

    def lossy(exc):  # as tblib's: the class and its args, but no __init__ on the way back
        return (_new_without_init, (type(exc), exc.args))

    monkeypatch.setitem(copyreg.dispatch_table, SystemExit, lossy)
    [out] = fnmap.map(_exits_with_4, [0], backend="local", return_exceptions=True)
    assert isinstance(out, fnmap.RemoteExit) and out.exit_code == 4, repr(out)


def _new_without_init(cls, args):
    exc = cls.__new__(cls)
    exc.args = args
    return exc


def test_an_unpicklable_item_after_large_ones_still_fails_before_anything_runs(tmp_path):
    """The large items before it were being stored on the client's threads; the map names the bad
    item, and no call ran."""
    import threading

    import fnmap

    items = [_big_bytes(i) for i in range(6)] + [threading.Lock()]
    with pytest.raises(fnmap.SerializationError, match="item 6"):
        fnmap.map(_length_and_first, items, backend="local", storage=tmp_path.as_uri())
    from fnmap.runtime import keys

    results = f"/{keys.result_key('x', 0).split('/')[2]}/"  # the folder of a job's committed results
    ran = [p for p in tmp_path.glob("jobs/*/**/*") if p.is_file() and results in str(p)]
    assert not ran, f"a call ran: {ran}"
    assert any(tmp_path.glob("jobs/*")), "the failed job's record is there: the check looked in the right place"
