"""Gateway mode: the proxy user name, the settings, and a real Scrapy crawl (a
subprocess, as the README example's) through a gateway on loopback to a site over HTTP
and HTTPS that bans one exit's address; the reports must name the exit the site saw.

The gateway here is a small one of the test's own, in Python: it checks the password,
reads the user name, chooses an exit per session (a-pN: crawl/pN) or by rotation, and
connects to the site from that exit's own loopback address (127.0.0.N), as the real
gateway's exits do. Its CONNECT 200 and its plain-HTTP answers carry X-Egress-Proxy and
X-Egress-IP as the real gateway's (docs/gateway.md)."""

import base64
import datetime
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Request
from scrapy.utils.test import get_crawler

from conftest import INSTALLED, SOURCE
from egress_proxies.gateway import GatewayOptionError, gateway_proxy_url, gateway_username, parse_sesstime
from egress_proxies.middleware import META, EgressProxiesMiddleware

TOKEN = "gw-t0ken"
EXITS = {"crawl/p2": "127.0.0.2", "crawl/p3": "127.0.0.3", "crawl/p4": "127.0.0.4"}
BANNED_SOURCE = "127.0.0.3"


@pytest.mark.parametrize("opts,want", [
    ({}, ""),
    ({"user": "crawler-1"}, "crawler-1"),
    ({"user": "me", "namespace": "crawl", "pool": "news.eu-1", "session": "A-1_b.c~d", "sesstime": 600, "strict": True, "ip": 6},
     "me+ns=crawl+pool=news.eu-1+session=A-1_b.c~d+sesstime=10m+strict+ip=6"),
    ({"session": "s", "sesstime": 90}, "+session=s+sesstime=90s"),
    ({"session": "s", "sesstime": 7200, "ip": "4"}, "+session=s+sesstime=2h+ip=4"),
])
def test_the_username_is_the_gateways_grammar(opts, want):
    assert gateway_username(**opts) == want


@pytest.mark.parametrize("opts,says", [
    ({"user": "a+b"}, "gateway option user"),
    ({"namespace": "Crawl"}, "'Crawl' is not a namespace name"),
    ({"pool": "-p"}, "'-p' is not a pool name"),
    ({"session": "a=b"}, "gateway option session"),
    ({"session": "s" * 129}, "gateway option session"),
    ({"sesstime": 60}, "sesstime): needs a session"),
    ({"strict": True}, "strict): needs a session"),
    ({"ip": 5}, "ip): 5: want 4 or 6"),
])
def test_bad_options_are_named(opts, says):
    with pytest.raises(GatewayOptionError, match=says.replace("(", r"\(").replace(")", r"\)")):
        gateway_username(**opts)


def test_sesstime_is_read_as_the_gateway_reads_it():
    assert [parse_sesstime(v) for v in ("", None, "90", "90s", "10m", "2h", "86400")] == [0, 0, 90, 90, 600, 7200, 86400]
    for bad in ("0", "25h", "1.5s", "ten", "-1"):
        with pytest.raises(GatewayOptionError, match="EGRESS_PROXIES_GATEWAY_SESSTIME"):
            parse_sesstime(bad)


def test_the_proxy_url_keeps_the_options_readable_and_quotes_the_token():
    assert gateway_proxy_url("gw", 8080, "me+ns=crawl", "a/b:c") == "http://me+ns=crawl:a%2Fb%3Ac@gw:8080"


def _middleware(**settings):
    settings.setdefault("EGRESS_PROXIES_URL", "http://proxy-operator:8082")
    settings.setdefault("EGRESS_PROXIES_TOKEN", TOKEN)
    settings.setdefault("EGRESS_PROXIES_GATEWAY_URL", "http://gateway:8080")
    crawler = get_crawler(settings_dict=settings)
    crawler.stats.open_spider(None)
    return EgressProxiesMiddleware.from_crawler(crawler)


@pytest.mark.parametrize("settings,says", [
    ({"EGRESS_PROXIES_GATEWAY_URL": "gateway:8080"}, "EGRESS_PROXIES_GATEWAY_URL 'gateway:8080': want http://host:port"),
    ({"EGRESS_PROXIES_GATEWAY_URL": "socks5://gateway:1080"}, "want http://host:port"),
    ({"EGRESS_PROXIES_GATEWAY_URL": "http://u:p@gateway:8080"}, "want no user, path, query or fragment"),
    ({"EGRESS_PROXIES_TOKEN": ""}, "gateway mode needs EGRESS_PROXIES_TOKEN or EGRESS_PROXIES_TOKEN_FILE"),
    ({"EGRESS_PROXIES_POOL": "News"}, r"EGRESS_PROXIES_POOL \(gateway option pool\): 'News' is not a pool name"),
    ({"EGRESS_PROXIES_GATEWAY_SESSION": "a b"}, r"EGRESS_PROXIES_GATEWAY_SESSION \(gateway option session\)"),
    ({"EGRESS_PROXIES_GATEWAY_IP": "5"}, r"EGRESS_PROXIES_GATEWAY_IP \(gateway option ip\)"),
    ({"EGRESS_PROXIES_GATEWAY_SESSION": "s", "EGRESS_PROXIES_GATEWAY_SESSTIME": "25h"}, "EGRESS_PROXIES_GATEWAY_SESSTIME '25h'"),
])
def test_gateway_settings_are_checked(settings, says):
    with pytest.raises(ValueError, match=says):
        _middleware(**settings)


def test_a_request_gets_the_gateway_with_its_session():
    mw = _middleware(EGRESS_PROXIES_NAMESPACE="crawl", EGRESS_PROXIES_GATEWAY_USER="c1", EGRESS_PROXIES_GATEWAY_SESSTIME="10m",
                     EGRESS_PROXIES_GATEWAY_SESSION="all")
    req = Request("https://www.shop.example.com/x", meta={"egress_proxies_session": "basket-7"})
    assert mw.process_request(req, None) is None
    assert req.meta["proxy"] == f"http://c1+ns=crawl+session=basket-7+sesstime=10m:{TOKEN}@gateway:8080"
    assert req.meta[META] == {"gateway": True, "domain": "www.shop.example.com"}
    other = Request("http://10.0.0.1/")
    mw.process_request(other, None)
    assert other.meta["proxy"] == f"http://c1+ns=crawl+session=all+sesstime=10m:{TOKEN}@gateway:8080"
    assert other.meta[META]["domain"] == ""  # an address is no site: no reports
    none = Request("http://shop.example.com/", meta={"egress_proxies_session": ""})
    mw.process_request(none, None)  # no session: sesstime, a session's option, is left out
    assert none.meta["proxy"] == f"http://c1+ns=crawl:{TOKEN}@gateway:8080"
    bad = Request("http://shop.example.com/", meta={"egress_proxies_session": "a b"})
    with pytest.raises(IgnoreRequest, match=r"http://shop.example.com/: meta\['egress_proxies_session'\] \(gateway option session\)"):
        mw.process_request(bad, None)
    own = Request("http://shop.example.com/", meta={"proxy": "http://elsewhere:3128"})
    mw.process_request(own, None)
    assert own.meta["proxy"] == "http://elsewhere:3128" and META not in own.meta


# The crawl: a site, a gateway, the discovery API stub, and Scrapy in a subprocess.


def _certificate(tmp_path):
    """A self-signed certificate for *.example.com (Scrapy does not verify by default)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shop.example.com")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("*.example.com"), x509.DNSName("example.com")]), False)
            .sign(key, hashes.SHA256()))
    path = tmp_path / "site.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()) + cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


class _Site:
    """One handler for HTTP and HTTPS: 403 to BANNED_SOURCE for shop.example.com, else 200
    "<path> from <source>"; it records (scheme, source, host, path). Its HTTPS answers carry
    a false X-Egress-Proxy, as a hostile site might send: it must never be believed."""

    def __init__(self, certfile):
        self.seen = []
        site = self

        def handler(scheme):
            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"

                def log_message(self, *args):
                    pass

                def do_GET(self):
                    src = self.client_address[0]
                    host = (self.headers.get("Host") or "").split(":")[0]
                    site.seen.append((scheme, src, host, self.path))
                    banned = src == BANNED_SOURCE and host.endswith("shop.example.com")
                    body = b"banned" if banned else f"{self.path} from {src}".encode()
                    self.send_response(403 if banned else 200)
                    if scheme == "https":
                        self.send_header("X-Egress-Proxy", "crawl/spoofed")
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
            return Handler

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler("http"))
        self.https = ThreadingHTTPServer(("127.0.0.1", 0), handler("https"))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(certfile)
        self.https.socket = ctx.wrap_socket(self.https.socket, server_side=True)
        self.ports = {"http": self.http.server_address[1], "https": self.https.server_address[1]}
        for srv in (self.http, self.https):
            threading.Thread(target=srv.serve_forever, daemon=True).start()

    def close(self):
        for srv in (self.http, self.https):
            srv.shutdown()
            srv.server_close()


class _Gateway:
    """The test's gateway (see the module's doc). It records the user names it was given
    and the CONNECTs by session."""

    def __init__(self, site_ports):
        self.users, self.connects = [], []
        self._rotation = 0
        self._lock = threading.Lock()
        gw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _refuse(self, status, text):
                body = text.encode() + b"\n"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def _exit(self):
                auth = self.headers.get("Proxy-Authorization") or ""
                if not auth.startswith("Basic "):
                    self._refuse(407, "no Proxy-Authorization: Basic")
                    return None
                user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
                if password != TOKEN:
                    self._refuse(407, "the proxy password is not a token the discovery API accepts")
                    return None
                gw.users.append(user)
                opts = dict(p.partition("=")[::2] for p in user.split("+")[1:])
                session = opts.get("session", "")
                if session.startswith("a-p"):
                    return f"crawl/{session[2:]}", session
                with gw._lock:
                    gw._rotation += 1
                    return sorted(EXITS)[gw._rotation % len(EXITS)], session

            def do_CONNECT(self):
                chosen = self._exit()
                if chosen is None:
                    return
                exit_, session = chosen
                gw.connects.append(session)
                host, _, port = self.path.rpartition(":")
                upstream = socket.create_connection(("127.0.0.1", int(port)), source_address=(EXITS[exit_], 0))
                self.send_response(200, "Connection established")
                self.send_header("X-Egress-Proxy", exit_)
                self.send_header("X-Egress-IP", EXITS[exit_])
                self.end_headers()
                self.wfile.flush()
                _pump(self.connection, upstream)
                self.close_connection = True

            def do_GET(self):
                chosen = self._exit()
                if chosen is None:
                    return
                exit_, _ = chosen
                host = self.headers.get("Host") or ""
                conn = socket.create_connection(("127.0.0.1", site_ports["http"]), source_address=(EXITS[exit_], 0))
                path = self.path.split("://", 1)[1].partition("/")[2]
                conn.sendall(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                raw = b""
                while chunk := conn.recv(65536):
                    raw += chunk
                conn.close()
                head, _, body = raw.partition(b"\r\n\r\n")
                status = int(head.split(b" ")[1])
                self.send_response(status)
                self.send_header("X-Egress-Proxy", exit_)
                self.send_header("X-Egress-IP", EXITS[exit_])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _pump(a, b):
    """Moves bytes both ways until either side closes."""
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [], 30)
            if not ready:
                return
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        return
    finally:
        b.close()


SPIDER = '''
import scrapy


class GatewaySpider(scrapy.Spider):
    name = "gw"
    custom_settings = {"HTTPERROR_ALLOW_ALL": True, "CONCURRENT_REQUESTS": 1, "RETRY_ENABLED": False}

    def __init__(self, urls="", **kw):
        super().__init__(**kw)
        self.urls = urls.split(",")

    def start_requests(self):
        for u in self.urls:
            for session in ("a-p2", "a-p3", "a-p4"):
                yield scrapy.Request(u + "/1", meta={"egress_proxies_session": session, "n": 1}, dont_filter=True)

    def parse(self, response):
        yield {"url": response.url, "status": response.status, "session": response.meta["egress_proxies_session"],
               "exit": (response.headers.get("X-Egress-Proxy") or b"").decode(),
               "ip": (response.headers.get("X-Egress-IP") or b"").decode()}
        if response.meta["n"] == 1:  # the same session again: a second request after the first's answer
            yield response.request.replace(url=response.url[:-2] + "/2", meta=dict(response.meta, n=2))
'''


def _crawl(stub, tmp_path, handler):
    site = _Site(_certificate(tmp_path))
    gw = _Gateway(site.ports)
    (tmp_path / "gw.py").write_text(SPIDER)
    stub.default = (200, {}, lambda body: {"accepted": len(json.loads(body)["reports"]), "rejected": []})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    if not INSTALLED:
        env["PYTHONPATH"] = SOURCE
    urls = ",".join(f"{scheme}://shop.example.com:{port}" for scheme, port in site.ports.items())
    args = [sys.executable, "-m", "scrapy", "runspider", "gw.py", "-o", "items.jsonl", "-a", f"urls={urls}",
            "-s", "DOWNLOADER_MIDDLEWARES={\"egress_proxies.middleware.EgressProxiesMiddleware\": 740}",
            "-s", f"EGRESS_PROXIES_URL={stub.url}", "-s", f"EGRESS_PROXIES_TOKEN={TOKEN}",
            "-s", f"EGRESS_PROXIES_GATEWAY_URL={gw.url}", "-s", "EGRESS_PROXIES_NAMESPACE=crawl",
            "-s", "EGRESS_PROXIES_GATEWAY_USER=crawler-1", "-s", "EGRESS_PROXIES_GATEWAY_SESSTIME=10m",
            "-s", "TELNETCONSOLE_ENABLED=False"]
    if handler:
        args += ["-s", "DOWNLOAD_HANDLERS={\"https\": \"egress_proxies.handler.GatewayDownloadHandler\"}"]
    try:
        run = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        gw.close()
        site.close()
    (tmp_path / "log").write_text(run.stderr)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "items.jsonl").exists(), run.stderr[-5000:]
    items = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    reports = [r for m, _, _, body in stub.requests if m == "POST" for r in json.loads(body)["reports"]]
    return items, reports, site, gw, run.stderr


def test_a_crawl_reports_the_exit_the_site_saw(stub, tmp_path):
    items, reports, site, gw, log = _crawl(stub, tmp_path, handler=True)
    assert len(items) == 12, log  # 2 schemes x 3 sessions x 2 pages
    for it in items:
        want_exit = "crawl/" + it["session"][2:]
        assert (it["exit"], it["ip"]) == (want_exit, EXITS[want_exit]), it  # the gateway's, not the site's spoof
        assert it["status"] == (403 if want_exit == "crawl/p3" else 200), it
    # The site saw each exit's own address, and only p3's was banned.
    assert {(scheme, src) for scheme, src, _, _ in site.seen} == {(s, ip) for s in ("http", "https") for ip in EXITS.values()}
    assert sorted((r["proxy"], r["outcome"]) for r in reports) == sorted(
        [("crawl/p3", "banned")] * 4 + [("crawl/p2", "ok")] * 4 + [("crawl/p4", "ok")] * 4)
    assert all(r["domain"] == "shop.example.com" for r in reports)
    assert set(gw.users) == {f"crawler-1+ns=crawl+session=a-p{n}+sesstime=10m" for n in (2, 3, 4)}
    # A kept-alive tunnel carries a session's second request; a ban closed p3's, so its
    # second request opened a new one, for which the gateway chose again.
    assert sorted(gw.connects) == ["a-p2", "a-p3", "a-p3", "a-p4"], gw.connects
    dump = log[log.index("Dumping Scrapy stats"):]
    for stat in ("'egress_proxies/banned': 4", "'egress_proxies/ok': 8", "'egress_proxies/reported': 12",
                 "'egress_proxies/gateway_requests': 12"):
        assert stat in dump, dump
    assert "egress_proxies/unattributed" not in dump


def test_without_the_handler_https_answers_name_no_exit(stub, tmp_path):
    """Scrapy's own https handler drops the CONNECT answer's headers: plain-HTTP answers
    are still reported by their exit, HTTPS ones are counted unattributed and never
    reported, whatever X-Egress-Proxy the site put inside the tunnel."""
    items, reports, _, gw, log = _crawl(stub, tmp_path, handler=False)
    assert len(items) == 12, log
    https = [it for it in items if it["url"].startswith("https://")]
    assert all(it["exit"] == "crawl/spoofed" for it in https)  # the site's header, as Scrapy got it
    assert sorted((r["proxy"], r["outcome"]) for r in reports) == sorted(
        [("crawl/p3", "banned")] * 2 + [("crawl/p2", "ok")] * 2 + [("crawl/p4", "ok")] * 2)
    dump = log[log.index("Dumping Scrapy stats"):]
    assert "'egress_proxies/unattributed': 6" in dump, dump
    assert sorted(gw.connects) == ["a-p2", "a-p3", "a-p4"]  # without the handler a ban keeps its tunnel


def test_a_refusal_of_the_gateway_is_logged_and_not_reported(stub, tmp_path):
    site = _Site(_certificate(tmp_path))
    gw = _Gateway(site.ports)
    try:
        crawler = get_crawler(settings_dict={"EGRESS_PROXIES_URL": stub.url, "EGRESS_PROXIES_TOKEN": "wrong",
                                             "EGRESS_PROXIES_GATEWAY_URL": gw.url})
        crawler.stats.open_spider(None)
        mw = EgressProxiesMiddleware.from_crawler(crawler)
        req = Request("http://shop.example.com/x")
        mw.process_request(req, None)
        from scrapy.http import TextResponse
        res = TextResponse(req.url, status=407, body=b"the proxy password is not a token the discovery API accepts\n",
                           request=req)
        assert mw.process_response(req, res, None) is res
        assert crawler.stats.get_value("egress_proxies/gateway_refused") == 1
        assert mw._pending == []
    finally:
        gw.close()
        site.close()
