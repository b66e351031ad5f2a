import hashlib

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Request
from scrapy.utils.test import get_crawler

from egress_proxies.discovery import DiscoveryError
from egress_proxies.middleware import META, EgressProxiesMiddleware, NoEgressProxy

PROXIES = [{"name": f"p{i}", "namespace": "crawl", "url": f"http://u:pw@127.0.0.1:{3000 + i}"} for i in (2, 3, 4)]


class Recorder:
    """What the middleware asks the discovery API, with the fleet above as answers: a pick
    is the first of PROXIES (their rendezvous order here) that exclude= leaves in; an API
    older than exclude= (knows_exclude False) refuses the parameter, as discovery does."""

    token = "t"

    def __init__(self):
        self.calls, self.sent = [], []
        self.fail = None
        self.knows_exclude = True
        self.fail_pick = None

    def pick(self, **q):
        self.calls.append(("pick", q))
        if self.fail_pick:
            raise self.fail_pick
        exclude = q.get("exclude") or []
        if exclude and not self.knows_exclude:
            raise DiscoveryError("GET", "http://h/v1/proxies/pick", 400, 'unknown parameter "exclude"', parameter="exclude")
        for p in PROXIES:
            if f"{p['namespace']}/{p['name']}" not in exclude and p["url"] not in exclude:
                return p
        raise DiscoveryError("GET", "http://h/v1/proxies/pick", 503, "no healthy proxy matches the request")

    def list(self, **q):
        self.calls.append(("list", q))
        return PROXIES

    def feedback(self, reports):
        if self.fail:
            raise self.fail
        self.sent.extend(reports)
        return len(reports) - 1, [{"index": 0, "proxy": reports[0]["proxy"], "error": "unknown proxy"}]


def middleware(**settings):
    settings.setdefault("EGRESS_PROXIES_URL", "http://proxy-operator:8082")
    settings.setdefault("EGRESS_PROXIES_TOKEN", "t")
    crawler = get_crawler(settings_dict=settings)
    crawler.stats.open_spider(None)
    mw = EgressProxiesMiddleware.from_crawler(crawler)
    mw.discovery = Recorder()
    return mw


def assign(mw, request):
    """process_request's work without the reactor: choose, then assign."""
    host, domain, tried = mw._plan(request)
    return mw._assign(mw._choose(host, domain, tried, mw._key(request.url, domain)), request, tried)


def respond(request, status, headers=None):
    return HtmlResponse(request.url, status=status, headers=headers or {}, body=b"", request=request)


def test_settings_are_checked(tmp_path):
    with pytest.raises(NotConfigured):
        EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={}))
    with pytest.raises(ValueError, match="EGRESS_PROXIES_URL"):
        EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={"EGRESS_PROXIES_URL": "proxy-operator"}))
    empty = tmp_path / "token"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=f"EGRESS_PROXIES_TOKEN_FILE: token file '{empty}' is empty"):
        EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={"EGRESS_PROXIES_URL": "http://h:1", "EGRESS_PROXIES_TOKEN_FILE": str(empty)}))
    with pytest.raises(ValueError, match="EGRESS_PROXIES_TOKEN_FILE: token file .*: No such file"):
        EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={"EGRESS_PROXIES_URL": "http://h:1", "EGRESS_PROXIES_TOKEN_FILE": str(tmp_path / "nope")}))
    good = tmp_path / "good"
    good.write_text("s3cret\n")
    mw = EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={"EGRESS_PROXIES_URL": "http://h:1", "EGRESS_PROXIES_TOKEN_FILE": str(good)}))
    assert mw.discovery.bearer() == "s3cret" and mw.query["credentials"] is True
    mw = EgressProxiesMiddleware.from_crawler(get_crawler(settings_dict={
        "EGRESS_PROXIES_URL": "http://h:1", "EGRESS_PROXIES_TOKEN_FILE": str(good), "EGRESS_PROXIES_CREDENTIALS": False}))
    assert mw.query["credentials"] is False


def test_without_credentials_the_pick_does_not_ask_for_them():
    mw = middleware(EGRESS_PROXIES_CREDENTIALS="False")
    assign(mw, Request("http://www.shop.example.com/x"))
    assert mw.discovery.calls[0][1]["credentials"] is False


@pytest.mark.parametrize("credentials,says,not_says", [
    (True, ["list on proxies", "get on proxies/credentials", "EGRESS_PROXIES_CREDENTIALS = False"], []),
    (False, ["list on proxies"], ["proxies/credentials"]),
])
def test_a_refused_pick_says_what_permission_is_missing(credentials, says, not_says):
    from twisted.python.failure import Failure
    mw = middleware(EGRESS_PROXIES_CREDENTIALS=credentials)
    req = Request("http://shop.example.com/x")
    err = DiscoveryError("GET", "http://h/v1/proxies/pick?domain=shop.example.com", 403, "forbidden")
    with pytest.raises(NoEgressProxy) as e:
        mw._unavailable(Failure(err), req)
    for s in says:
        assert s in str(e.value)
    for s in not_says:
        assert s not in str(e.value)


@pytest.mark.parametrize("settings,retry_after,hinted", [
    ({}, 0, True),
    ({"EGRESS_PROXIES_NAMESPACE": "crawl"}, 0, False),  # a 403 would have said it
    ({}, 30, False),  # a saturated site
])
def test_a_pick_finding_nothing_says_what_a_kubernetes_identity_needs(settings, retry_after, hinted):
    from twisted.python.failure import Failure
    mw = middleware(**settings)
    err = DiscoveryError("GET", "http://h/v1/proxies/pick?domain=shop.example.com", 503, "no healthy proxy matches the request", retry_after)
    with pytest.raises(NoEgressProxy) as e:
        mw._unavailable(Failure(err), Request("http://shop.example.com/x"))
    assert ("get on proxies/credentials" in str(e.value)) == hinted
    assert ("EGRESS_PROXIES_NAMESPACE draws only" in str(e.value)) == hinted


def test_refused_feedback_says_what_permission_is_missing(caplog):
    mw = middleware()
    mw.discovery.fail = DiscoveryError("POST", "http://h/v1/feedback", 403, "forbidden")
    mw._report("crawl/p2", "shop.example.com", "banned")
    mw.flush()
    assert "create on proxies/feedback" in caplog.text


def test_a_request_gets_the_pick_for_its_domain():
    mw = middleware(EGRESS_PROXIES_LABEL_SELECTOR="tier=gold", EGRESS_PROXIES_POOL="shops")
    req = Request("http://www.shop.example.com/page/1")
    assign(mw, req)
    assert req.meta["proxy"] == PROXIES[0]["url"]
    assert req.meta[META] == {"proxy": "crawl/p2", "domain": "www.shop.example.com", "tried": []}
    assert mw.discovery.calls == [("pick", {"label_selector": "tier=gold", "namespace": None, "pool": "shops",
                                           "credentials": True, "domain": "www.shop.example.com"})]


def test_a_spiders_own_proxy_is_left_alone():
    mw = middleware()
    req = Request("http://shop.example.com/", meta={"proxy": "http://mine:3128"})
    assert mw.process_request(req, None) is None
    assert req.meta["proxy"] == "http://mine:3128" and mw.discovery.calls == []
    assert mw.process_response(req, respond(req, 403), None).status == 403
    assert mw._pending == []


def test_a_ban_is_reported_and_retried_through_other_proxies():
    mw = middleware()
    req = Request("http://shop.example.com/page/1")
    assign(mw, req)
    retry = mw.process_response(req, respond(req, 403), None)
    assert isinstance(retry, Request) and retry.dont_filter and "proxy" not in retry.meta
    assert retry.meta[META]["tried"] == ["crawl/p2"]
    assign(mw, retry)
    assert mw.discovery.calls[-1] == ("pick", dict(mw.discovery.calls[0][1], exclude=["crawl/p2"]))
    second = retry.meta[META]["proxy"]
    assert second in ("crawl/p3", "crawl/p4") and retry.meta["proxy"] != PROXIES[0]["url"]

    again = mw.process_response(retry, respond(retry, 403), None)
    assign(mw, again)
    assert again.meta[META]["tried"] == ["crawl/p2", second]
    third = again.meta[META]["proxy"]
    assert third not in ("crawl/p2", second)
    last = mw.process_response(again, respond(again, 403), None)
    assert last.status == 403, "after two retries the site's answer stands"
    assert [r["outcome"] for r in mw._pending] == ["banned"] * 3
    assert [r["proxy"] for r in mw._pending] == ["crawl/p2", second, third]
    assert mw.stats.get_value("egress_proxies/banned") == 3 and mw.stats.get_value("egress_proxies/retries") == 2

    # With every proxy tried there is none left to assign.
    everything = Request("http://shop.example.com/", meta={META: {"proxy": "crawl/p4", "domain": "shop.example.com",
                                                                 "tried": ["crawl/p2", "crawl/p3", "crawl/p4"]}})
    with pytest.raises(NoEgressProxy, match="every proxy for it has been tried"):
        assign(mw, everything)


def test_throttles_oks_and_custom_codes():
    mw = middleware(EGRESS_PROXIES_BAN_CODES=[503], EGRESS_PROXIES_THROTTLE_CODES=["429", "420"], EGRESS_PROXIES_MAX_BAN_RETRIES=0)
    req = Request("http://shop.example.com/")
    assign(mw, req)
    assert mw.process_response(req, respond(req, 429, {"Retry-After": "7"}), None).status == 429
    assert mw.process_response(req, respond(req, 420), None).status == 420
    assert mw.process_response(req, respond(req, 200), None).status == 200
    assert mw.process_response(req, respond(req, 403), None).status == 403
    assert mw.process_response(req, respond(req, 503), None).status == 503
    assert mw._pending == [
        {"proxy": "crawl/p2", "domain": "shop.example.com", "outcome": "throttled", "retryAfterSeconds": 7.0},
        {"proxy": "crawl/p2", "domain": "shop.example.com", "outcome": "throttled"},
        {"proxy": "crawl/p2", "domain": "shop.example.com", "outcome": "ok"},
        {"proxy": "crawl/p2", "domain": "shop.example.com", "outcome": "banned"},
    ]
    quiet = middleware(EGRESS_PROXIES_REPORT_OK=False)
    req = Request("http://shop.example.com/")
    assign(quiet, req)
    quiet.process_response(req, respond(req, 200), None)
    assert quiet._pending == [] and quiet.stats.get_value("egress_proxies/ok") == 1


def test_hosts_that_are_no_site_are_picked_by_key_and_not_reported():
    mw = middleware()
    for url in ("http://10.1.2.3/", "http://localhost:8080/", "http://[::1]/"):
        req = Request(url)
        assign(mw, req)
        assert "key" in mw.discovery.calls[-1][1] and "domain" not in mw.discovery.calls[-1][1]
        assert mw.process_response(req, respond(req, 403), None).status == 403
    assert mw._pending == []


def test_flush_counts_what_the_api_took():
    mw = middleware()
    mw._report("crawl/p2", "shop.example.com", "ok")
    mw._report("crawl/p3", "shop.example.com", "banned")
    mw.flush()
    assert len(mw.discovery.sent) == 2 and mw._pending == []
    assert mw.stats.get_value("egress_proxies/reported") == 1 and mw.stats.get_value("egress_proxies/rejected") == 1
    mw.flush()  # nothing waiting: no request
    assert len(mw.discovery.sent) == 2
    mw.discovery.fail = DiscoveryError("POST", "http://h/v1/feedback", 503, "shutting down")
    mw._report("crawl/p2", "shop.example.com", "ok")
    mw.flush()
    assert mw.stats.get_value("egress_proxies/feedback_errors") == 1 and mw.stats.get_value("egress_proxies/rejected") == 2


def test_an_unavailable_api_drops_the_request_with_a_clear_reason():
    from twisted.python.failure import Failure
    mw = middleware()
    req = Request("http://shop.example.com/x")
    err = DiscoveryError("GET", "http://h/v1/proxies/pick?domain=shop.example.com", 503, "site example.com is saturated", 30)
    with pytest.raises(NoEgressProxy, match=r"no egress proxy for http://shop.example.com/x: discovery GET .* 503 site example.com is saturated \(retry after 30s\)"):
        mw._unavailable(Failure(err), req)
    assert mw.stats.get_value("egress_proxies/unavailable") == 1


@pytest.mark.parametrize("memory,expect_other", [(None, True), (0, False)])
def test_a_banned_proxy_is_avoided_for_its_host_until_discovery_knows(memory, expect_other):
    mw = middleware() if memory is None else middleware(EGRESS_PROXIES_BAN_MEMORY=memory)
    req = Request("http://shop.example.com/1")
    assign(mw, req)
    assert req.meta[META]["proxy"] == "crawl/p2"
    mw.process_response(req, respond(req, 403), None)
    # The discovery API still picks p2 (the report has not reached it yet).
    nxt = Request("http://shop.example.com/2")
    assign(mw, nxt)
    assert (nxt.meta[META]["proxy"] != "crawl/p2") == expect_other
    # Another host is not affected, and the list is asked only when needed.
    other = Request("http://news.example.org/1")
    assign(mw, other)
    assert other.meta[META]["proxy"] == "crawl/p2" and mw.discovery.calls[-1][0] == "pick"


def test_an_api_older_than_exclude_gets_a_listed_proxy_not_tried():
    mw = middleware()
    mw.discovery.knows_exclude = False
    req = Request("http://shop.example.com/page/1")
    assign(mw, req)
    retry = mw.process_response(req, respond(req, 403), None)
    assign(mw, retry)
    assert [c[0] for c in mw.discovery.calls] == ["pick", "pick", "list"]
    assert retry.meta[META]["proxy"] in ("crawl/p3", "crawl/p4")
    again = mw.process_response(retry, respond(retry, 403), None)
    assign(mw, again)
    assert [c[0] for c in mw.discovery.calls][3:] == ["list"], "exclude= is not asked again once refused"
    assert len({"crawl/p2", retry.meta[META]["proxy"], again.meta[META]["proxy"]}) == 3


# Connection failures of the proxy itself, each as Scrapy 2.8 raises it for an http:// URL.
def _proxy_failures():
    from twisted.internet import error
    from twisted.python.failure import Failure
    from twisted.web._newclient import ResponseNeverReceived
    return [error.ConnectionRefusedError("Connection refused"), error.TCPTimedOutError(), error.DNSLookupError("proxy.invalid"),
            ResponseNeverReceived([Failure(error.ConnectionLost())]), error.ConnectionLost(), error.ConnectionDone()]


@pytest.mark.parametrize("exc", _proxy_failures(), ids=lambda e: type(e).__name__)
def test_a_proxy_that_does_not_answer_is_reported_and_the_request_goes_through_another(exc):
    mw = middleware()
    req = Request("http://shop.example.com/page/1")
    assign(mw, req)
    retry = mw.process_exception(req, exc, None)
    assert isinstance(retry, Request) and retry.dont_filter and "proxy" not in retry.meta
    assert retry.meta[META] == {"proxy": "crawl/p2", "domain": "shop.example.com", "tried": ["crawl/p2"], "failures": 1}
    assert mw._pending == [{"proxy": "crawl/p2", "outcome": "unreachable"}]
    assert mw.stats.get_value("egress_proxies/unreachable") == 1 and mw.stats.get_value("egress_proxies/proxy_retries") == 1
    assign(mw, retry)
    assert mw.discovery.calls[-1][1]["exclude"] == ["crawl/p2"] and mw.discovery.calls[-1][1]["domain"] == "shop.example.com"
    assert retry.meta[META]["proxy"] == "crawl/p3"
    # Until discovery knows, the dead proxy is avoided for every host.
    other = Request("http://news.example.org/1")
    assign(mw, other)
    assert other.meta[META]["proxy"] == "crawl/p3" and mw.discovery.calls[-1][1]["exclude"] == ["crawl/p2"]
    # An answer after a failure: a ban counts only the proxies that answered.
    banned = mw.process_response(retry, respond(retry, 403), None)
    assert banned.meta[META]["tried"] == ["crawl/p2", "crawl/p3"] and banned.meta[META]["failures"] == 1


def test_every_proxy_dead_fails_naming_each_one_tried():
    from twisted.internet import error
    from egress_proxies import EgressProxyUnreachable
    mw = middleware()
    req = Request("http://shop.example.com/page/1")
    assign(mw, req)
    seen = []
    for _ in range(2):
        seen.append(req.meta[META]["proxy"])
        req = mw.process_exception(req, error.ConnectionRefusedError(), None)
        assign(mw, req)
    seen.append(req.meta[META]["proxy"])
    assert seen == ["crawl/p2", "crawl/p3", "crawl/p4"]
    cause = error.TCPTimedOutError()
    with pytest.raises(EgressProxyUnreachable, match=r"http://shop.example.com/page/1: no egress proxy answered; "
                       r"tried crawl/p2, crawl/p3, crawl/p4 \(the last: TCPTimedOutError") as e:
        mw.process_exception(req, cause, None)
    assert e.value.__cause__ is cause
    assert mw.stats.get_value("egress_proxies/unreachable") == 3 and mw.stats.get_value("egress_proxies/proxy_retries") == 2

    # EGRESS_PROXIES_MAX_PROXY_RETRIES bounds the proxies tried; 0 leaves the failure to
    # Scrapy (its RetryMiddleware), reported all the same.
    one = middleware(EGRESS_PROXIES_MAX_PROXY_RETRIES=1)
    req = Request("http://shop.example.com/x")
    assign(one, req)
    req = one.process_exception(req, error.ConnectionRefusedError(), None)
    assign(one, req)
    with pytest.raises(EgressProxyUnreachable, match="tried crawl/p2, crawl/p3 "):
        one.process_exception(req, error.ConnectionRefusedError(), None)
    none = middleware(EGRESS_PROXIES_MAX_PROXY_RETRIES=0)
    req = Request("http://shop.example.com/x")
    assign(none, req)
    assert none.process_exception(req, error.ConnectionRefusedError(), None) is None
    assert none._pending == [{"proxy": "crawl/p2", "outcome": "unreachable"}]

    # With every proxy tried and none left, the pick leaves nothing: NoEgressProxy names them.
    left = middleware(EGRESS_PROXIES_MAX_PROXY_RETRIES=5)
    req = Request("http://shop.example.com/y")
    assign(left, req)
    for _ in range(2):
        req = left.process_exception(req, error.ConnectionRefusedError(), None)
        assign(left, req)
    req = left.process_exception(req, error.ConnectionRefusedError(), None)
    with pytest.raises(NoEgressProxy, match="every proxy for it has been tried .crawl/p2, crawl/p3, crawl/p4"):
        assign(left, req)


def test_failures_behind_a_proxy_that_answered_are_the_sites():
    from scrapy.core.downloader.handlers.http11 import TunnelError
    from twisted.internet import error
    from twisted.python.failure import Failure
    from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
    mw = middleware()
    # A download timeout cannot tell a silent proxy from a slow site; an https:// URL's
    # connection lost may be the site's, inside the tunnel; a body cut short is the site's.
    for url, exc in [("http://shop.example.com/", error.TimeoutError("Getting it took longer than 180.0 seconds.")),
                     ("https://shop.example.com/", ResponseNeverReceived([Failure(error.ConnectionLost())])),
                     ("https://shop.example.com/", error.ConnectionLost()),
                     ("http://shop.example.com/", ResponseFailed([Failure(error.ConnectionLost())])),
                     ("http://shop.example.com/", ValueError("anything else"))]:
        req = Request(url)
        assign(mw, req)
        assert mw.process_exception(req, exc, None) is None, (url, exc)
    # A spider's own proxy is left alone.
    own = Request("http://shop.example.com/", meta={"proxy": "http://mine:3128"})
    assert mw.process_exception(own, error.ConnectionRefusedError(), None) is None
    assert mw._pending == [] and mw.stats.get_value("egress_proxies/unreachable") is None
    # A CONNECT the proxy refused: it answered, so no report, but another proxy is tried.
    req = Request("https://shop.example.com/")
    assign(mw, req)
    retry = mw.process_exception(req, TunnelError("Could not open CONNECT tunnel with proxy 127.0.0.1:3002 [{'status': 502}]"), None)
    assert retry.meta[META]["tried"] == ["crawl/p2"] and mw._pending == []
    assert mw.stats.get_value("egress_proxies/proxy_retries") == 1


# The keys are the Go client's own for the same Spread (pkg/client's TestSpreadKeys holds
# the same table), so Go and Scrapy crawlers of a site spread it the same way.
@pytest.mark.parametrize("spread,worker,key", [
    ("site", "", None),
    ("request", "", "example.com#u1dc0no963r6su"),
    (4, "", "example.com#3"),
    ("7", "", "example.com#1"),
    (None, "w-1", "example.com@w-1"),
    (3, "w-1", "example.com@w-1#1"),
])
def test_spread_keys_a_site_by_a_spread_index_and_keeps_the_domain(spread, worker, key):
    settings = {"EGRESS_PROXIES_SPREAD_WORKER": worker}
    if spread is not None:
        settings["EGRESS_PROXIES_SPREAD"] = spread
    mw = middleware(**settings)
    req = Request("http://shop.example.com:8080/page/1?q=1")
    assign(mw, req)
    q = mw.discovery.calls[-1][1]
    assert q["domain"] == "shop.example.com" and q.get("key") == key


def test_a_site_stays_on_one_proxy_unless_spread():
    def proxies_for(**settings):
        mw = middleware(**settings)
        # The fake API's pick by key: a key's own choice among the three.
        mw.discovery.pick = lambda **q: PROXIES[int(hashlib.sha256((q.get("key") or q["domain"]).encode()).hexdigest(), 16) % 3]
        seen = set()
        for i in range(30):
            req = Request(f"http://shop.example.com/page/{i}")
            assign(mw, req)
            seen.add(req.meta[META]["proxy"])
        return seen
    assert len(proxies_for()) == 1
    assert len(proxies_for(EGRESS_PROXIES_SPREAD="request")) >= 2
    assert len(proxies_for(EGRESS_PROXIES_SPREAD=4)) >= 2


@pytest.mark.parametrize("bad", ["worker", "0", "-2", "many", "1.5"])
def test_a_bad_spread_is_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match=f"EGRESS_PROXIES_SPREAD '{bad}': want site, request or a number of keys per site"):
        middleware(EGRESS_PROXIES_SPREAD=bad)


@pytest.mark.parametrize("knows_exclude", [True, False])
def test_with_every_proxy_avoided_a_new_request_still_gets_the_pick(knows_exclude):
    from twisted.internet import error
    mw = middleware()
    mw.discovery.knows_exclude = knows_exclude
    for p in ("crawl/p2", "crawl/p3", "crawl/p4"):
        mw._remember("\0any", p, 30)
    req = Request("http://shop.example.com/1")
    assign(mw, req)
    assert req.meta[META]["proxy"] == "crawl/p2", "the pick stands when the memory leaves none"
    # A retry gets none, and says so; the API failing on a retry is its own error.
    retry = mw.process_exception(req, error.ConnectionRefusedError(), None)
    with pytest.raises(NoEgressProxy, match="every proxy for it has been tried"):
        assign(mw, retry)
    if knows_exclude:
        mw.discovery.fail_pick = DiscoveryError("GET", "http://h/v1/proxies/pick", 403, "forbidden")
        with pytest.raises(DiscoveryError, match="403 forbidden"):
            assign(mw, retry)


def test_exclude_carries_at_most_100_proxies_the_requests_own_first():
    from twisted.internet import error
    mw = middleware()
    for i in range(150):
        mw._remember("\0any", f"crawl/gone-{i}", 30)
    req = Request("http://shop.example.com/1")
    assign(mw, req)
    retry = mw.process_exception(req, error.ConnectionRefusedError(), None)
    assign(mw, retry)
    exclude = mw.discovery.calls[-1][1]["exclude"]
    assert len(exclude) == 100 and exclude[0] == "crawl/p2" and exclude.count("crawl/p2") == 1
