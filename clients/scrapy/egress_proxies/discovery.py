"""A small client of the egress-proxies-operator discovery API (standard library only).

Every call blocks; the Scrapy middleware runs them in Twisted's thread pool.
"""

import email.utils
import json
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

MAX_BATCH = 1000
RETRYABLE = (429, 502, 503, 504)
# The longest throttle the API takes (retryAfterSeconds), a day.
MAX_RETRY_AFTER = 86400.0
# A token file looking unchanged is read again after this many seconds anyway, as
# client-go's cached file token source does every minute.
TOKEN_FILE_MAX_AGE = 60.0


class DiscoveryError(Exception):
    """An answer of the discovery API other than success, or no answer at all.

    ``status`` is the HTTP status (0 when the API could not be reached),
    ``retry_after`` the answer's Retry-After in seconds (0 when it had none) and
    ``parameter`` the query parameter a 400 names ("" when none).
    """

    def __init__(self, method, url, status, message, retry_after=0.0, parameter=""):
        self.method, self.url, self.status = method, url, status
        self.message, self.retry_after, self.parameter = message, retry_after, parameter
        text = f"discovery {method} {url}: "
        text += f"{status} {message}" if status else message
        if retry_after:
            text += f" (retry after {retry_after:g}s)"
        super().__init__(text)


def _retry_after(headers):
    try:
        return max(0.0, float(headers.get("Retry-After", "0")))
    except (TypeError, ValueError):
        return 0.0


def retry_after_seconds(value, now=None):
    """The seconds a site's Retry-After value (str or bytes: seconds or an HTTP date)
    asks for, as a report carries them: at most MAX_RETRY_AFTER (a longer wait, "inf"
    included, is the longest the API takes), 0.0 for none, a past date, NaN or anything
    unreadable (the report then leaves the field out and the API's default applies)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    value = (value or "").strip()
    try:
        wait = float(value)
    except ValueError:
        try:
            wait = email.utils.parsedate_to_datetime(value).timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, IndexError):
            return 0.0
    if math.isnan(wait) or wait <= 0:
        return 0.0
    return min(wait, MAX_RETRY_AFTER)


def _finite(report):
    """report with a retryAfterSeconds that JSON can carry and the API takes: one out
    of range (Infinity included) is clamped to 0..MAX_RETRY_AFTER, NaN or a non-number
    left out."""
    ra = report.get("retryAfterSeconds")
    if ra is None or (isinstance(ra, (int, float)) and 0 <= ra <= MAX_RETRY_AFTER):
        return report
    report = dict(report)
    if isinstance(ra, (int, float)) and not math.isnan(ra):
        report["retryAfterSeconds"] = min(max(float(ra), 0.0), MAX_RETRY_AFTER)
    else:
        del report["retryAfterSeconds"]
    return report


class TokenFileError(ValueError):
    """A token file that could not be read, or is empty, before any token was read from it."""


class TokenFile:
    """A file holding the discovery token: a projected ServiceAccount token, which the
    kubelet rotates (typically every hour) by swapping a symlink to a new file. It is read
    again when its modification time, size or inode changed (one stat per call), or
    TOKEN_FILE_MAX_AGE seconds after it was read; while it cannot be read, the token read
    last is sent."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._token, self._stamp, self._read_at = "", None, 0.0
        self.get()

    def get(self):
        with self._lock:
            try:
                st = os.stat(self.path)
                stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                if stamp == self._stamp and time.monotonic() - self._read_at < TOKEN_FILE_MAX_AGE:
                    return self._token
                with open(self.path, encoding="utf-8") as f:
                    token = f.read().strip()
                if not token:
                    raise TokenFileError(f"token file {self.path!r} is empty")
            except (OSError, ValueError) as e:
                if self._token:
                    return self._token
                if isinstance(e, TokenFileError):
                    raise
                raise TokenFileError(f"token file {self.path!r}: {getattr(e, 'strerror', None) or e}") from None
            self._token, self._stamp, self._read_at = token, stamp, time.monotonic()
            return token


class Discovery:
    """Lists and picks proxies and sends feedback.

    ``url`` is the API's base URL (http:// or https://), ``token`` the discovery token
    (sent as Authorization: Bearer), or ``token_file`` a file holding it, read again when
    it changes (see TokenFile); ``ca_file`` the CA bundle that signed an https API's
    certificate (None: the system's).
    """

    def __init__(self, url, token="", ca_file=None, timeout=10.0,
                 feedback_attempts=5, retry_backoff=0.25, max_retry_wait=30.0, token_file=None):
        parsed = urllib.parse.urlsplit(url or "")
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment or "@" in parsed.netloc:
            raise ValueError(f"discovery URL {url!r}: want http://host:port or https://host:port")
        self.base = url.rstrip("/")
        self.token = token.strip() if token else ""
        if self.token and token_file:
            raise ValueError(f"discovery token: give token or token_file ({token_file!r}), not both")
        self.token_file = TokenFile(token_file) if token_file else None
        self.timeout = timeout
        self.feedback_attempts = max(1, int(feedback_attempts))
        self.retry_backoff = retry_backoff
        self.max_retry_wait = max_retry_wait
        self.ssl = ssl.create_default_context(cafile=ca_file) if parsed.scheme == "https" else None
        # The API is reached directly, never through a proxy from the environment.
        handlers = [urllib.request.ProxyHandler({})]
        if self.ssl is not None:
            handlers.append(urllib.request.HTTPSHandler(context=self.ssl))
        self.opener = urllib.request.build_opener(*handlers)

    def _call(self, method, path, params=None, body=None):
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        req = urllib.request.Request(url, method=method, data=body)
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        token = self.bearer()
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with self.opener.open(req, timeout=self.timeout) as res:
                return json.loads(res.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            parameter = ""
            try:
                answer = json.loads(raw)
                message = answer.get("error") or raw.decode(errors="replace")
                parameter = answer.get("parameter") or ""
            except (ValueError, AttributeError):
                message = raw[:200].decode(errors="replace").strip()
            raise DiscoveryError(method, url, e.code, message, _retry_after(e.headers), parameter) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise DiscoveryError(method, url, 0, str(getattr(e, "reason", e))) from None

    @property
    def has_token(self):
        """Whether calls carry a token (token or token_file)."""
        return bool(self.token or self.token_file)

    def bearer(self):
        """The token the next call sends: token, or token_file's as it is now."""
        return self.token_file.get() if self.token_file else self.token

    @staticmethod
    def _params(key=None, domain=None, label_selector=None, namespace=None, pool=None, credentials=False, exclude=()):
        params = {k: v for k, v in (("key", key), ("domain", domain), ("labelSelector", label_selector),
                                    ("namespace", namespace), ("pool", pool)) if v}
        if credentials:
            params["credentials"] = "true"
        if exclude:
            params["exclude"] = list(exclude)  # one exclude= each
        return params

    def list(self, **query):
        """The healthy proxies the query matches (GET /v1/proxies), as dicts."""
        query.pop("key", None)
        query.pop("exclude", None)
        return self._call("GET", "/v1/proxies", self._params(**query))["proxies"]

    def pick(self, **query):
        """The proxy for key, or for domain's site without a key (GET /v1/proxies/pick).
        ``exclude``, proxies (URLs discovery handed out, or namespace/name), leaves them out
        of this answer, which is then the next proxy in the same rendezvous order."""
        if not query.get("key") and not query.get("domain"):
            raise ValueError("discovery pick: give key or domain")
        return self._call("GET", "/v1/proxies/pick", self._params(**query))

    def feedback(self, reports):
        """Sends reports (dicts with proxy, domain, outcome and, for throttled,
        retryAfterSeconds) in batches of at most 1,000 (POST /v1/feedback); a
        retryAfterSeconds out of the API's 0 to 86,400 is sent as the nearest of them
        (Infinity as 86,400) and NaN not at all, so that the body stays JSON and the
        report is taken. A batch is
        sent again after a connection failure or a 429, 502, 503 or 504, after the
        answer's Retry-After (a draining replica answers 503 with Retry-After: 1) or a
        back-off. Returns (accepted, rejected), rejected indexed into reports."""
        accepted, rejected = 0, []
        for off in range(0, len(reports), MAX_BATCH):
            batch = [_finite(r) for r in reports[off:off + MAX_BATCH]]
            ans = self._send(json.dumps({"reports": batch}, allow_nan=False).encode())
            accepted += ans.get("accepted", 0)
            for r in ans.get("rejected") or []:
                rejected.append(dict(r, index=r["index"] + off))
        return accepted, rejected

    def _send(self, body):
        backoff = self.retry_backoff
        for attempt in range(1, self.feedback_attempts + 1):
            try:
                return self._call("POST", "/v1/feedback", body=body)
            except DiscoveryError as e:
                if e.status and e.status not in RETRYABLE:
                    raise
                if attempt == self.feedback_attempts:
                    raise DiscoveryError(e.method, e.url, e.status, f"{e.message} (gave up after {attempt} attempts)",
                                         e.retry_after) from None
                time.sleep(min(e.retry_after or backoff, self.max_retry_wait))
                backoff = min(2 * backoff, self.max_retry_wait)
        raise AssertionError("unreachable")
