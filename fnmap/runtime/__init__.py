"""Code that runs where the calls run (a cloud function, a container, an emulator worker).

Nothing here imports the client side (``fnmap.api``, ``fnmap.client``, ``fnmap.backends``, ...):
``tests/test_layout.py`` checks it, so the cloud package stays small and the worker routine
stays readable on its own.
"""
