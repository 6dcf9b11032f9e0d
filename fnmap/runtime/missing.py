"""The note a ``ModuleNotFoundError`` in user code gets on the worker: the package and the fix.

The exception keeps its type and ``name`` (code catching ``ModuleNotFoundError`` still works);
the note (``add_note``, shown under the message in tracebacks) names the package and the command
that installs it where the calls run: a layer for Lambda (``fnmap deploy aws env``), an image
for Batch, ``pip install`` for a host or the emulator.
"""

from __future__ import annotations

import os
import sys

#: Import names whose distribution on PyPI is named otherwise.
DISTRIBUTIONS = {"sklearn": "scikit-learn", "skimage": "scikit-image", "cv2": "opencv-python-headless",
                 "PIL": "Pillow", "yaml": "PyYAML", "bs4": "beautifulsoup4", "dateutil": "python-dateutil",
                 "Crypto": "pycryptodome", "jwt": "PyJWT", "magic": "python-magic"}
_PREFIX = "fnmap: "


def add_missing_module_note(exc: BaseException) -> None:
    """Note on ``exc`` (a ModuleNotFoundError) which package is missing here and how to install it."""
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name:
        return
    if any(str(n).startswith(_PREFIX) for n in getattr(exc, "__notes__", ())):
        return
    top = name.split(".")[0]
    exc.add_note(_PREFIX + missing_module_hint(top, DISTRIBUTIONS.get(top, top)))


def missing_module_hint(module: str, package: str) -> str:
    where = _platform()
    what = package if package == module else f"{package} (module {module!r})"
    lambda_fix = (f"`fnmap deploy aws env --requirements requirements.txt` (a file naming {package}), or "
                  "`fnmap deploy aws env --from-imports YOUR_SCRIPT.py`")
    if where.startswith("Lambda"):
        name = os.environ["AWS_LAMBDA_FUNCTION_NAME"]
        return (f"{what} is not installed where the calls run ({where}): build it into "
                f"the function's layer with {lambda_fix.replace('env ', f'env --name {name} ')}")
    if where.startswith("Batch"):
        return (f"{what} is not installed where the calls run ({where}): use an image "
                f"with it (`pip install {package}` in the image's Dockerfile, then the job definition's image)")
    return (f"{what} is not installed where the calls run ({where}): `pip install "
            f"{package}` there; on Lambda, {lambda_fix}; on Batch, an image with it")


def _platform() -> str:
    if os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return f"Lambda function {os.environ['AWS_LAMBDA_FUNCTION_NAME']!r}"
    if os.environ.get("AWS_BATCH_JOB_ID"):
        return f"Batch job {os.environ['AWS_BATCH_JOB_ID']}"
    return f"the Python at {sys.executable}"
