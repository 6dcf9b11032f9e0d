"""A function that imports numpy, run on the aws backend (Lambda, or the emulator's offline AWS path).

Lambda has no numpy: build the packages this script imports into the function's layer first,

    fnmap deploy aws env --from-imports examples/lambda_numpy.py            # manylinux wheels
    fnmap deploy aws env --from-imports examples/lambda_numpy.py --current  # offline: this environment's copy

then ``python examples/lambda_numpy.py``.  Without the layer the map fails with
``ModuleNotFoundError: No module named 'numpy'`` and a note naming that command.
"""

import numpy as np

import fnmap


def norm(n: int) -> float:
    """The Euclidean norm of 0, 1, ..., n-1, computed on the worker with numpy."""
    return float(np.linalg.norm(np.arange(n)))


if __name__ == "__main__":
    print(fnmap.map(norm, [3, 4, 5]))
