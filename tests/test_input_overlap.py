"""A map of large items sends each call as soon as its input is stored (issue 25): the first calls
run while the client's input threads still hash and write the last inputs."""

from __future__ import annotations

import os

import fnmap

N = 200


def test_the_first_calls_run_while_the_last_inputs_are_stored(tmp_path):
    jobs = tmp_path / "store" / "jobs"

    def inputs_stored(blob):  # how many call inputs the storage holds when this call runs
        return sum(len(files) for folder, _, files in os.walk(jobs) if f"{os.sep}in{os.sep}" in folder + os.sep)

    items = [os.urandom(16) + bytes(1 << 20) for _ in range(N)]  # 1 MB each, all different
    job = fnmap.map(inputs_stored, items, chunksize=1, storage=(tmp_path / "store").as_uri(), progress=False,
                    return_job=True)
    counts = job.results()
    # No call has committed (and deleted its input) before the first runs: what it counts was stored.
    assert counts[0] < N, f"the first call waited until every input was stored: {counts[:5]}"
    assert all(call.items_key for call in job.run.calls)  # and every input went through storage
