import json
import os
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

SOURCE = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))

# EGRESS_PROXIES_TEST_INSTALLED=1 (hack/scrapy-wheel.sh test): the tests run against the
# installed wheel, and egress_proxies must come from the running environment's
# site-packages, not from these sources. Otherwise the sources are tested in place.
INSTALLED = os.environ.get("EGRESS_PROXIES_TEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, SOURCE)


def pytest_configure(config):
    if not INSTALLED:
        return
    import egress_proxies

    where = os.path.realpath(egress_proxies.__file__)
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    if sys.prefix == sys.base_prefix or os.path.commonpath([where, site]) != site:
        raise pytest.UsageError(f"egress_proxies imported from {where}, want the installed one in the "
                                f"virtual environment's {site}")


class Stub:
    """An HTTP server on loopback that answers each request with the next scripted
    (status, headers, body) and records (method, path, headers, body)."""

    def __init__(self):
        self.script = []
        self.default = (200, {}, {"accepted": 0, "rejected": []})
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                stub.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = stub.script.pop(0) if stub.script else stub.default
                if callable(payload):
                    payload = payload(body)
                raw = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()
