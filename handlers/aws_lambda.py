"""AWS Lambda entry: ``handlers.aws_lambda.handler`` (zip or container image).

Translates the Lambda event (:mod:`fnmap.runtime.lambda_event`: a direct Invoke, by
value or by reference to storage, or a function URL request) into the worker
routine's ``(body, signature)`` and its answer back.  The signature is checked
by the worker before anything is unpickled.  The call's timeout is cut to
Lambda's remaining time less a reserve (:data:`RESERVE_SECONDS`, or a fifth of
a shorter limit), so a timeout error and the status record are written before
Lambda stops the call itself.  A spawner event (a slice of a big job's call events) is
invoked from here, each call as an asynchronous ``Event`` of this same function (boto3).
"""

from __future__ import annotations

from fnmap.runtime import worker
from fnmap.runtime.lambda_event import (
    Refused,
    decode_event,
    encode_result,
    is_spawn_event,
    is_url_event,
    spawn,
    url_result,
)
from fnmap.runtime.signing import REFUSED, secret_from_env

#: Seconds kept back from Lambda's limit to write the outcome (one or two S3 PUTs).
RESERVE_SECONDS = 5.0
_SECRET = secret_from_env()
worker.note_init()  # Lambda bills the INIT phase (this process's start, to here) with the first call


def handler(event, context):
    if is_spawn_event(event):
        return spawn(event, _event_invoker(context.invoked_function_arn), _SECRET)
    try:
        body, signature = decode_event(event, _SECRET)
    except Refused:
        status, out = 403, REFUSED
    except ValueError as e:
        status, out = 400, f"malformed fnmap event: {e}".encode()
    except Exception as e:  # the request stored by reference could not be read: retry later
        status, out = 503, f"cannot read the stored request: {e!r}".encode()
    else:
        remaining = context.get_remaining_time_in_millis() / 1000.0
        limit = remaining - min(RESERVE_SECONDS, remaining / 5)
        status, out = worker.handle(body, signature, _SECRET, time_limit=max(limit, 0.001))
    return url_result(status, out) if is_url_event(event) else encode_result(status, out)


def _event_invoker(function_arn: str):
    import boto3

    client = boto3.client("lambda")

    def invoke(payload: bytes):
        try:
            client.invoke(FunctionName=function_arn, InvocationType="Event", Payload=payload)
        except client.exceptions.TooManyRequestsException as e:
            return ("throttled", str(e))
        return None

    return invoke
