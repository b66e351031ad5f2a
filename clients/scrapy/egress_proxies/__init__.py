"""Scrapy integration of the egress-proxies-operator discovery API."""

from .discovery import Discovery, DiscoveryError
from .middleware import EgressProxiesMiddleware, NoEgressProxy

__all__ = ["Discovery", "DiscoveryError", "EgressProxiesMiddleware", "NoEgressProxy"]
