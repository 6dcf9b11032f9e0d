"""The result cache: ``fnmap.map(func, items, cache=True)`` runs each call once, ever.

- :mod:`fnmap.cache.key`: what a call computes, as a key (the function's code and everything it
  reads, the item by a canonical encoding);
- :mod:`fnmap.cache.store`: entries in the job storage, sealed, first writer wins;
- :mod:`fnmap.cache.plan`: one job's lookups before its calls are made, and its writes after.

The knobs are :class:`fnmap.config.Cache` (``fnmap.Cache``); docs/cache.md says what the key sees.
"""
