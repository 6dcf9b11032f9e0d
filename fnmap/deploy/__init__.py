"""Deployment of handlers to real clouds, used by ``fnmap deploy`` and the scripts in ``infra/``.

One module per target's command line (``aws``, ``batch_cli``, ...), each with
``register(subparsers)`` adding its ``deploy``/``update``/``destroy`` actions.  Never imported by the
library itself, only by the command line and ``infra/`` scripts.
"""

#: Each target of ``fnmap deploy`` and the module under fnmap.deploy that adds it.
TARGETS: dict[str, str] = {"aws": "aws", "batch": "batch_cli"}
