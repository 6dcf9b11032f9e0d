"""The IAM policies of ``fnmap deploy aws``: the role Lambda assumes, and what it may do."""

from __future__ import annotations


def trust_policy() -> dict:
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole",
    }]}


def role_policy(bucket: str, prefix: str, region: str, account: str, name: str) -> dict:
    """Least privilege: the objects under the bucket prefix, the function's own log group, and invoking
    the function itself (spawners)."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "JobData", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
         "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*"},
        {"Sid": "ListJobData", "Effect": "Allow", "Action": "s3:ListBucket",
         "Resource": f"arn:aws:s3:::{bucket}", "Condition": {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}},
        {"Sid": "Logs", "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
         "Resource": f"arn:aws:logs:{region}:{account}:log-group:/aws/lambda/{name}:*"},
        {"Sid": "FanOut", "Effect": "Allow", "Action": "lambda:InvokeFunction",
         "Resource": f"arn:aws:lambda:{region}:{account}:function:{name}"},
    ]}
