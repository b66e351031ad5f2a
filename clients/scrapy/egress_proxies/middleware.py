"""A Scrapy downloader middleware that sends each request through a proxy the
egress-proxies-operator's discovery API picks for the request's host, reports what the
site answered, and sends a banned request again through another proxy; a proxy that
does not answer is reported unreachable and the request goes through another one.

Enable it ahead of Scrapy's HttpProxyMiddleware (750), which turns the credentials in
the picked URL into Proxy-Authorization::

    DOWNLOADER_MIDDLEWARES = {"egress_proxies.middleware.EgressProxiesMiddleware": 740}
    EGRESS_PROXIES_URL = "http://proxy-operator:8082"
    EGRESS_PROXIES_TOKEN = "..."      # or EGRESS_PROXIES_TOKEN_FILE, read again when it changes
"""

import hashlib
import logging
import threading
import time
from urllib.parse import urlsplit

from scrapy import signals
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import IgnoreRequest, NotConfigured
from tldextract import TLDExtract
from twisted.internet import error, task
from twisted.internet.threads import deferToThread
from twisted.web._newclient import ResponseNeverReceived

from .discovery import Discovery, DiscoveryError, TokenFileError, retry_after_seconds
from .gateway import (HEADER_EGRESS_PROXY, GatewayOptionError, gateway_proxy_url, gateway_username, parse_gateway_url,
                      parse_sesstime)
from .handler import EXIT_META

logger = logging.getLogger(__name__)

# request.meta key: {"proxy": ns/name, "domain": host, "tried": [...]}, and "failures": how
# many of the proxies tried did not answer, on a request sent again after one did not.
META = "egress_proxies"
STATS = "egress_proxies/"
# In the middleware's memory of proxies to avoid: those avoided for every host (the ones
# that did not answer).
ANY_HOST = "\0any"
# request.meta key of gateway mode: the session of one request ("" or None: none),
# replacing EGRESS_PROXIES_GATEWAY_SESSION.
SESSION_META = "egress_proxies_session"
# Where each gateway option is given, for the errors naming it.
_GATEWAY_SETTINGS = {"user": "EGRESS_PROXIES_GATEWAY_USER", "ns": "EGRESS_PROXIES_NAMESPACE",
                     "pool": "EGRESS_PROXIES_POOL", "session": "EGRESS_PROXIES_GATEWAY_SESSION",
                     "sesstime": "EGRESS_PROXIES_GATEWAY_SESSTIME", "strict": "EGRESS_PROXIES_GATEWAY_STRICT",
                     "ip": "EGRESS_PROXIES_GATEWAY_IP"}


class NoEgressProxy(IgnoreRequest):
    """No proxy could be had for a request: the site is saturated (too many proxies
    cooling for it), no healthy proxy matches, or the API could not be reached."""


class EgressProxyUnreachable(Exception):
    """The proxies a request was sent through did not answer, EGRESS_PROXIES_MAX_PROXY_RETRIES
    + 1 of them or every one there was: the message names the URL and each proxy tried;
    the last connection failure is its __cause__."""


def _fnv1a(text, bits):
    """FNV-1a of text's UTF-8 bytes, 32 or 64 bits, as the Go client hashes a spread key."""
    h, prime, mask = (0x811C9DC5, 0x01000193, 0xFFFFFFFF) if bits == 32 else \
        (0xCBF29CE484222325, 0x100000001B3, 0xFFFFFFFFFFFFFFFF)
    for b in text.encode():
        h = ((h ^ b) * prime) & mask
    return h


def _base36(n):
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if not n:
            return digits


def parse_spread(value):
    """EGRESS_PROXIES_SPREAD as (keys, per_request): "site" (or empty) is (1, False),
    "request" (0, True), a whole number n >= 1 (n, False). Anything else is a ValueError
    naming the setting."""
    text = str(value if value is not None else "").strip().lower()
    if text in ("", "site"):
        return 1, False
    if text == "request":
        return 0, True
    try:
        keys = int(text)
    except ValueError:
        keys = 0
    if keys < 1:
        raise ValueError(f"EGRESS_PROXIES_SPREAD {value!r}: want site, request or a number of keys per site (1 or more)")
    return keys, False


def spread_key(url, site, keys=1, per_request=False, worker=""):
    """The pick key of a request for url on site, as the Go client's Spread derives it:
    "<site>#<i>" with i a hash of the path and query modulo keys, "<site>#u<hash of the
    URL>" per request, "@<worker>" after the site with a worker; "" for the site alone
    (domain= is then the key)."""
    k = site + ("@" + worker if worker else "")
    parts = urlsplit(url)
    uri = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    if per_request:
        host = parts.netloc.rpartition("@")[2]
        return f"{k}#u{_base36(_fnv1a(f'{parts.scheme}://{host}{uri}', 64))}"
    if keys > 1:
        return f"{k}#{_fnv1a(uri, 32) % keys}"
    return k if worker else ""


def _proxy_failure(request, exception):
    """Whether a download's failure is its proxy's: "unreachable" when the proxy did not
    answer (the connection to it refused, timed out at TCP level, its name unknown, or,
    for an http:// URL, which the proxy fetches itself, lost before any answer),
    "connect-refused" when it answered a CONNECT with another status than 200 (a
    TunnelError), None otherwise: a failure behind a proxy that answered, or a download
    timeout, which cannot tell a silent proxy from a slow site."""
    if isinstance(exception, TunnelError):
        return "connect-refused"
    if isinstance(exception, error.TimeoutError):  # DOWNLOAD_TIMEOUT, a ConnectError too
        return None
    if isinstance(exception, (error.ConnectError, error.DNSLookupError)):
        return "unreachable"
    if isinstance(exception, (ResponseNeverReceived, error.ConnectionLost, error.ConnectionDone)) \
            and urlsplit(request.url).scheme == "http":
        return "unreachable"
    return None


# The public suffix list, ICANN's and the private one (s3.amazonaws.com, github.io), as
# the discovery API and the Go client read it: the copy bundled with tldextract (a
# dependency of Scrapy), never fetched.
_split_host = TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True)

# The most proxies a pick's exclude= takes: those the request tried come first, then as
# many of those the middleware avoids for its host as fit.
MAX_EXCLUDE = 100

# The middleware's own ban memory is swept of every host's expired entries once per so
# many look-ups and additions, or as many as hosts held when more.
MIN_SWEEP_OPS = 256


def _is_site(host):
    """Whether host names a site for feedback and ?domain=: a name under a public suffix,
    not an IP address, nor a public suffix itself (s3.amazonaws.com, myshopify.com,
    co.uk), which the API refuses as a domain; such hosts are picked by key, as the Go
    client does."""
    if not host or ":" in host or host.replace(".", "").isdigit():
        return False
    return bool(_split_host(host).registered_domain)


class EgressProxiesMiddleware:
    """Settings (all but the URL optional):

    EGRESS_PROXIES_URL             the discovery API's base URL (required)
    EGRESS_PROXIES_TOKEN           the discovery token; or EGRESS_PROXIES_TOKEN_FILE, a file holding it
                                   (a projected ServiceAccount token), read again when it changes
    EGRESS_PROXIES_CREDENTIALS     ask for the proxies' URLs with their credentials (default: True
                                   with a token); a Kubernetes identity needs the credentials role
    EGRESS_PROXIES_CA_FILE         CA bundle for an https:// API
    EGRESS_PROXIES_LABEL_SELECTOR, EGRESS_PROXIES_NAMESPACE, EGRESS_PROXIES_POOL
                                   filters for the proxies picked
    EGRESS_PROXIES_BAN_CODES       statuses reported as banned (default [403])
    EGRESS_PROXIES_THROTTLE_CODES  statuses reported as throttled, with Retry-After (seconds or an
                                   HTTP date; more than a day, "inf" too, is sent as a day) (default [429])
    EGRESS_PROXIES_MAX_BAN_RETRIES how many other proxies a banned request goes through (default 2)
    EGRESS_PROXIES_BAN_MEMORY      seconds the middleware itself avoids a proxy for a host that
                                   banned it, until discovery leaves it out (default 30)
    EGRESS_PROXIES_MAX_PROXY_RETRIES  how many other proxies a request goes through when its
                                   proxy did not answer (default 2; 0: none, the failure is still
                                   reported and goes on to Scrapy's own RetryMiddleware)
    EGRESS_PROXIES_UNREACHABLE_MEMORY seconds the middleware avoids, for every host, a proxy that
                                   did not answer, until discovery leaves it out (default 10)
    EGRESS_PROXIES_SPREAD          site (default: a whole site through one proxy), request (each
                                   page its own key) or a number of keys per site
    EGRESS_PROXIES_SPREAD_WORKER   this crawler's name: joins the key, a proxy per site and worker
    EGRESS_PROXIES_REPORT_OK       report 2xx answers as ok (default True)
    EGRESS_PROXIES_FLUSH_INTERVAL  seconds between feedback batches (default 1.0)
    EGRESS_PROXIES_FEEDBACK_ATTEMPTS  attempts per feedback batch (default 5)

    Gateway mode (EGRESS_PROXIES_GATEWAY_URL set): every request goes through the gateway
    with its options in the proxy user name (EGRESS_PROXIES_GATEWAY_USER, _NAMESPACE,
    _POOL, EGRESS_PROXIES_GATEWAY_SESSION or meta["egress_proxies_session"],
    EGRESS_PROXIES_GATEWAY_SESSTIME, _STRICT, _IP) and the token as its password; answers
    are reported by the exit the gateway names (X-Egress-Proxy; for https through
    egress_proxies.handler.GatewayDownloadHandler).
    """

    def __init__(self, crawler, discovery):
        s = crawler.settings
        self.crawler = crawler
        self.stats = crawler.stats
        self.discovery = discovery
        self.authenticated = discovery.has_token
        self.query = {"label_selector": s.get("EGRESS_PROXIES_LABEL_SELECTOR"),
                      "namespace": s.get("EGRESS_PROXIES_NAMESPACE"), "pool": s.get("EGRESS_PROXIES_POOL"),
                      "credentials": s.getbool("EGRESS_PROXIES_CREDENTIALS", discovery.has_token)}
        self.ban_codes = {int(c) for c in s.getlist("EGRESS_PROXIES_BAN_CODES", [403])}
        self.throttle_codes = {int(c) for c in s.getlist("EGRESS_PROXIES_THROTTLE_CODES", [429])}
        self.max_ban_retries = s.getint("EGRESS_PROXIES_MAX_BAN_RETRIES", 2)
        self.report_ok = s.getbool("EGRESS_PROXIES_REPORT_OK", True)
        self.flush_interval = s.getfloat("EGRESS_PROXIES_FLUSH_INTERVAL", 1.0)
        self.ban_memory = s.getfloat("EGRESS_PROXIES_BAN_MEMORY", 30.0)
        self.max_proxy_retries = max(0, s.getint("EGRESS_PROXIES_MAX_PROXY_RETRIES", 2))
        self.unreachable_memory = s.getfloat("EGRESS_PROXIES_UNREACHABLE_MEMORY", 10.0)
        self.spread_keys, self.spread_per_request = parse_spread(s.get("EGRESS_PROXIES_SPREAD"))
        self.spread_worker = s.get("EGRESS_PROXIES_SPREAD_WORKER") or ""
        # Set once discovery refused exclude= (a server older than it): another proxy is
        # then chosen from the list here.
        self._no_exclude = False
        self._recent = {}  # host -> {proxy: monotonic deadline}
        self._recent_ops = 0  # look-ups and additions since the last sweep of _recent
        self._lock = threading.Lock()
        self._pending = []
        self._loop = None
        # Gateway mode: every request goes through the gateway, its options in the proxy
        # user name (checked here, as the gateway checks them).
        self.gateway = None
        if s.get("EGRESS_PROXIES_GATEWAY_URL"):
            self.gateway = parse_gateway_url(s.get("EGRESS_PROXIES_GATEWAY_URL"))
            if not discovery.has_token:
                raise ValueError("EGRESS_PROXIES_GATEWAY_URL: gateway mode needs EGRESS_PROXIES_TOKEN or "
                                 "EGRESS_PROXIES_TOKEN_FILE, the gateway's proxy password")
            ip = s.get("EGRESS_PROXIES_GATEWAY_IP") or 0
            self.gateway_options = {
                "user": s.get("EGRESS_PROXIES_GATEWAY_USER") or "", "namespace": self.query["namespace"] or "",
                "pool": self.query["pool"] or "", "session": s.get("EGRESS_PROXIES_GATEWAY_SESSION") or "",
                "sesstime": parse_sesstime(s.get("EGRESS_PROXIES_GATEWAY_SESSTIME")),
                "strict": s.getbool("EGRESS_PROXIES_GATEWAY_STRICT", False),
                "ip": int(ip) if str(ip) in ("4", "6") else ip}
            # Checked as a request with a session would send them: sesstime and strict
            # apply only to requests that have one.
            gateway_username(**dict(self.gateway_options, session=self.gateway_options["session"] or "s"),
                             where=_GATEWAY_SETTINGS)

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        url = s.get("EGRESS_PROXIES_URL")
        if not url:
            raise NotConfigured("EGRESS_PROXIES_URL is not set")
        token = s.get("EGRESS_PROXIES_TOKEN") or ""
        token_file = None if token else s.get("EGRESS_PROXIES_TOKEN_FILE")
        try:
            discovery = Discovery(url, token, ca_file=s.get("EGRESS_PROXIES_CA_FILE"), token_file=token_file,
                                  feedback_attempts=s.getint("EGRESS_PROXIES_FEEDBACK_ATTEMPTS", 5))
        except TokenFileError as e:
            raise ValueError(f"EGRESS_PROXIES_TOKEN_FILE: {e}") from None
        except ValueError as e:
            raise ValueError(f"EGRESS_PROXIES_URL: {e}") from None
        mw = cls(crawler, discovery)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # Feedback: queued by the reactor thread, sent from a worker thread.

    def spider_opened(self, spider):
        self._loop = task.LoopingCall(self._flush_in_thread)
        self._loop.start(self.flush_interval, now=False)

    def spider_closed(self, spider):
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return self._flush_in_thread()  # Scrapy waits for the last batch

    def _report(self, proxy, domain, outcome, retry_after=0.0):
        r = {"proxy": proxy, "domain": domain, "outcome": outcome} if domain else {"proxy": proxy, "outcome": outcome}
        if outcome == "throttled" and retry_after > 0:
            r["retryAfterSeconds"] = retry_after
        with self._lock:
            self._pending.append(r)

    def _flush_in_thread(self):
        return deferToThread(self.flush)

    def _flush_soon(self):
        """Sends the waiting reports now, not at the next interval: a proxy that does not
        answer is news for every crawler."""
        if self._loop is not None and self._loop.running:
            self._flush_in_thread()

    def flush(self):
        """Sends the waiting reports (blocking); failures are logged and counted."""
        with self._lock:
            batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            accepted, rejected = self.discovery.feedback(batch)
        except DiscoveryError as e:
            self.stats.inc_value(STATS + "feedback_errors")
            self.stats.inc_value(STATS + "rejected", len(batch))
            logger.error("egress proxies: sending %d reports: %s%s", len(batch), e, self._access_hint(e, feedback=True))
            return
        self.stats.inc_value(STATS + "reported", accepted)
        if rejected:
            self.stats.inc_value(STATS + "rejected", len(rejected))
            for r in rejected:
                logger.warning("egress proxies: report %d for proxy %s rejected: %s", r["index"], r.get("proxy"), r.get("error"))

    def _access_hint(self, e, feedback=False):
        """What a 403, or a pick finding nothing, can mean for a Kubernetes identity: the
        permission these settings need."""
        credentials = self.query["credentials"]
        if e.status == 403 and feedback:
            return " (feedback needs create on proxies/feedback in each proxy's namespace: the crawler ClusterRole)"
        if e.status == 403:
            hint = " (picking needs list on proxies in the namespace: the crawler ClusterRole"
        elif e.status == 503 and not e.retry_after and not feedback and self.authenticated and not self.query["namespace"]:
            # Without a namespace the API answers from the namespaces the caller may use.
            hint = (" (with a Kubernetes identity, a pick without EGRESS_PROXIES_NAMESPACE draws only on the"
                    " namespaces where it may list proxies: the crawler ClusterRole")
        else:
            return ""
        if credentials:
            hint += ("; EGRESS_PROXIES_CREDENTIALS, the default with a token, also needs get on proxies/credentials:"
                     " the credentials ClusterRole, or set EGRESS_PROXIES_CREDENTIALS = False for proxies without basic auth")
        return hint + ")"

    # Requests.

    def process_request(self, request, spider):
        if self.gateway is not None:
            return self._through_gateway(request)
        plan = self._plan(request)
        if plan is None:
            return None
        host, domain, tried = plan
        d = deferToThread(self._choose, host, domain, tried, self._key(request.url, domain))
        d.addCallback(self._assign, request, tried)
        d.addErrback(self._unavailable, request)
        return d

    @staticmethod
    def _plan(request):
        """(host, domain, proxies tried) for a request to send through a picked proxy, or
        None for a request with a proxy its spider chose."""
        state = request.meta.get(META)
        if state is None and request.meta.get("proxy"):
            return None
        host = (urlsplit(request.url).hostname or "").lower()
        domain = host if _is_site(host) else ""
        return host, domain, list(state["tried"]) if state else []

    def _key(self, url, domain):
        """The pick key EGRESS_PROXIES_SPREAD gives a request for domain; "": the site's."""
        if not domain:
            return ""
        return spread_key(url, _split_host(domain).registered_domain, self.spread_keys,
                          self.spread_per_request, self.spread_worker)

    def _choose(self, host, domain, tried, key=""):
        """(proxy, domain) for the request (blocking): the pick for its domain (or host),
        or, on a retry, the pick leaving out every proxy it has been sent through
        (exclude=). A domain the API refuses (its public suffix list knows a suffix this
        one does not) is picked by key instead, and domain is then "": no reports."""
        try:
            return self._choose_for(host, domain, tried, key), domain
        except DiscoveryError as e:
            if not domain or e.status != 400 or e.parameter != "domain":
                raise
            logger.debug("egress proxies: the API takes no domain %s (%s); picking by key", domain, e.message)
            return self._choose_for(host, "", tried, ""), ""

    def _choose_for(self, host, domain, tried, key=""):
        q = dict(self.query)
        if domain:
            q["domain"] = domain
            if key:
                q["key"] = key
        else:
            q["key"] = host
        avoid = list(dict.fromkeys(tried + self._avoided(domain)))
        if not avoid:
            return self.discovery.pick(**q)
        try:
            chosen = self._next(q, host, avoid)
        except DiscoveryError as e:
            if tried and (e.status != 503 or e.retry_after):
                raise  # the API's own failure, or a saturated site: NoEgressProxy says so
            chosen = None  # none left
        if chosen is not None or tried:
            return chosen  # None: every proxy has been tried
        # every proxy avoided here lately, and discovery does not know yet: its pick
        return self.discovery.pick(**q)

    def _next(self, q, host, avoid):
        """The pick leaving out avoid (exclude=), the next proxy in the pick's own order; from
        an API older than exclude=, a listed proxy not in avoid, in an order of the host's
        own (None when none is left)."""
        if not self._no_exclude:
            try:
                return self.discovery.pick(exclude=avoid[:MAX_EXCLUDE], **q)
            except DiscoveryError as e:
                if e.status != 400 or e.parameter != "exclude":
                    raise
                self._no_exclude = True
        ref = lambda p: f"{p['namespace']}/{p['name']}"  # noqa: E731
        rank = lambda p: hashlib.sha256(f"{host}\0{ref(p)}".encode()).digest()  # noqa: E731
        for p in sorted(self.discovery.list(**q), key=rank, reverse=True):
            if ref(p) not in avoid:
                return p
        return None

    def _remember(self, host, ref, seconds=None):
        now = time.monotonic()
        with self._lock:
            self._recent.setdefault(host, {})[ref] = now + (self.ban_memory if seconds is None else seconds)
            self._sweep_locked(now)

    def _sweep_locked(self, now):
        """Forgets the expired entries of every host once enough look-ups and additions
        have passed, so that hosts not asked again are not kept for the crawl's life."""
        self._recent_ops += 1
        if self._recent_ops < max(MIN_SWEEP_OPS, len(self._recent)):
            return
        self._recent_ops = 0
        for host in list(self._recent):
            refs = self._recent[host]
            for ref in [r for r, until in refs.items() if until <= now]:
                del refs[ref]
            if not refs:
                del self._recent[host]

    def _avoided(self, host):
        """The proxies host banned within EGRESS_PROXIES_BAN_MEMORY, and those that did not
        answer within EGRESS_PROXIES_UNREACHABLE_MEMORY."""
        now = time.monotonic()
        avoided = []
        with self._lock:
            for h in (host, ANY_HOST):
                recent = self._recent.get(h) if h else None
                if recent is None:
                    continue
                for ref in [r for r, until in recent.items() if until <= now]:
                    del recent[ref]
                if not recent:
                    self._recent.pop(h, None)
                avoided.extend(recent)
            self._sweep_locked(now)
            return avoided

    def _assign(self, chosen, request, tried):
        proxy, domain = chosen
        if proxy is None:
            raise NoEgressProxy(f"{request.url}: every proxy for it has been tried ({', '.join(tried)})")
        ref = f"{proxy['namespace']}/{proxy['name']}"
        failures = (request.meta.get(META) or {}).get("failures")
        request.meta["proxy"] = proxy["url"]
        request.meta[META] = {"proxy": ref, "domain": domain, "tried": tried}
        if failures:
            request.meta[META]["failures"] = failures
        self.stats.inc_value(STATS + "picks")
        return None

    def _unavailable(self, failure, request):
        if failure.check(NoEgressProxy):
            return failure
        e = failure.value
        if isinstance(e, DiscoveryError):
            self.stats.inc_value(STATS + "unavailable")
            raise NoEgressProxy(f"no egress proxy for {request.url}: {e}{self._access_hint(e)}")
        return failure

    # Gateway mode.

    def _through_gateway(self, request):
        """Sets meta["proxy"] to the gateway, with the options (the request's session from
        meta["egress_proxies_session"] when it has that key) in the user name and the
        token as the password. A request with a proxy its spider chose is left alone."""
        state = request.meta.get(META)
        if state is None and request.meta.get("proxy"):
            return None
        opts = dict(self.gateway_options)
        where = _GATEWAY_SETTINGS
        if SESSION_META in request.meta:
            opts["session"] = request.meta[SESSION_META] or ""
            where = dict(where, session=f"meta[{SESSION_META!r}]")
        if not opts["session"]:
            opts["sesstime"], opts["strict"] = 0, False  # a session's own options
        try:
            user = gateway_username(**opts, where=where)
        except GatewayOptionError as e:
            raise IgnoreRequest(f"{request.url}: {e}") from None
        token = self.discovery.bearer()
        request.meta.pop(EXIT_META, None)  # an earlier download's (a retry's, a redirect's)
        host = (urlsplit(request.url).hostname or "").lower()
        request.meta["proxy"] = gateway_proxy_url(*self.gateway, user, token)
        request.meta[META] = {"gateway": True, "domain": host if _is_site(host) else ""}
        self.stats.inc_value(STATS + "gateway_requests")
        return None

    def _gateway_response(self, request, response, state):
        """Reports the site's answer by the exit that carried it: X-Egress-Proxy of a
        plain-HTTP answer, which the gateway sets, or for https the tunnel's, which
        GatewayDownloadHandler keeps (meta["egress_proxies_exit"]); without that handler
        an https answer names no exit and is not reported."""
        https = urlsplit(request.url).scheme == "https"
        if https:
            exit_ = (request.meta.get(EXIT_META) or ("", ""))[0]
        else:
            exit_ = (response.headers.get(HEADER_EGRESS_PROXY) or b"").decode("latin-1")
        if not exit_:
            if https:
                self.stats.inc_value(STATS + "unattributed")
            else:
                # Every answer the gateway relays names its exit: this one is its own refusal.
                self.stats.inc_value(STATS + "gateway_refused")
                logger.error("egress proxies: the gateway refused %s: %d %s", request.url, response.status,
                             response.body[:300].decode("utf-8", "replace").strip())
            return response
        domain, status = state["domain"], response.status
        if not domain:
            return response
        if status in self.ban_codes:
            self.stats.inc_value(STATS + "banned")
            self._report(exit_, domain, "banned")
        elif status in self.throttle_codes:
            self.stats.inc_value(STATS + "throttled")
            self._report(exit_, domain, "throttled", retry_after_seconds(response.headers.get(b"Retry-After")))
        elif 200 <= status < 300:
            self.stats.inc_value(STATS + "ok")
            if self.report_ok:
                self._report(exit_, domain, "ok")
        return response

    def process_response(self, request, response, spider):
        state = request.meta.get(META)
        if state and state.get("gateway"):
            return self._gateway_response(request, response, state)
        if not state or not state["domain"]:
            return response
        ref, domain, status = state["proxy"], state["domain"], response.status
        if status in self.ban_codes:
            self.stats.inc_value(STATS + "banned")
            self._report(ref, domain, "banned")
            self._remember(domain, ref)
            tried = state["tried"] + [ref]
            if len(tried) - state.get("failures", 0) > self.max_ban_retries:
                return response
            self.stats.inc_value(STATS + "retries")
            logger.debug("egress proxies: %s banned %s (%d); sending it again through another proxy", domain, ref, status)
            retry = request.replace(dont_filter=True)
            retry.meta[META] = dict(state, tried=tried)
            retry.meta.pop("proxy", None)
            return retry
        if status in self.throttle_codes:
            self.stats.inc_value(STATS + "throttled")
            self._report(ref, domain, "throttled", retry_after_seconds(response.headers.get(b"Retry-After")))
        elif 200 <= status < 300:
            self.stats.inc_value(STATS + "ok")
            if self.report_ok:
                self._report(ref, domain, "ok")
        return response

    def process_exception(self, request, exception, spider):
        """A request whose proxy did not answer: the proxy is reported unreachable (the
        batch goes at once) and avoided for every host for EGRESS_PROXIES_UNREACHABLE_MEMORY,
        and the request goes again through a proxy it has not been through (exclude=), at
        most EGRESS_PROXIES_MAX_PROXY_RETRIES times; then EgressProxyUnreachable names
        every proxy tried. A CONNECT the proxy refused is retried the same way, unreported."""
        state = request.meta.get(META)
        if state and state.get("gateway"):
            return None  # the gateway retries exits itself; its refusals go on to Scrapy
        failure = _proxy_failure(request, exception) if state else None
        if failure is None:
            return None
        ref = state["proxy"]
        if failure == "unreachable":
            self.stats.inc_value(STATS + "unreachable")
            self._report(ref, "", "unreachable")
            self._remember(ANY_HOST, ref, self.unreachable_memory)
            self._flush_soon()
        if not self.max_proxy_retries:
            return None
        failures = state.get("failures", 0) + 1
        tried = state["tried"] + [ref]
        if failures > self.max_proxy_retries:
            raise EgressProxyUnreachable(
                f"{request.url}: no egress proxy answered; tried {', '.join(tried)} "
                f"(the last: {type(exception).__name__}: {exception})") from exception
        self.stats.inc_value(STATS + "proxy_retries")
        logger.debug("egress proxies: %s failed for %s (%r); sending it through another proxy", ref, request.url, exception)
        retry = request.replace(dont_filter=True)
        retry.meta[META] = dict(state, tried=tried, failures=failures)
        retry.meta.pop("proxy", None)
        return retry
