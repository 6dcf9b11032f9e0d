"""Progress bars for long jobs (tqdm: the widget in Jupyter, text in a terminal)."""

from __future__ import annotations

import sys

#: Jobs with fewer items than this show no bar unless ``progress=True``.
MIN_ITEMS_FOR_AUTO = 100


def _interactive() -> bool:
    if "ipykernel" in sys.modules:
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Counts items done and failed; ``update`` is called from dispatch threads."""

    def __init__(self, total: int, description: str):
        if "ipykernel" in sys.modules:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm
        self.failed = 0
        self._bar = tqdm(total=total, desc=description, unit="item", leave=True, dynamic_ncols=True)

    def update(self, n: int, failed: int = 0) -> None:
        if failed:
            self.failed += failed
            self._bar.set_postfix(failed=self.failed, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()


def make_progress(setting: bool | None, total: int, description: str) -> Progress | None:
    """A bar when asked (``True``), or by default for long jobs in a terminal or notebook."""
    if setting is False or total == 0:
        return None
    if setting is None and (total < MIN_ITEMS_FOR_AUTO or not _interactive()):
        return None
    return Progress(total, description)
