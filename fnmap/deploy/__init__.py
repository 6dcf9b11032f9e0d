"""Deployment of handlers to real clouds, used by ``fnmap deploy`` and the scripts in ``infra/``.

One module per target (``aws``, ``batch``, ...), each with ``register(subparsers)``
adding its ``deploy``/``update``/``destroy`` actions.  Never imported by the
library itself, only by the command line and ``infra/`` scripts.
"""

#: Modules under fnmap.deploy that add a target to ``fnmap deploy``.
TARGETS: list[str] = ["aws", "batch"]
