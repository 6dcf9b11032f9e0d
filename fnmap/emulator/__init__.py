"""The local emulator: plays the cloud on one machine.

``fnmap emulator`` serves the same WSGI app as ``handlers/http.py`` with a real
WSGI server (:mod:`.httpserver`, a thread per keep-alive connection), but runs
each invocation in a pool of warm worker processes so a crash, kill or hang
fails only its own call.
"""
