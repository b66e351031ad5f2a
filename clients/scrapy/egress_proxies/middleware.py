"""A Scrapy downloader middleware that sends each request through a proxy the
egress-proxies-operator's discovery API picks for the request's host, reports what the
site answered, and sends a banned request again through another proxy.

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
from scrapy.exceptions import IgnoreRequest, NotConfigured
from tldextract import TLDExtract
from twisted.internet import task
from twisted.internet.threads import deferToThread

from .discovery import Discovery, DiscoveryError, TokenFileError, retry_after_seconds

logger = logging.getLogger(__name__)

META = "egress_proxies"  # request.meta key: {"proxy": ns/name, "domain": host, "tried": [...]}
STATS = "egress_proxies/"


class NoEgressProxy(IgnoreRequest):
    """No proxy could be had for a request: the site is saturated (too many proxies
    cooling for it), no healthy proxy matches, or the API could not be reached."""


# The public suffix list, ICANN's and the private one (s3.amazonaws.com, github.io), as
# the discovery API and the Go client read it: the copy bundled with tldextract (a
# dependency of Scrapy), never fetched.
_split_host = TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True)

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
    EGRESS_PROXIES_REPORT_OK       report 2xx answers as ok (default True)
    EGRESS_PROXIES_FLUSH_INTERVAL  seconds between feedback batches (default 1.0)
    EGRESS_PROXIES_FEEDBACK_ATTEMPTS  attempts per feedback batch (default 5)
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
        self._recent = {}  # host -> {proxy: monotonic deadline}
        self._recent_ops = 0  # look-ups and additions since the last sweep of _recent
        self._lock = threading.Lock()
        self._pending = []
        self._loop = None

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
        r = {"proxy": proxy, "domain": domain, "outcome": outcome}
        if outcome == "throttled" and retry_after > 0:
            r["retryAfterSeconds"] = retry_after
        with self._lock:
            self._pending.append(r)

    def _flush_in_thread(self):
        return deferToThread(self.flush)

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
        plan = self._plan(request)
        if plan is None:
            return None
        host, domain, tried = plan
        d = deferToThread(self._choose, host, domain, tried)
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

    def _choose(self, host, domain, tried):
        """(proxy, domain) for the request (blocking): the pick for its domain (or host),
        or, on a retry after a ban, one it has not been sent through, in an order of the
        host's own. A domain the API refuses (its public suffix list knows a suffix this
        one does not) is picked by key instead, and domain is then "": no reports."""
        try:
            return self._choose_for(host, domain, tried), domain
        except DiscoveryError as e:
            if not domain or e.status != 400 or e.parameter != "domain":
                raise
            logger.debug("egress proxies: the API takes no domain %s (%s); picking by key", domain, e.message)
            return self._choose_for(host, "", tried), ""

    def _choose_for(self, host, domain, tried):
        q = dict(self.query)
        if domain:
            q["domain"] = domain
        else:
            q["key"] = host
        ref = lambda p: f"{p['namespace']}/{p['name']}"  # noqa: E731
        avoid = self._avoided(domain)
        first = None
        if not tried:
            first = self.discovery.pick(**q)
            if ref(first) not in avoid:
                return first
            # banned here lately, and discovery does not know yet: another, if any
        skip = set(tried) | set(avoid)
        rank = lambda p: hashlib.sha256(f"{host}\0{ref(p)}".encode()).digest()  # noqa: E731
        for p in sorted(self.discovery.list(**q), key=rank, reverse=True):
            if ref(p) not in skip:
                return p
        return first

    def _remember(self, host, ref):
        now = time.monotonic()
        with self._lock:
            self._recent.setdefault(host, {})[ref] = now + self.ban_memory
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
        """The proxies host banned within EGRESS_PROXIES_BAN_MEMORY."""
        if not host:
            return []
        now = time.monotonic()
        with self._lock:
            recent = self._recent.get(host, {})
            for ref in [r for r, until in recent.items() if until <= now]:
                del recent[ref]
            if not recent:
                self._recent.pop(host, None)
            self._sweep_locked(now)
            return list(recent)

    def _assign(self, chosen, request, tried):
        proxy, domain = chosen
        if proxy is None:
            raise NoEgressProxy(f"{request.url}: every proxy for it has been tried ({', '.join(tried)})")
        ref = f"{proxy['namespace']}/{proxy['name']}"
        request.meta["proxy"] = proxy["url"]
        request.meta[META] = {"proxy": ref, "domain": domain, "tried": tried}
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

    def process_response(self, request, response, spider):
        state = request.meta.get(META)
        if not state or not state["domain"]:
            return response
        ref, domain, status = state["proxy"], state["domain"], response.status
        if status in self.ban_codes:
            self.stats.inc_value(STATS + "banned")
            self._report(ref, domain, "banned")
            self._remember(domain, ref)
            tried = state["tried"] + [ref]
            if len(tried) > self.max_ban_retries:
                return response
            self.stats.inc_value(STATS + "retries")
            logger.debug("egress proxies: %s banned %s (%d); sending it again through another proxy", domain, ref, status)
            retry = request.replace(dont_filter=True)
            retry.meta[META] = {"proxy": ref, "domain": domain, "tried": tried}
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
