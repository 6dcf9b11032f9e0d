# fnmap's AWS Lambda function as a container image (instead of the zip `fnmap deploy aws` builds).
#
# Build it with the client's Python and cloudpickle versions (pickles only load on the same ones),
# from the repository root, push it to ECR, then deploy with --image:
#
#   docker build -f infra/lambda.Dockerfile -t fnmap-lambda \
#     --build-arg PYTHON_VERSION=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
#     --build-arg CLOUDPICKLE_VERSION=$(python -c 'import cloudpickle; print(cloudpickle.__version__)') \
#     --build-arg EXTRA_PACKAGES="numpy pandas" .
#   aws ecr create-repository --repository-name fnmap-lambda
#   aws ecr get-login-password | docker login --username AWS --password-stdin ACCOUNT.dkr.ecr.REGION.amazonaws.com
#   docker tag fnmap-lambda ACCOUNT.dkr.ecr.REGION.amazonaws.com/fnmap-lambda:latest
#   docker push ACCOUNT.dkr.ecr.REGION.amazonaws.com/fnmap-lambda:latest
#   fnmap deploy aws deploy --image ACCOUNT.dkr.ecr.REGION.amazonaws.com/fnmap-lambda:latest
#
# EXTRA_PACKAGES are what your functions import (an image may hold up to 10 GB, a zip 250 MB).
ARG PYTHON_VERSION=3.11
FROM public.ecr.aws/lambda/python:${PYTHON_VERSION}

ARG CLOUDPICKLE_VERSION=3.1.3
ARG EXTRA_PACKAGES=""
RUN pip install --no-cache-dir "cloudpickle==${CLOUDPICKLE_VERSION}" ${EXTRA_PACKAGES}

COPY fnmap ${LAMBDA_TASK_ROOT}/fnmap
COPY handlers ${LAMBDA_TASK_ROOT}/handlers

CMD ["handlers.aws_lambda.handler"]
