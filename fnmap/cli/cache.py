"""``fnmap cache ls`` and ``fnmap cache clear``: the result cache's entries in the storage.

``ls`` shows per cached function its entries, bytes, oldest and newest entry; ``clear`` deletes
entries, all of them or those of one function (``--function NAME``, its name or a digest prefix)
or older than an age (``--older-than 7d``).  ``fnmap gc`` leaves the cache alone unless given
``--cache``.  What an entry is: :mod:`fnmap.cache.store`.
"""

from __future__ import annotations

import json

from .jobs import _STORAGE_HELP, _bytes, _storage_errors, _store, _time


def register(sub) -> None:
    p = sub.add_parser("cache", help="list or clear the result cache (cache=True) in storage",
                       description="The result cache of fnmap.map(..., cache=True): entries per function, "
                       "and deleting them.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    ls = verbs.add_parser("ls", help="entries per function: count, bytes, oldest, newest")
    ls.add_argument("--json", action="store_true", help="print the listing as JSON")
    ls.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    ls.set_defaults(run=_storage_errors(run_ls))
    clear = verbs.add_parser("clear", help="delete cache entries (all, one function's, or old ones)")
    clear.add_argument("--function", metavar="NAME", help="only this function's entries (its name, as "
                       "`fnmap cache ls` shows it, or a prefix of its digest)")
    clear.add_argument("--older-than", metavar="AGE", help="only entries older than this: 90s, 30m, 12h, 7d, 2w")
    clear.add_argument("--storage", metavar="URL", help=_STORAGE_HELP)
    clear.set_defaults(run=_storage_errors(run_clear))


def run_ls(args) -> int:
    from ..cache.store import listing

    rows = listing(_store(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("the result cache is empty")
        return 0
    print(f"{'FUNCTION':<32} {'DIGEST':<12} {'ENTRIES':>8} {'BYTES':>10}  {'OLDEST':<19}  NEWEST")
    for r in rows:
        print(f"{r['function'][:32]:<32} {r['function_digest'][:12]:<12} {r['entries']:>8} {_bytes(r['bytes']):>10}"
              f"  {_time(r['oldest']):<19}  {_time(r['newest'])}")
    return 0


def run_clear(args) -> int:
    from ..cache.store import clear
    from ..options import parse_age

    try:
        age = None if args.older_than is None else parse_age(args.older_than)
    except ValueError as e:
        raise SystemExit(f"fnmap cache clear: --older-than: {e}") from None
    report = clear(_store(args), function=args.function, older_than=age)
    if args.function and not report["functions"]:
        raise SystemExit(f"fnmap cache clear: no cached function named {args.function!r}; "
                         "`fnmap cache ls` lists them")
    print(f"deleted {report['entries']} cache entr{'y' if report['entries'] == 1 else 'ies'} "
          f"({_bytes(report['bytes'])}) of {report['functions']} function(s)")
    return 0
