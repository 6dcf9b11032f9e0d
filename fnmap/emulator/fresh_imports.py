"""What a worker forked from a long-lived fork server does to import as a fresh interpreter would.

The fork server of the emulator shared by a user's processes (:mod:`.shared`) was started once, with
only fnmap and the standard library imported, and its children start from its state.  Python reads
the ``.pth`` files of the site-packages folders at start-up only, so a package installed since in
editable mode (a ``.pth`` naming its folder or installing its finder) would stay unknown to them:
:func:`read_new_pth_files` reads those that appeared or changed since this module was imported
(in the fork server, before any worker was forked).
"""

from __future__ import annotations

import os
import site


def _site_folders() -> list[str]:
    folders = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [f for f in folders if os.path.isdir(f)]


def _pth_files() -> dict[tuple[str, str], int]:
    """Each ``.pth`` file of the site folders: its modification time (ns)."""
    found = {}
    for folder in _site_folders():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(".pth"):
                try:
                    found[(folder, name)] = os.stat(os.path.join(folder, name)).st_mtime_ns
                except OSError:
                    pass
    return found


#: The ``.pth`` files the interpreter read at start-up, as they were when the fork server imported this.
_SEEN = _pth_files()


def read_new_pth_files() -> list[str]:
    """Read the ``.pth`` files added or changed since start-up, as ``site`` reads them; their names."""
    read = []
    for (folder, name), mtime in sorted(_pth_files().items()):
        if _SEEN.get((folder, name)) != mtime:
            site.addpackage(folder, name, None)
            read.append(os.path.join(folder, name))
    return read
