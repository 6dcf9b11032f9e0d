"""``fnmap dashboard``: a local, token-protected, read-only web page over every job in storage.

A job's truth is in its storage (:mod:`fnmap.observe`), so one page shows the jobs of every
process and machine that shares the storage, running or long finished.  The parts:

* :mod:`.views`: what each page shows, as plain data from the records (no HTTP);
* :mod:`.listing`: the front page's list of every job, kept fresh at the cost of a poll;
* :mod:`.metrics`: the same jobs in Prometheus' text format;
* :mod:`.auth`: the token every request needs;
* :mod:`.app`: the Flask routes, behind the emulator's front door;
* :mod:`.server`: the emulator's HTTP server on loopback;
* ``static/``: two fixed pages and their plain scripts and style, served by fnmap itself
  (nothing is fetched from the internet, so the page works offline).

Nothing here imports Flask or prometheus_client until a dashboard is made.
"""

#: The port ``fnmap dashboard`` serves on unless told (``--port 0``: any free one).
DEFAULT_PORT = 8766
