"""Crawls the URLs a JSON config lists with Scrapy, every request through
egress_proxies.middleware.EgressProxiesMiddleware, and writes what it saw as JSON:
{"pages": {url: [status, body]}, "errors": [...], "stats": {...}}.

    python3 scrapy_crawl.py config.json   (clients/scrapy on PYTHONPATH)
"""
import json
import sys

import scrapy
from scrapy.crawler import CrawlerProcess

with open(sys.argv[1], encoding="utf-8") as f:
    cfg = json.load(f)
results = {"pages": {}, "errors": [], "stats": {}}


class Pages(scrapy.Spider):
    name = "pages"

    def start_requests(self):
        for u in cfg["urls"]:
            yield scrapy.Request(u, callback=self.parse, errback=self.failed)

    def parse(self, response):
        results["pages"][response.url] = [response.status, response.text]

    def failed(self, failure):
        results["errors"].append(f"{failure.request.url}: {failure.value!r}")


process = CrawlerProcess(settings={
    "DOWNLOADER_MIDDLEWARES": {"egress_proxies.middleware.EgressProxiesMiddleware": 740},
    "EGRESS_PROXIES_URL": cfg["discovery"],
    "EGRESS_PROXIES_TOKEN_FILE": cfg["tokenFile"],
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": False,
    "CONCURRENT_REQUESTS": 16,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
    "DOWNLOAD_TIMEOUT": 30,
    "TELNETCONSOLE_ENABLED": False,
    "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
    "LOG_LEVEL": "INFO",
})
crawler = process.create_crawler(Pages)
process.crawl(crawler)
process.start()
stats = crawler.stats.spider_stats.get(Pages.name) or crawler.stats.get_stats()
results["stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}
with open(cfg["out"], "w", encoding="utf-8") as f:
    json.dump(results, f)
