"""``fnmap deploy TARGET ACTION``: put the handlers in a real cloud account."""

from __future__ import annotations

import importlib

from ..deploy import TARGETS


def register(sub) -> None:
    p = sub.add_parser(
        "deploy",
        help="deploy the fnmap handlers to a cloud account (see infra/)",
        description="Create, update or destroy what fnmap needs in a cloud account.",
    )
    targets = p.add_subparsers(dest="target", metavar="TARGET")
    targets.required = True
    for module in TARGETS.values():
        importlib.import_module(f"fnmap.deploy.{module}").register(targets)
