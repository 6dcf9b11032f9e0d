"""backend="local" honours timeout= as the other backends do (a thread cannot be stopped, so the
call fails at its deadline and the thread's late result is ignored)."""

from __future__ import annotations

import pytest
from naps import nap_then_mark

import fnmap


def test_a_call_past_its_timeout_fails_at_the_deadline(tmp_path):
    slow_end = tmp_path / "slow-call-ended"
    items = [(0.1, str(tmp_path / "a")), (6.0, str(slow_end)), (0.1, str(tmp_path / "b"))]
    with pytest.raises(TimeoutError, match=r"call 1 \(item 1\).*past its timeout of 1 s") as info:
        fnmap.map(nap_then_mark, items, timeout=1, backend="local", workers=3)
    assert isinstance(info.value, fnmap.TimeoutError)
    assert not slow_end.exists()  # raised at the deadline, not when the slow call ended
    out = fnmap.map(nap_then_mark, items, timeout=1, backend="local", workers=3, return_exceptions=True)
    assert out[0] == out[2] == 0.1 and isinstance(out[1], fnmap.TimeoutError)


def test_calls_within_their_timeout_are_untouched():
    assert fnmap.map(abs, [-1, -2], timeout=5, backend="local") == [1, 2]
