"""Prices (issue 36): the built-in tables, the cache ``fnmap prices update`` writes, and the command.

moto has no Price List API, so a small server on loopback speaks its JSON protocol
(``X-Amz-Target: AWSPriceListService.GetProducts``) with products in AWS's own shape, and boto3 is
pointed at it with ``AWS_ENDPOINT_URL_PRICING``, as a user could point it at any endpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fnmap.cost import prices
from fnmap.errors import ConfigError

#: What the fake Price List API sells: (service, region) -> [(usagetype, USD per unit of the first tier)].
FETCHED = {
    ("AWSLambda", "us-east-1"): [("Lambda-GB-Second", "0.0000170000"), ("Lambda-GB-Second-ARM", "0.0000140000"),
                                 ("Request", "0.0000003000"), ("Global-Request", "0.0000000000")],
    ("AWSLambda", "eu-west-1"): [("EU-Lambda-GB-Second", "0.0000180000"), ("EU-Lambda-GB-Second-ARM", "0.0000150000"),
                                 ("EU-Request", "0.0000004000"), ("EU-Lambda-Edge-Request", "0.0000009000")],
    ("AmazonS3", "us-east-1"): [("Requests-Tier1", "0.0000060000"), ("Requests-Tier2", "0.0000005000")],
    ("AmazonS3", "eu-west-1"): [("EU-Requests-Tier1", "0.0000070000"), ("EU-Requests-Tier2", "0.0000006000")],
}
HOURLY = {("c5.large", "us-east-1"): "0.0900000000", ("g5.xlarge", "us-east-1"): "1.1000000000",
          ("c5.large", "eu-west-1"): "0.0970000000"}
PREFIX = {"us-east-1": "", "eu-west-1": "EU-"}


def product(service: str, region: str, usagetype: str, usd: str, family: str, **attributes) -> str:
    """One PriceList entry as AWS sends it: a JSON string with product, terms.OnDemand...pricePerUnit."""
    sku = f"SKU{abs(hash((service, region, usagetype))) % 10**8:08d}"
    tiers = {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"beginRange": "0", "endRange": "6000000000", "unit": "Units",
                                              "pricePerUnit": {"USD": usd}, "description": usagetype}}
    if usagetype.endswith("Lambda-GB-Second"):  # the second tier is cheaper, and must not be taken
        tiers[f"{sku}.JRTCKXETXF.TIER2"] = {"beginRange": "6000000000", "endRange": "Inf", "unit": "Units",
                                            "pricePerUnit": {"USD": "0.0000010000"}, "description": "tier 2"}
    return json.dumps({
        "product": {"productFamily": family, "sku": sku,
                    "attributes": {"servicecode": service, "regionCode": region, "usagetype": usagetype,
                                   **attributes}},
        "serviceCode": service,
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {"sku": sku, "offerTermCode": "JRTCKXETXF",
                                                     "effectiveDate": "2026-12-01T00:00:00Z",
                                                     "priceDimensions": tiers, "termAttributes": {}}}},
        "version": "20261201000000", "publicationDate": "2026-12-01T00:00:00Z",
    })


class PriceListAPI(BaseHTTPRequestHandler):
    """``GetProducts`` of the AWS Price List API (JSON 1.1), filtered by TERM_MATCH as AWS does."""

    requests: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.headers.get("X-Amz-Target"), body))
        if self.headers.get("X-Amz-Target") != "AWSPriceListService.GetProducts":
            return self._answer(400, {"__type": "InvalidParameterException", "message": "unknown target"})
        want = {f["Field"]: f["Value"] for f in body.get("Filters", [])}
        service, region = body["ServiceCode"], want.get("regionCode")
        if service == "AmazonEC2":
            usd = HOURLY.get((want.get("instanceType"), region))
            items = [] if usd is None else [product(
                service, region, f"{PREFIX[region]}BoxUsage:{want['instanceType']}", usd,
                "Compute Instance", instanceType=want["instanceType"], operatingSystem="Linux", tenancy="Shared",
                preInstalledSw="NA", capacitystatus="Used")]
        else:
            family = "Serverless" if service == "AWSLambda" else "API Request"
            items = [product(service, region, usage, usd, family) for usage, usd in FETCHED.get((service, region), [])]
        self._answer(200, {"FormatVersion": "aws_v1", "PriceList": items})

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def pricing_server():
    PriceListAPI.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), PriceListAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, PriceListAPI.requests
    server.shutdown()
    server.server_close()


def aws_env(tmp_path, server=None, credentials=True) -> dict:
    """The environment of a ``fnmap`` subprocess: the cache under tmp_path, no AWS files of the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"), AWS_EC2_METADATA_DISABLED="true")
    if credentials:
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    if server is not None:
        env["AWS_ENDPOINT_URL_PRICING"] = f"http://127.0.0.1:{server.server_address[1]}"
    return env


def fnmap_cli(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fnmap", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def in_fresh_process(code: str, env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


ASK = ("import json; from fnmap.cost.prices import *\n"
       "l, s, w = lambda_price('{r}'), s3_price('{r}'), s3_price('us-west-2')\n"
       "print(json.dumps(dict(lam=[l.gb_second_x86, l.gb_second_arm, l.request], s3=[s.put, s.get, s.region],\n"
       "  west=[w.put, w.region], c5=instance_price('c5.large', '{r}'), basis=prices_basis())))")


def test_update_fetches_writes_the_cache_and_a_fresh_process_uses_it(tmp_path, pricing_server):
    server, requests = pricing_server
    env = aws_env(tmp_path, server)
    done = fnmap_cli("prices", "update", "--region", "us-east-1", "--region", "eu-west-1",
                     "--instance-type", "c5.large", "--instance-type", "g5.xlarge", env=env)
    assert done.returncode == 0, done.stderr
    assert {target for target, _ in requests} == {"AWSPriceListService.GetProducts"}
    assert {body["ServiceCode"] for _, body in requests} == {"AWSLambda", "AmazonS3", "AmazonEC2"}
    # What changed is printed, old -> new.
    assert "lambda/us-east-1/gb_second_x86: 1.66667e-05 -> 1.7e-05" in done.stdout, done.stdout
    assert "ec2/eu-west-1/c5.large: (none) -> 0.097" in done.stdout, done.stdout
    assert "ec2 g5.xlarge in eu-west-1" in done.stderr  # the server has no such price: said, not invented

    cache = json.loads((tmp_path / "cache" / "fnmap" / "prices.json").read_text())
    assert cache["format"] == prices.CACHE_FORMAT and cache["source"] == "AWS Price List API"
    assert cache["lambda"]["eu-west-1"] == {"gb_second_x86": 0.000018, "gb_second_arm": 0.000015, "request": 4e-07}
    assert cache["s3"]["us-east-1"] == {"put": 0.000006, "get": 5e-07}
    assert cache["ec2"] == {"us-east-1": {"c5.large": 0.09, "g5.xlarge": 1.1}, "eu-west-1": {"c5.large": 0.097}}
    assert not [p for p in (tmp_path / "cache" / "fnmap").iterdir() if p.name != "prices.json"]  # no temp file left

    got = in_fresh_process(ASK.format(r="eu-west-1"), env)
    assert got["lam"] == [0.000018, 0.000015, 4e-07]
    assert got["s3"] == [0.000007, 6e-07, "eu-west-1"]
    assert got["west"] == [0.000006, "us-east-1"]  # no figure of its own: us-east-1's (fetched), and it says so
    assert got["c5"] == 0.097
    assert got["basis"]["source"] == "AWS Price List API"
    assert got["basis"]["file"] == str(tmp_path / "cache" / "fnmap" / "prices.json")

    # A later update of one region keeps the other region's figures.
    assert fnmap_cli("prices", "update", "--region", "us-east-1", "--instance-type", "c5.large",
                     env=env).returncode == 0
    cache = json.loads((tmp_path / "cache" / "fnmap" / "prices.json").read_text())
    assert cache["lambda"]["eu-west-1"]["request"] == 4e-07 and cache["ec2"]["us-east-1"]["g5.xlarge"] == 1.1


def test_the_built_in_tables_without_a_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert prices.lambda_price("us-east-1") == prices.LambdaPrice(0.0000166667, 0.0000133334, 0.0000002)
    assert prices.lambda_price("af-south-1").request == 0.00000028
    assert prices.s3_price("us-east-1") == prices.S3Price(0.000005, 0.0000004, "us-east-1")
    assert prices.instance_price("g5.xlarge") == 1.006
    assert prices.prices_basis() == {"date": prices.PRICES_DATE, "source": "built-in tables", "file": None}
    assert prices.LAMBDA_INIT_BILLED_SINCE == "2025-08-01"


def test_a_corrupt_or_foreign_cache_is_ignored_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = tmp_path / "fnmap" / "prices.json"
    path.parent.mkdir()
    for content in ("{not json", json.dumps({"format": "someone-else/2", "lambda": {}}),
                    json.dumps({"format": prices.CACHE_FORMAT, "date": "2026-12-06", "source": "x",
                                "lambda": {"us-east-1": {"gb_second_x86": -1, "gb_second_arm": 1, "request": 1}}})):
        path.write_text(content)
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))  # a new version
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert prices.lambda_price("us-east-1").gb_second_x86 == 0.0000166667
            assert prices.s3_price("us-east-1").put == 0.000005
            assert prices.prices_basis()["source"] == "built-in tables"
        assert len(caught) == 1, [str(w.message) for w in caught]
        assert str(path) in str(caught[0].message) and "fnmap prices update" in str(caught[0].message)


def test_the_cache_is_read_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert prices.s3_price("us-east-1").put == 0.000005
    prices.write_cache({"s3": {"us-east-1": {"put": 0.00001, "get": 0.000001}}}, "2026-12-07")
    assert prices.s3_price("us-east-1").put == 0.00001
    assert prices.prices_basis()["date"] == "2026-12-07"
    prices.write_cache({"s3": {"us-east-1": {"put": 0.00002, "get": 0.000001}}}, "2026-12-08")
    assert prices.s3_price("us-east-1").put == 0.00002
    assert prices.prices_basis()["date"] == "2026-12-08"


def test_an_unknown_region_or_type_names_the_known_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(prices.UnknownPrice) as e:
        prices.lambda_price("mars-north-1")
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)
    assert "'mars-north-1'" in str(e.value) and "us-east-1, us-east-2" in str(e.value)
    assert "fnmap prices update --region mars-north-1" in str(e.value)
    with pytest.raises(prices.UnknownPrice, match="eu-west-1"):
        prices.s3_price("mars-north-1")
    with pytest.raises(prices.UnknownPrice, match="c5.large"):
        prices.instance_price("z9.huge")
    with pytest.raises(prices.UnknownPrice, match="regions with EC2 prices: us-east-1"):
        prices.instance_price("c5.large", "eu-west-1")


def test_fnmap_prices_prints_the_date_and_source(tmp_path):
    env = aws_env(tmp_path)
    done = fnmap_cli("prices", "--region", "eu-west-1", env=env)
    assert done.returncode == 0, done.stderr
    assert f"prices of {prices.PRICES_DATE}, from the built-in tables" in done.stdout
    assert "x86_64 0.0000166667   arm64 0.0000133334" in done.stdout
    assert "(us-east-1's: no figure for eu-west-1" in done.stdout
    prices_file = tmp_path / "cache" / "fnmap" / "prices.json"
    prices_file.parent.mkdir(parents=True)
    prices_file.write_text(json.dumps({"format": prices.CACHE_FORMAT, "date": "2026-12-05",
                                       "source": "AWS Price List API", "lambda": {}, "s3": {}, "ec2": {}}))
    shown = json.loads(fnmap_cli("prices", "--json", env=env).stdout)
    assert (shown["date"], shown["source"], shown["file"]) == ("2026-12-05", "AWS Price List API", str(prices_file))
    assert shown["lambda"]["request"] == 0.0000002 and shown["lambda_init_billed_since"] == "2025-08-01"
    for args in (["prices", "--help"], ["prices", "update", "--help"]):
        assert fnmap_cli(*args, env=env).returncode == 0


def test_update_without_credentials_says_so_in_one_line(tmp_path, pricing_server):
    server, requests = pricing_server
    done = fnmap_cli("prices", "update", env=aws_env(tmp_path, server, credentials=False))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "no AWS credentials" in error[0] and "aws configure" in error[0], done.stderr
    assert not requests and not (tmp_path / "cache" / "fnmap" / "prices.json").exists()


def test_a_map_and_its_prices_never_ask_the_price_list_api(tmp_path, pricing_server):
    server, requests = pricing_server
    env = aws_env(tmp_path, server)
    code = ("import json, fnmap\nfrom fnmap.cost.prices import *\n"
            "assert fnmap.map(abs, [1, -2], backend='local') == [1, 2]\n"
            "print(json.dumps([lambda_price('us-east-1').request, s3_price('eu-west-1').put,\n"
            "                  instance_price('c5.large'), prices_basis()['source']]))")
    assert in_fresh_process(code, env) == [0.0000002, 0.000005, 0.085, "built-in tables"]
    assert requests == []
