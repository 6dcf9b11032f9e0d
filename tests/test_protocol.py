"""One fnmap protocol number: a client and a worker that speak different ones refuse each other,
saying which side is older and how to fix it (no compatibility paths before 1.0)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fnmap.runtime.serialization import FNMAP_PROTOCOL, runtime_info, runtime_mismatch

NEWER_CLIENT = """
import sys
import fnmap
import fnmap.runtime.serialization as serialization

serialization.FNMAP_PROTOCOL = int(sys.argv[1])  # this client as a release that speaks another protocol
try:
    fnmap.map(abs, [-1, -2], retries=0)
except fnmap.VersionMismatch as e:
    print("REFUSED", str(e).splitlines()[0])
"""


@pytest.mark.parametrize("client, older", [(FNMAP_PROTOCOL + 1, "worker"), (FNMAP_PROTOCOL - 1, "client")])
def test_a_client_of_another_protocol_is_refused_with_the_side_to_upgrade(client, older):
    """A real client process against a real emulator worker of this release."""
    done = subprocess.run([sys.executable, "-c", NEWER_CLIENT, str(client)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("REFUSED "), (line, done.stderr)
    assert f"the client speaks fnmap protocol {client} but the worker speaks {FNMAP_PROTOCOL}" in line
    assert f"the {older}'s fnmap is older" in line
    assert ("pip install -U fnmap" in line) == (older == "client")
    assert ("redeploy the handler" in line) == (older == "worker")


def test_the_protocol_is_compared_first_and_a_missing_one_is_older():
    assert runtime_mismatch(runtime_info()) is None
    assert runtime_info()["protocol"] == FNMAP_PROTOCOL
    deployed_before = {k: v for k, v in runtime_info().items() if k != "protocol"}
    message = runtime_mismatch(runtime_info(), json.loads(json.dumps(deployed_before)))
    assert message.startswith(f"the client speaks fnmap protocol {FNMAP_PROTOCOL} but the worker speaks None")
    assert "the worker's fnmap is older" in message
