"""Cost of authenticated storage and signatures (issue 26): per MB hashed or sealed, per call signed.

    python benchmarks/auth_cost.py
"""

from __future__ import annotations

import hashlib
import time

from fnmap.runtime import keys, signing
from fnmap.runtime.serialization import dumps
from fnmap.runtime.wire import CallRequest, encode


def per_mb(fn, data: bytes, rounds: int = 5) -> float:
    """Milliseconds per MB of ``fn(data)``, best of ``rounds``."""
    best = min(_timed(fn, data) for _ in range(rounds))
    return best * 1000 / (len(data) / 1e6)


def _timed(fn, data) -> float:
    start = time.perf_counter()
    fn(data)
    return time.perf_counter() - start


def main() -> None:
    secret, data = signing.new_secret().encode(), bytes(64 << 20)
    key = keys.result_key("0" * 32, 0)
    sealed = signing.seal(secret, key, data)
    print(f"SHA-256 of an input object:      {per_mb(lambda d: hashlib.sha256(d).digest(), data):.3f} ms/MB")
    print(f"seal a result (HMAC, one copy):  {per_mb(lambda d: signing.seal(secret, key, d), data):.3f} ms/MB")
    print(f"unseal a result (HMAC, no copy): {per_mb(lambda d: signing.unseal(secret, key, d), sealed):.3f} ms/MB")
    req = CallRequest(job_id="0" * 32, call_id=0, func_key="functions/x.pkl", store_url="file:///tmp/x")
    body = encode(req, dumps(("one", [1])))
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        signing.sign_request(secret, signing.ROUTE_CALL, req.job_id, 0, 1, body)
    sign_us = (time.perf_counter() - start) / n * 1e6
    signature = signing.sign(secret, body)
    start = time.perf_counter()
    for _ in range(n):
        signing.verify(secret, body, signature)
    print(f"sign one call: {sign_us:.1f} us; verify one call (header parsed): "
          f"{(time.perf_counter() - start) / n * 1e6:.1f} us; body {len(body)} bytes")


if __name__ == "__main__":
    main()
