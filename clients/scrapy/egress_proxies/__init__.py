"""Scrapy integration of the egress-proxies-operator discovery API."""

# The project's version (its VERSION file), also the wheel's: egress-proxies-scrapy.
__version__ = "0.1.0"

from .discovery import Discovery, DiscoveryError
from .middleware import EgressProxiesMiddleware, EgressProxyUnreachable, NoEgressProxy

__all__ = ["__version__", "Discovery", "DiscoveryError", "EgressProxiesMiddleware", "EgressProxyUnreachable",
           "NoEgressProxy"]
