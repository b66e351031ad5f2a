"""Hosts that are public suffixes, Retry-After values JSON cannot carry, and the
middleware's own ban memory."""

import email.utils
import json
import time

import pytest
from scrapy.http import Request

from egress_proxies.discovery import MAX_RETRY_AFTER, Discovery, DiscoveryError, retry_after_seconds
from egress_proxies.middleware import META
from test_middleware import PROXIES, assign, middleware, respond


@pytest.mark.parametrize("url,site", [
    ("http://s3.amazonaws.com/bucket/key", False),  # path-style S3: a private public suffix
    ("http://github.io/", False),
    ("http://co.uk/", False),
    ("http://bucket.s3.amazonaws.com/key", True),
    ("http://alice.github.io/", True),
    ("http://www.shop.example.co.uk/", True),
])
def test_public_suffix_hosts_are_picked_by_key_like_the_go_client(url, site):
    mw = middleware()
    req = Request(url)
    assign(mw, req)
    host = url.split("/")[2]
    q = mw.discovery.calls[-1][1]
    if site:
        assert q.get("domain") == host and "key" not in q
    else:
        assert q.get("key") == host and "domain" not in q
        assert req.meta[META]["domain"] == ""
        assert mw.process_response(req, respond(req, 403), None).status == 403
        assert mw._pending == [], "a host that is no site is not reported"


def test_a_domain_the_api_refuses_is_picked_by_key():
    """The API's public suffix list may know a suffix tldextract's copy does not."""
    mw = middleware()
    pick = mw.discovery.pick

    def refuse_domains(**q):
        if "domain" in q:
            mw.discovery.calls.append(("pick", q))
            raise DiscoveryError("GET", "http://h/v1/proxies/pick", 400, "a public suffix, not a site", parameter="domain")
        return pick(**q)
    mw.discovery.pick = refuse_domains
    req = Request("http://myshopify.com/products")
    assign(mw, req)
    assert [c[1].get("domain") or c[1].get("key") for c in mw.discovery.calls] == ["myshopify.com", "myshopify.com"]
    assert "key" in mw.discovery.calls[-1][1]
    assert req.meta["proxy"] == PROXIES[0]["url"] and req.meta[META]["domain"] == ""
    assert mw.process_response(req, respond(req, 403), None).status == 403 and mw._pending == []


def test_other_api_errors_still_fail_the_pick():
    mw = middleware()

    def saturated(**q):
        raise DiscoveryError("GET", "http://h/v1/proxies/pick", 503, "site example.com is saturated", 30, parameter="domain")
    mw.discovery.pick = saturated
    with pytest.raises(DiscoveryError, match="saturated"):
        assign(mw, Request("http://shop.example.com/"))


@pytest.mark.parametrize("header,want", [
    ("7", 7.0), ("0.5", 0.5), ("inf", MAX_RETRY_AFTER), ("Infinity", MAX_RETRY_AFTER), ("1e999", MAX_RETRY_AFTER),
    ("31536000", MAX_RETRY_AFTER), ("nan", 0.0), ("-inf", 0.0), ("-5", 0.0), ("soon", 0.0), ("", 0.0),
])
def test_retry_after_is_a_finite_number_of_at_most_a_day(header, want):
    mw = middleware(EGRESS_PROXIES_MAX_BAN_RETRIES=0)
    req = Request("http://shop.example.com/")
    assign(mw, req)
    mw.process_response(req, respond(req, 429, {"Retry-After": header} if header else {}), None)
    (r,) = mw._pending
    assert r.get("retryAfterSeconds", 0.0) == want
    json.dumps(r, allow_nan=False)  # JSON after all


def test_retry_after_as_an_http_date():
    now = time.time()
    assert retry_after_seconds(email.utils.formatdate(now + 120, usegmt=True), now=now) == pytest.approx(120, abs=1)
    assert retry_after_seconds(email.utils.formatdate(now - 120, usegmt=True), now=now) == 0.0
    assert retry_after_seconds(b"Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 0.0


def test_feedback_never_sends_infinity_or_nan(stub):
    """A report given straight to Discovery.feedback with a non-finite number: the body is
    JSON, and the good reports with it are taken."""
    stub.default = (200, {}, lambda body: {"accepted": len(json.loads(body)["reports"]), "rejected": []})
    reports = [{"proxy": "crawl/p2", "domain": "a.example.com", "outcome": "banned"},
               {"proxy": "crawl/p2", "domain": "b.example.com", "outcome": "throttled", "retryAfterSeconds": float("inf")},
               {"proxy": "crawl/p2", "domain": "c.example.com", "outcome": "throttled", "retryAfterSeconds": float("nan")},
               {"proxy": "crawl/p2", "domain": "d.example.com", "outcome": "throttled", "retryAfterSeconds": 1e6},
               {"proxy": "crawl/p2", "domain": "e.example.com", "outcome": "throttled", "retryAfterSeconds": 30}]
    accepted, rejected = Discovery(stub.url, "t").feedback(reports)
    assert (accepted, rejected) == (5, [])

    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    sent = json.loads(stub.requests[0][3], parse_constant=refuse)["reports"]
    assert [r.get("retryAfterSeconds") for r in sent] == [None, MAX_RETRY_AFTER, None, MAX_RETRY_AFTER, 30]
    assert reports[1]["retryAfterSeconds"] == float("inf"), "the caller's reports are left as they were"


def test_the_ban_memory_forgets_hosts_not_asked_again():
    mw = middleware(EGRESS_PROXIES_BAN_MEMORY=0.05)
    for i in range(2000):
        mw._remember(f"site{i}.example.com", "crawl/p2")
    assert len(mw._recent) > 1000
    time.sleep(0.1)
    mw._remember("fresh.example.com", "crawl/p3")
    for _ in range(3000):
        mw._avoided("other.example.com")  # requests to a host that never banned
        if len(mw._recent) == 1:
            break
    assert list(mw._recent) == ["fresh.example.com"]
    assert mw._avoided("fresh.example.com") == ["crawl/p3"]
