"""Function management and layers on the emulator's Lambda API (``--lambda-runtime ric`` only).

What ``fnmap deploy aws deploy|env|destroy`` calls, with botocore's paths: CreateFunction,
GetFunction, UpdateFunctionCode, UpdateFunctionConfiguration (``Timeout``, ``MemorySize``,
``Environment``, ``Layers``), DeleteFunction,
PublishLayerVersion, GetLayerVersion, ListLayerVersions and DeleteLayerVersion.  A layer's
``python/`` goes on the path of the functions naming it, as Lambda's ``/opt/python``
(:class:`.lambda_environment.Environment`).  Every other operation is refused by
:func:`unsupported`, naming the operation (from botocore's model of the Lambda API) and saying
that the emulator does not support it.
"""

from __future__ import annotations

import base64
import functools
import re

from flask import Response, jsonify, request

from .lambda_common import HANDLER, configuration, error, function_name, host_architecture

#: What the emulator serves, for the refusal of everything else.
SERVED = ("Invoke, GetFunctionConfiguration, Put/Get/DeleteFunctionConcurrency, "
          "Put/Update/Get/DeleteFunctionEventInvokeConfig, GetAccountSettings and, with --lambda-runtime ric, "
          "CreateFunction, GetFunction, UpdateFunctionCode, UpdateFunctionConfiguration, DeleteFunction, "
          "PublishLayerVersion, GetLayerVersion, ListLayerVersions, "
          "DeleteLayerVersion")


@functools.lru_cache(maxsize=1)
def _operations() -> list[tuple[str, re.Pattern, str]]:
    """(HTTP method, path pattern, operation name) of every Lambda API operation botocore knows."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("lambda")
    found = []
    for name in model.operation_names:
        http = model.operation_model(name).http
        uri = http["requestUri"].split("?", 1)[0]
        pattern = re.sub(r"\{[^}]+\}", "[^/]+", re.escape(uri).replace(r"\{", "{").replace(r"\}", "}"))
        found.append((http["method"], re.compile(pattern + "/?"), name))
    return found


def operation_name(method: str, path: str) -> str:
    """The Lambda API operation a request is (``GetAlias``...), or ``METHOD path`` if none matches."""
    for verb, pattern, name in _operations():
        if verb == method and pattern.fullmatch(path):
            return name
    return f"{method} {path}"


def unsupported(ric: bool) -> Response:
    """A Lambda API operation the emulator does not serve: 501, naming it."""
    operation = operation_name(request.method, request.path)
    hint = ("" if ric else " (function management and layers need --lambda-runtime ric, "
            "with awslambdaric installed)")
    return error(501, "NotImplemented",
                  f"the fnmap emulator does not support the Lambda operation {operation} "
                  f"({request.method} {request.path}){hint}; it serves {SERVED}. Use AWS itself for the rest")


def _layer_answer(layer) -> dict:
    return {"LayerArn": layer.arn.rsplit(":", 1)[0], "LayerVersionArn": layer.arn, "Version": layer.version,
            "Description": layer.description, "CreatedDate": layer.created,
            "CompatibleRuntimes": layer.runtimes, "CompatibleArchitectures": layer.architectures,
            "Content": {"CodeSha256": layer.sha256, "CodeSize": layer.size, "Location": ""}}


def _configure(api, name: str, spec: dict, zip_file: str | None):
    from ..deploy.package import code_sha256

    try:
        code = base64.b64decode(zip_file, validate=True) if zip_file is not None else None
        variables = (spec.get("Environment") or {}).get("Variables") if "Environment" in spec else None
        api.runtime.configure(name, zip_file=code, timeout=spec.get("Timeout"), memory=spec.get("MemorySize"),
                              variables=variables, layers=spec.get("Layers"))
    except ValueError as e:
        return error(400, "InvalidParameterValueException", str(e))
    if name in api.runtime.created:
        extra = api.runtime.created[name]
        if code is not None:
            extra.update(CodeSha256=code_sha256(code), CodeSize=len(code))
        if "Description" in spec:
            extra["Description"] = str(spec["Description"])
    return jsonify(configuration(api, name))


def _create_problem(spec: dict):
    """The error answer a CreateFunction request deserves, or None when the emulator can create it."""
    name = spec.get("FunctionName")
    if not isinstance(name, str) or not name:
        return error(400, "InvalidParameterValueException", f"FunctionName={name!r} must be a name")
    handler = spec.get("Handler", HANDLER)
    if handler != HANDLER:
        return error(400, "InvalidParameterValueException",
                     f"Handler={handler!r}: the emulator runs fnmap's handler, {HANDLER}")
    if spec.get("PackageType", "Zip") != "Zip":
        return error(400, "InvalidParameterValueException",
                     f"PackageType={spec['PackageType']!r}: the emulator runs zip packages only, not images")
    architectures = spec.get("Architectures") or [host_architecture()]
    if architectures != [host_architecture()]:
        return error(400, "InvalidParameterValueException",
                     f"Architectures={architectures!r}: the emulator runs on this machine's "
                     f"{host_architecture()} only")
    if (spec.get("Code") or {}).get("ZipFile") is None:
        return error(400, "InvalidParameterValueException", "Code.ZipFile is required (the package's zip)")
    return None


def lambda_create_function(api):
    spec = request.get_json(force=True, silent=True) or {}
    problem = _create_problem(spec)
    if problem is not None:
        return problem
    name = function_name(spec["FunctionName"])
    if name in api.runtime.created:
        return error(409, "ResourceConflictException", f"Function already exist: {name}")
    api.runtime.created[name] = {"Tags": dict(spec.get("Tags") or {}), "Description": spec.get("Description", "")}
    answer = _configure(api, name, spec, spec["Code"]["ZipFile"])
    if answer.status_code >= 400:
        api.runtime.created.pop(name, None)
    return answer


def lambda_get_function(api, name):
    name = function_name(name)
    if name not in api.runtime.created:
        return error(404, "ResourceNotFoundException", f"Function not found: {name} (not created on this "
                     "emulator; every name still answers Invoke with fnmap's own package)")
    return jsonify({"Configuration": configuration(api, name), "Code": {"RepositoryType": "S3", "Location": ""},
                    "Tags": api.runtime.created[name]["Tags"]})


def lambda_delete_function(api, name):
    name = function_name(name)
    if not api.runtime.delete_function(name):
        return error(404, "ResourceNotFoundException", f"Function not found: {name}")
    return Response(status=204)


def lambda_update_function_code(api, name):
    zip_file = (request.get_json(force=True, silent=True) or {}).get("ZipFile")
    if zip_file is None:
        return error(400, "InvalidParameterValueException", "ZipFile is required (the package's zip)")
    return _configure(api, function_name(name), {}, zip_file)


def lambda_update_function_configuration(api, name):
    return _configure(api, function_name(name), request.get_json(force=True, silent=True) or {}, None)


def lambda_publish_layer_version(api, name):
    spec = request.get_json(force=True, silent=True) or {}
    zip_file = (spec.get("Content") or {}).get("ZipFile")
    if zip_file is None:
        return error(400, "InvalidParameterValueException",
                     "Content.ZipFile is required: the emulator takes the layer's zip itself, not S3Bucket/S3Key")
    try:
        layer = api.runtime.layers.publish(name, base64.b64decode(zip_file, validate=True), spec)
    except ValueError as e:
        return error(400, "InvalidParameterValueException", f"Content.ZipFile: {e}")
    return jsonify(_layer_answer(layer)), 201


def lambda_list_layer_versions(api, name):
    return jsonify({"LayerVersions": [_layer_answer(v) for v in api.runtime.layers.listed(name)]})


def lambda_layer_version(api, name, version):
    if request.method == "DELETE":
        api.runtime.layers.delete(name, version)
        return Response(status=204)
    layer = api.runtime.layers.get(name, version)
    if layer is None:
        return error(404, "ResourceNotFoundException", f"The layer version {name}:{version} does not exist")
    return jsonify(_layer_answer(layer))


#: Function management and layers, served with ``--lambda-runtime ric`` only (botocore's paths).
ROUTES = [
    ("POST", "/2015-03-31/functions", lambda_create_function),
    ("GET", "/2015-03-31/functions/<name>", lambda_get_function),
    ("DELETE", "/2015-03-31/functions/<name>", lambda_delete_function),
    ("PUT", "/2015-03-31/functions/<name>/code", lambda_update_function_code),
    ("PUT", "/2015-03-31/functions/<name>/configuration", lambda_update_function_configuration),
    ("POST", "/2018-10-31/layers/<name>/versions", lambda_publish_layer_version),
    ("GET", "/2018-10-31/layers/<name>/versions", lambda_list_layer_versions),
    ("GET,DELETE", "/2018-10-31/layers/<name>/versions/<int:version>", lambda_layer_version),
]
