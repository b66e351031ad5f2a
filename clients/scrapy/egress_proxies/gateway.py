"""The gateway's proxy user name: its options in the grammar of docs/gateway.md, checked
as the gateway checks them, and the proxy URL that carries it.

    USER+ns=crawl+pool=news+session=abc123+sesstime=10m+strict+ip=4

"+" and "=" need no percent-encoding in a URL's user part, and no Kubernetes name nor
session id can contain them, so every value goes in as it is."""

import re
import urllib.parse

# The gateway's identity headers: the exit (namespace/name) that carried a request or
# tunnel, and the address the site saw.
HEADER_EGRESS_PROXY = "X-Egress-Proxy"
HEADER_EGRESS_IP = "X-Egress-IP"

MAX_USER = 128
MAX_SESSION = 128
MAX_SESSTIME = 24 * 3600

_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DURATION = re.compile(r"(\d+)([smh]?)")


class GatewayOptionError(ValueError):
    """A gateway option the gateway would refuse; the message names where it was given
    (a setting or a request's meta key) and what is wrong."""


def parse_sesstime(value, where="EGRESS_PROXIES_GATEWAY_SESSTIME"):
    """A session lifetime as whole seconds: a number of seconds, or "90s", "10m", "2h";
    None or "" for none. Outside 1 s to 24 h, or not whole seconds, is a
    GatewayOptionError naming where."""
    if value is None or value == "":
        return 0
    m = _DURATION.fullmatch(str(value).strip())
    if not m:
        raise GatewayOptionError(f"{where} {value!r}: want whole seconds, or a duration such as 90s, 10m or 2h")
    seconds = int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 1 <= seconds <= MAX_SESSTIME:
        raise GatewayOptionError(f"{where} {value!r}: want 1s to 24h")
    return seconds


def _format_sesstime(seconds):
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def gateway_username(user="", namespace="", pool="", session="", sesstime=0, strict=False, ip=0, where=None):
    """The proxy user name for these options, in the gateway's order (ns, pool, session,
    sesstime, strict, ip). A value the gateway would refuse is a GatewayOptionError
    naming the option and, from ``where`` (option -> setting or meta key), where it was
    given."""
    where = where or {}

    def bad(option, text):
        return GatewayOptionError(f"{where.get(option, option)} (gateway option {option}): {text}")

    user, namespace, pool, session = user or "", namespace or "", pool or "", session or ""
    if len(user) > MAX_USER or not _UNRESERVED.fullmatch(user):
        raise bad("user", f"{user!r}: want at most {MAX_USER} letters, digits, '-', '.', '_' or '~'")
    if namespace and (len(namespace) > 63 or not _LABEL.fullmatch(namespace)):
        raise bad("ns", f"{namespace!r} is not a namespace name (a DNS-1123 label)")
    if pool and (len(pool) > 253 or not _SUBDOMAIN.fullmatch(pool)):
        raise bad("pool", f"{pool!r} is not a pool name (a DNS-1123 subdomain)")
    if len(session) > MAX_SESSION or not _UNRESERVED.fullmatch(session):
        raise bad("session", f"{session!r}: want at most {MAX_SESSION} letters, digits, '-', '.', '_' or '~'")
    if sesstime and not session:
        raise bad("sesstime", "needs a session")
    if sesstime and not (isinstance(sesstime, int) and 1 <= sesstime <= MAX_SESSTIME):
        raise bad("sesstime", f"{sesstime!r}: want whole seconds from 1 to {MAX_SESSTIME}")
    if strict and not session:
        raise bad("strict", "needs a session")
    if ip not in (0, 4, 6, None, "", "4", "6"):
        raise bad("ip", f"{ip!r}: want 4 or 6")
    parts = [user]
    for name, value in (("ns", namespace), ("pool", pool), ("session", session)):
        if value:
            parts.append(f"{name}={value}")
    if sesstime:
        parts.append(f"sesstime={_format_sesstime(sesstime)}")
    if strict:
        parts.append("strict")
    if ip:
        parts.append(f"ip={int(ip)}")
    return "+".join(parts)


def parse_gateway_url(url):
    """(host, port) of the gateway's HTTP proxy URL, http://host:port; anything else is a
    ValueError naming EGRESS_PROXIES_GATEWAY_URL."""
    parsed = urllib.parse.urlsplit(url or "")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme != "http" or not parsed.hostname or not port:
        raise ValueError(f"EGRESS_PROXIES_GATEWAY_URL {url!r}: want http://host:port, the gateway's HTTP proxy "
                         "(its SOCKS5 port cannot name the exit)")
    if "@" in parsed.netloc or parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise ValueError(f"EGRESS_PROXIES_GATEWAY_URL {url!r}: want no user, path, query or fragment (the options "
                         "go in the EGRESS_PROXIES_GATEWAY_* settings, the token in EGRESS_PROXIES_TOKEN or "
                         "EGRESS_PROXIES_TOKEN_FILE)")
    return parsed.hostname, port


def gateway_proxy_url(host, port, username, token):
    """The proxy URL Scrapy's HttpProxyMiddleware turns into Proxy-Authorization."""
    q = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"http://{urllib.parse.quote(username, safe='+=')}:{q(token)}@{netloc}"
