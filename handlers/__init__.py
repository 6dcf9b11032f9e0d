"""What runs in the cloud: one small entry module per platform, each around ``fnmap.runtime.worker``.

``aws_lambda`` (AWS Lambda), ``http`` (a WSGI app for any HTTP host), ``gcf``
(Google's functions-framework), ``web`` (the WSGI app served on ``$PORT``:
Cloud Run, Knative, Function Compute and SCF web functions).
"""
