"""The package as installed, and its README held to the code: the settings, the stats,
the version and the example spider (which crawls here, through a loopback proxy)."""

import ast
import base64
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import egress_proxies
from conftest import INSTALLED, SOURCE

README = os.path.join(SOURCE, "README.md")
PACKAGE = os.path.dirname(os.path.realpath(egress_proxies.__file__))


def _readme():
    with open(README, encoding="utf-8") as f:
        return f.read()


def _code():
    """The package's own source, as imported (installed or in place)."""
    text = ""
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
                text += f.read()
    return text


def _table(text, first_cell):
    """{first cell's names: the row's cells} for the README table rows whose first cell
    starts with first_cell."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `" + first_cell):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells
    return rows


def test_the_package_under_test_is_the_installed_one():
    if not INSTALLED:
        pytest.skip("testing the sources in place (EGRESS_PROXIES_TEST_INSTALLED is not 1)")
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert sys.prefix != sys.base_prefix, "not in a virtual environment"
    assert os.path.commonpath([PACKAGE, site]) == site, f"egress_proxies from {PACKAGE}, not from {site}"
    assert os.path.commonpath([PACKAGE, SOURCE]) != SOURCE
    assert all(os.path.realpath(p or os.getcwd()) != SOURCE for p in sys.path), sys.path


def test_the_installed_check_refuses_the_sources():
    """With EGRESS_PROXIES_TEST_INSTALLED=1, a run that would import the sources (from
    their own directory, first on sys.path) stops before any test."""
    env = dict(os.environ, EGRESS_PROXIES_TEST_INSTALLED="1", PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "tests"],
                         cwd=SOURCE, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    want = f"egress_proxies imported from {os.path.join(SOURCE, 'egress_proxies', '__init__.py')}, want the installed one"
    assert want in run.stderr, run.stderr


def test_the_version_is_the_projects_and_the_wheels():
    with open(os.path.join(SOURCE, "..", "..", "VERSION"), encoding="utf-8") as f:
        version = f.read().strip()
    assert egress_proxies.__version__ == version
    assert f"egress_proxies_scrapy-{version}-py3-none-any.whl" in _readme()
    assert f"version {version}:" in _readme()
    if not INSTALLED:
        return
    meta = importlib.metadata.metadata("egress-proxies-scrapy")
    assert meta["Version"] == egress_proxies.__version__
    assert meta["Requires-Python"] == ">=3.11"
    requires = sorted(re.sub(r"[ ()]", "", r) for r in meta.get_all("Requires-Dist"))  # "scrapy (<3,>=2.8)" too
    assert requires == ["scrapy<3,>=2.8", "tldextract>=3.1"]
    # the README's table of supported versions says the same
    assert "| `>=3.11` |" in _readme() and "`scrapy>=2.8,<3`" in _readme() and "`tldextract>=3.1`" in _readme()
    files = {str(p) for p in importlib.metadata.files("egress-proxies-scrapy")}
    assert {"egress_proxies/__init__.py", "egress_proxies/discovery.py", "egress_proxies/middleware.py"} <= files
    assert not any(p.startswith("tests") for p in files)


def test_the_readme_lists_every_setting_the_code_reads():
    code = _code()
    read = set(re.findall(r"\bEGRESS_PROXIES_[A-Z_]*[A-Z]\b", code))
    table = _table(_readme(), "EGRESS_PROXIES_")
    assert read, "no settings found in the code"
    assert sorted(read - set(table)) == [], "settings the code reads, missing from README.md's table"
    assert sorted(set(table) - read) == [], "settings in README.md the code never reads"
    # A literal default in the code is the README's.
    for name, default in re.findall(r"\.get(?:int|float|bool|list)?\(\s*\"(EGRESS_PROXIES_\w+)\",\s*([^)]+?)\)", code):
        try:
            want = ast.literal_eval(default)
        except ValueError:
            continue  # computed, such as discovery.has_token
        cell = table[name][1].strip("`")
        try:
            got = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            got = cell  # a bare word, such as site
        assert got == want, f"{name}: README says {cell}, the code {default}"


def test_the_readme_lists_every_stat_the_code_keeps():
    kept = {"egress_proxies/" + k for k in re.findall(r"STATS \+ \"(\w+)\"", _code())}
    table = _table(_readme(), "egress_proxies/")
    assert kept, "no stats found in the code"
    assert sorted(kept - set(table)) == [], "stats the code keeps, missing from README.md's table"
    assert sorted(set(table) - kept) == [], "stats in README.md the code never keeps"


class _Proxy:
    """A forward proxy on loopback that is the site as well: it answers every
    absolute-URI request itself, and records (url, Proxy-Authorization)."""

    def __init__(self):
        self.seen = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.seen.append((self.path, self.headers.get("Proxy-Authorization")))
                if self.path == "http://shop.example.com/":
                    body = b'<title>Shop</title><a class="next" href="/page/2">next</a>'
                else:
                    body = b"<title>Page 2</title>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_the_readme_example_spider_crawls(stub, tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    example = [b for b in blocks if b.startswith("# shop.py")]
    assert len(example) == 1, "README.md's example spider (a python block starting with # shop.py)"
    (tmp_path / "shop.py").write_text(example[0])
    token = tmp_path / "token"
    token.write_text("example-token\n")
    site = _Proxy()
    proxy = {"name": "p1", "namespace": "crawl", "url": f"http://u:pw@127.0.0.1:{site.port}"}

    def answer(body):
        if body:  # POST /v1/feedback
            reports = json.loads(body)["reports"]
            return {"accepted": len(reports), "rejected": []}
        return proxy

    stub.default = (200, {}, answer)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    if not INSTALLED:
        env["PYTHONPATH"] = SOURCE
    try:
        run = subprocess.run(
            [sys.executable, "-m", "scrapy", "runspider", "shop.py", "-o", "pages.jsonl",
             "-s", f"EGRESS_PROXIES_URL={stub.url}", "-s", f"EGRESS_PROXIES_TOKEN_FILE={token}",
             "-s", "TELNETCONSOLE_ENABLED=False"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        site.close()
    assert run.returncode == 0, run.stderr
    pages = [json.loads(line) for line in (tmp_path / "pages.jsonl").read_text().splitlines()]
    assert sorted((p["url"], p["title"]) for p in pages) == [
        ("http://shop.example.com/", "Shop"), ("http://shop.example.com/page/2", "Page 2")], run.stderr
    basic = "Basic " + base64.b64encode(b"u:pw").decode()
    assert sorted(site.seen) == [("http://shop.example.com/", basic), ("http://shop.example.com/page/2", basic)]
    picks = [r for r in stub.requests if r[0] == "GET"]
    assert [r[1] for r in picks] == ["/v1/proxies/pick?domain=shop.example.com&namespace=crawl&credentials=true"] * 2
    assert all(r[2]["Authorization"] == "Bearer example-token" for r in stub.requests)
    reports = [r for m, _, _, body in stub.requests if m == "POST" for r in json.loads(body)["reports"]]
    assert reports == [{"proxy": "crawl/p1", "domain": "shop.example.com", "outcome": "ok"}] * 2
    # The spider's closed() logs the counts; the last reports may still be on their way
    # then, and Scrapy's dump of the stats, after every spider_closed handler, has them.
    assert "egress proxies: {'egress_proxies/ok': 2, 'egress_proxies/picks': 2" in run.stderr
    dump = run.stderr[run.stderr.index("Dumping Scrapy stats"):]
    assert "'egress_proxies/reported': 2" in dump, dump
