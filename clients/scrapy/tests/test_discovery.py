import json
import ssl
import subprocess
import time

import pytest

from egress_proxies.discovery import Discovery, DiscoveryError


@pytest.mark.parametrize("url", ["", "proxy-operator:8082", "ftp://h:1", "http://", "http://u:p@h:1", "http://h:1?x=1"])
def test_bad_urls_are_refused(url):
    with pytest.raises(ValueError, match="discovery URL"):
        Discovery(url)


def test_pick_sends_the_query_and_the_token(stub):
    stub.script = [(200, {}, {"name": "p2", "namespace": "crawl", "url": "http://u:p@10.0.0.2:3128"})]
    d = Discovery(stub.url + "/", "tok\n")
    p = d.pick(domain="shop.example.com", label_selector="tier=gold", credentials=True)
    assert p["url"] == "http://u:p@10.0.0.2:3128"
    method, path, headers, _ = stub.requests[0]
    assert method == "GET"
    assert path == "/v1/proxies/pick?domain=shop.example.com&labelSelector=tier%3Dgold&credentials=true"
    assert headers["Authorization"] == "Bearer tok"
    with pytest.raises(ValueError, match="key or domain"):
        d.pick(label_selector="x")


def test_errors_name_the_url_and_the_status(stub):
    stub.script = [(503, {"Retry-After": "212"}, {"error": "site example.com is saturated", "parameter": "domain"})]
    d = Discovery(stub.url)
    with pytest.raises(DiscoveryError) as e:
        d.pick(domain="shop.example.com")
    assert e.value.status == 503 and e.value.retry_after == 212
    assert str(e.value) == (f"discovery GET {stub.url}/v1/proxies/pick?domain=shop.example.com: "
                            "503 site example.com is saturated (retry after 212s)")


def test_unreachable_api_names_the_url():
    d = Discovery("http://127.0.0.1:9", timeout=2)
    with pytest.raises(DiscoveryError) as e:
        d.list()
    assert e.value.status == 0 and "http://127.0.0.1:9/v1/proxies" in str(e.value)


def test_feedback_goes_in_batches_with_rejections_indexed(stub):
    def answer(body):
        reports = json.loads(body)["reports"]
        rejected = [{"index": i, "proxy": r["proxy"], "error": "unknown proxy"} for i, r in enumerate(reports) if r["proxy"] == "crawl/gone"]
        return {"accepted": len(reports) - len(rejected), "rejected": rejected}
    stub.default = (200, {}, answer)
    reports = [{"proxy": "crawl/p2", "domain": f"s{i}.example.com", "outcome": "ok"} for i in range(1500)]
    reports[1200]["proxy"] = "crawl/gone"
    accepted, rejected = Discovery(stub.url, "t").feedback(reports)
    assert accepted == 1499
    assert [r["index"] for r in rejected] == [1200]
    assert [len(json.loads(r[3])["reports"]) for r in stub.requests] == [1000, 500]


def test_feedback_retries_a_draining_replica_after_its_retry_after(stub):
    stub.script = [(503, {"Retry-After": "1"}, {"error": "this replica is shutting down"}),
                   (200, {}, {"accepted": 1, "rejected": []})]
    start = time.monotonic()
    accepted, rejected = Discovery(stub.url).feedback([{"proxy": "crawl/p2", "domain": "example.com", "outcome": "banned"}])
    assert (accepted, rejected) == (1, [])
    assert time.monotonic() - start >= 1.0
    assert len(stub.requests) == 2 and stub.requests[0][3] == stub.requests[1][3]


def test_feedback_gives_up_and_does_not_retry_a_refusal(stub):
    stub.default = (503, {}, {"error": "this replica is shutting down"})
    d = Discovery(stub.url, feedback_attempts=3, retry_backoff=0.01)
    with pytest.raises(DiscoveryError, match="gave up after 3 attempts"):
        d.feedback([{"proxy": "crawl/p2", "domain": "example.com", "outcome": "ok"}])
    assert len(stub.requests) == 3

    stub.requests.clear()
    stub.default = (401, {}, {"error": "missing bearer token"})
    with pytest.raises(DiscoveryError) as e:
        d.feedback([{"proxy": "crawl/p2", "domain": "example.com", "outcome": "ok"}])
    assert e.value.status == 401 and len(stub.requests) == 1
    assert f"POST {stub.url}/v1/feedback: 401 missing bearer token" in str(e.value)


def test_https_with_a_ca_file(stub, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    stub.server.socket = ctx.wrap_socket(stub.server.socket, server_side=True)
    url = stub.url.replace("http://", "https://")
    stub.default = (200, {}, {"count": 0, "proxies": []})
    assert Discovery(url, ca_file=str(cert)).list() == []
    with pytest.raises(DiscoveryError) as e:
        Discovery(url).list()
    assert e.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(e.value) and url + "/v1/proxies" in str(e.value)


def _replace(path, text):
    """Replaces path as the kubelet rotates a projected token: a new file renamed into place."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.replace(path)


def test_a_token_file_is_read_again_when_it_changes(stub, tmp_path):
    stub.default = (200, {}, {"proxies": []})
    path = tmp_path / "token"
    _replace(path, "first-token\n")
    d = Discovery(stub.url, token_file=str(path))
    bearers = []

    def call():
        d.list()
        bearers.append(stub.requests[-1][2]["Authorization"])

    call()
    call()
    _replace(path, "rotated-token\n")
    call()
    path.write_text("rewritten-in-place-token")  # same file, another size
    call()
    path.unlink()  # gone for a while: the last token stays in use
    call()
    _replace(path, "back-token")
    call()
    assert bearers == ["Bearer first-token", "Bearer first-token", "Bearer rotated-token",
                       "Bearer rewritten-in-place-token", "Bearer rewritten-in-place-token", "Bearer back-token"]
    assert d.has_token


def test_token_file_errors_name_the_file(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=f"token file '{empty}' is empty"):
        Discovery("http://h:1", token_file=str(empty))
    with pytest.raises(ValueError, match=f"token file '{tmp_path}/missing': .*No such file"):
        Discovery("http://h:1", token_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="token or token_file"):
        Discovery("http://h:1", "t", token_file=str(empty))
