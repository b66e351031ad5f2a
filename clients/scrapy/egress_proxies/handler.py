"""An https download handler that keeps the gateway's answer to CONNECT.

Scrapy 2.8's HTTP/1.1 handler opens a tunnel through a proxy with
TunnelingTCP4ClientEndpoint, which reads the proxy's answer to CONNECT, checks its
status and drops its headers. The gateway names the exit of the tunnel there
(X-Egress-Proxy, X-Egress-IP) and nowhere else: the site's answers inside the tunnel are
TLS the gateway never sees. GatewayDownloadHandler is Scrapy's handler with that one
step extended: the identity headers of the CONNECT answer are kept on the connection,
and every response that comes through the tunnel gets them as its own X-Egress-Proxy
and X-Egress-IP (replacing any the site sent) and in request.meta["egress_proxies_exit"].
A response whose status is in EGRESS_PROXIES_BAN_CODES or EGRESS_PROXIES_THROTTLE_CODES
closes its tunnel: a tunnel keeps its exit while it is open, so the next request opens
a new one and the gateway chooses again.

    DOWNLOAD_HANDLERS = {"https": "egress_proxies.handler.GatewayDownloadHandler"}
"""

from scrapy.core.downloader.handlers.http11 import (
    HTTP11DownloadHandler,
    ScrapyAgent,
    TunnelingAgent,
    TunnelingTCP4ClientEndpoint,
)
from scrapy.http import Response

from .gateway import HEADER_EGRESS_IP, HEADER_EGRESS_PROXY

# request.meta key the handler sets: (exit, egress IP) of the tunnel the answer came
# through, as the gateway named them ("" when it named no address).
EXIT_META = "egress_proxies_exit"
# The attribute of the TCP connection holding (exit, egress IP).
_ATTR = "egress_proxies_exit"


def _identity(head):
    """(exit, ip) from the header block of a CONNECT answer; exit "" when none."""
    found = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            found[name.strip().lower()] = value.strip().decode("latin-1")
    return found.get(HEADER_EGRESS_PROXY.lower().encode(), ""), found.get(HEADER_EGRESS_IP.lower().encode(), "")


class _IdentityTunnelEndpoint(TunnelingTCP4ClientEndpoint):
    def processProxyResponse(self, rcvd_bytes):
        buffered = bytes(self._connectBuffer) + rcvd_bytes
        end = buffered.find(b"\r\n\r\n")
        transport = getattr(self._protocol, "transport", None)
        if end >= 0 and transport is not None:
            # Before Scrapy's own step, which starts TLS and hands the connection on.
            exit_, ip = _identity(buffered[:end])
            if exit_:
                setattr(transport, _ATTR, (exit_, ip))
        return super().processProxyResponse(rcvd_bytes)


class _IdentityTunnelingAgent(TunnelingAgent):
    def _getEndpoint(self, uri):
        return _IdentityTunnelEndpoint(
            reactor=self._reactor,
            host=uri.host,
            port=uri.port,
            proxyConf=self._proxyConf,
            contextFactory=self._contextFactory,
            timeout=self._endpointFactory._connectTimeout,
            bindAddress=self._endpointFactory._bindAddress,
        )


def _tunnel_identity(txresponse):
    """(exit, ip) kept on the connection txresponse came over, or None. The chain is
    Twisted's: the response's transport proxy, the TLS protocol, and the transport under
    it, which forwards attribute look-ups to the TCP connection the CONNECT went over."""
    obj = getattr(txresponse, "_transport", None)
    for _ in range(6):
        if obj is None:
            return None
        found = getattr(obj, _ATTR, None)
        if isinstance(found, tuple):
            return found
        obj = getattr(obj, "_producer", None) or getattr(obj, "transport", None)
    return None


class _GatewayAgent(ScrapyAgent):
    _TunnelingAgent = _IdentityTunnelingAgent

    def __init__(self, *args, close_codes=frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        self._close_codes = close_codes

    def _cb_bodyready(self, txresponse, request):
        # While the response's transport still leads to its connection (it stops doing
        # so once the body is done).
        found = _tunnel_identity(txresponse) if request.meta.get("proxy") else None
        if found is not None:
            request.meta[EXIT_META] = found
            txresponse._egress_proxies_connection = txresponse._transport._producer
        return super()._cb_bodyready(txresponse, request)

    def _cb_bodydone(self, result, request, url):
        response = super()._cb_bodydone(result, request, url)
        connection = getattr(result["txresponse"], "_egress_proxies_connection", None)
        if not isinstance(response, Response) or connection is None:
            return response
        exit_, ip = request.meta[EXIT_META]
        response.headers[HEADER_EGRESS_PROXY] = exit_
        if ip:
            response.headers[HEADER_EGRESS_IP] = ip
        elif HEADER_EGRESS_IP in response.headers:
            del response.headers[HEADER_EGRESS_IP]
        if response.status in self._close_codes:
            connection.loseConnection()
        return response


class GatewayDownloadHandler(HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 download handler that keeps the exit the gateway names in its
    answer to CONNECT (see the module's doc). For "https" in DOWNLOAD_HANDLERS."""

    def __init__(self, settings, crawler=None):
        super().__init__(settings, crawler)
        self._close_codes = frozenset(int(c) for c in settings.getlist("EGRESS_PROXIES_BAN_CODES", [403])) | \
            frozenset(int(c) for c in settings.getlist("EGRESS_PROXIES_THROTTLE_CODES", [429]))

    def download_request(self, request, spider):
        agent = _GatewayAgent(
            contextFactory=self._contextFactory,
            pool=self._pool,
            maxsize=getattr(spider, "download_maxsize", self._default_maxsize),
            warnsize=getattr(spider, "download_warnsize", self._default_warnsize),
            fail_on_dataloss=self._fail_on_dataloss,
            crawler=self._crawler,
            close_codes=self._close_codes,
        )
        return agent.download_request(request)
