"""What seeing fresh code costs: one worker's look at its user modules' files, paid once per job
by each worker that runs a call of it (``fnmap.runtime.worker._look_at_module_files``).

    python benchmarks/module_look.py

Imports a package of N modules from a temporary folder (an editable package as a worker imports
it), with the standard library's usual modules loaded beside it, then times ``ModuleFiles.changed``:
a look when nothing was imported since (a ``stat`` per watched module), and the first look after
the imports (each new module found and stamped); and the install folders, found once a process.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path

from fnmap.runtime import local_modules
from fnmap.runtime.local_modules import ModuleFiles


def _package(folder: Path, modules: int) -> str:
    package = folder / f"benchpkg{modules}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for i in range(modules):
        (package / f"m{i}.py").write_text(f"def f(x):\n    return x + {i}\n")
    return package.name


def best_of(fn, rounds: int = 200) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    for usual in ("email.mime.text", "http.client", "json", "logging", "xml.dom.minidom"):  # a worker's usual load
        importlib.import_module(usual)

    start = time.perf_counter()
    local_modules.install_roots()  # once per process, at the first module looked at
    print(f"the install folders, once a process: {(time.perf_counter() - start) * 1e3:.2f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        for modules in (1, 20, 200):
            watch = ModuleFiles(baseline=True)
            watch.changed()
            name = _package(Path(tmp), modules)
            start = time.perf_counter()
            for i in range(modules):
                importlib.import_module(f"{name}.m{i}")
            imported = time.perf_counter() - start
            start = time.perf_counter()
            watch.changed()
            first = time.perf_counter() - start
            steady = best_of(watch.changed)
            print(f"{modules:4d} user modules ({len(sys.modules)} loaded): first look after the imports "
                  f"{first * 1e3:.3f} ms (the imports took {imported * 1e3:.1f} ms), "
                  f"each later look {steady * 1e6:.1f} us")


if __name__ == "__main__":
    main()
