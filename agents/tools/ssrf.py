"""SSRF guard for crawl_page: decide whether a URL may be fetched and WHICH address to connect to.

    target = check_url("http://miniweb.local/wiki/Kato_Rimu", allow_hosts={"miniweb.local"},
                       resolve={"miniweb.local": "127.0.0.1:8123"}, allow_public=False)
    target.connect_ip, target.connect_port   # ("127.0.0.1", 8123); raises UrlRefused otherwise

Rules, in order:
- scheme must be http or https (file://, gopher://, ftp://, data: ... refused); no user:password@ in the URL.
- an IPv4 literal must be canonical dotted-quad: decimal (2130706433), hex (0x7f000001), octal (0177.0.0.1) and short
  (127.1) forms are normalized only to name them in the refusal — they are refused, because other parsers disagree
  on what they mean. IPv4-mapped IPv6 (::ffff:127.0.0.1) is judged as the IPv4 address it maps.
- an allowlisted host goes to its `resolve` entry (like curl --resolve: stable URLs, server on 127.0.0.1:PORT) or,
  without one, to whatever DNS says — private addresses are fine for allowlisted hosts, that is what the list is for.
- any other host is refused unless `allow_public`; then EVERY address it resolves to must be global unicast
  (private, loopback, link-local, multicast, reserved, unspecified 0.0.0.0/::, shared 100.64/10 are refused), so
  `localhost` or a name pointing at 10.x is refused. IPv6 that embeds IPv4 is judged by what it embeds: 6to4
  (2002::/16) and ISATAP need every embedded IPv4 public; NAT64 (64:ff9b::/96, 64:ff9b:1::/48), Teredo
  (2001::/32), IPv4-compatible (::/96) and IPv4-translated (::ffff:0:0:0/96) are refused outright.
- the check returns the resolved IP and the caller connects to exactly that IP (pinning), so a DNS answer that
  changes between check and connect (rebinding) cannot redirect the connection. Each redirect hop is re-checked.

What it does NOT cover: a public server that proxies to internal services; HTTP proxies configured in the
environment (the fetcher ignores them by opening sockets itself); TLS certificate checks are the ssl module
defaults (verified); IPv6 zone ids and exotic address families beyond ipaddress' notion of "global".
"""
from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse
from dataclasses import dataclass


class UrlRefused(ValueError):
    """The URL may not be fetched; the message says why."""


@dataclass(frozen=True)
class FetchTarget:
    url: str
    scheme: str
    host: str  # what goes into the Host header and TLS SNI
    port: int
    request_path: str
    connect_ip: str  # the pinned address actually connected to
    connect_port: int


_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*\.?$", re.IGNORECASE)


def _literal_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP a host literal denotes; non-canonical IPv4 spellings raise UrlRefused."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if _NUMERIC_HOST.match(host):
            try:
                normalized = socket.inet_ntoa(socket.inet_aton(host.rstrip(".")))
            except OSError:
                raise UrlRefused(f"host '{host}' is a malformed numeric address") from None
            raise UrlRefused(f"host '{host}' is a non-canonical IPv4 literal (= {normalized}); refused")
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# IPv6 ranges whose last 32 bits are an IPv4 address a gateway or the host stack may deliver to: NAT64
# well-known (RFC 6052) and local-use (RFC 8215) prefixes, IPv4-compatible (::/96, deprecated) and
# IPv4-translated (::ffff:0:0:0/96, SIIT). 6to4 (2002::/16) and Teredo (2001::/32) are decoded by ipaddress.
_LAST32_IPV4_NETS = [ipaddress.IPv6Network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96")]
# ISATAP interface identifiers (RFC 5214): ::5efe:a.b.c.d and ::200:5efe:a.b.c.d under any /64 prefix.
_ISATAP_IIDS = (0x00005EFE, 0x02005EFE)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address an IPv6 address carries inside it (mapped, 6to4, Teredo server + client, NAT64,
    compatible, translated, ISATAP); [] for a plain IPv6 address."""
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    last32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if any(ip in net for net in _LAST32_IPV4_NETS) and int(ip) > 1:  # :: and ::1 are not IPv4-compatible
        found.append(last32)
    if (int(ip) >> 32) & 0xFFFFFFFF in _ISATAP_IIDS:
        found.append(last32)
    return found


def _is_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Global unicast, and so is every IPv4 address embedded in an IPv6 one: `2002:7f00:1::` (6to4 of
    127.0.0.1) is "global" to ipaddress, yet a 6to4 relay or the host's own sit tunnel delivers it to
    127.0.0.1. NAT64/Teredo/compatible forms are refused outright (a prefix that translates to IPv4 is a
    gateway we cannot see behind), whatever this Python's `is_global` table says about them."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return _is_public(ip.ipv4_mapped)
        if ip.teredo is not None or any(ip in net for net in _LAST32_IPV4_NETS):
            return False
        if not all(_is_public(v4) for v4 in embedded_ipv4(ip)):
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_link_local or ip.is_unspecified)


def _resolve_all(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UrlRefused(f"host '{host}' does not resolve ({exc.strerror})") from None
    except UnicodeError:
        raise UrlRefused(f"host '{host}' is not a valid host name") from None
    # IPv4 first: local servers (the mini-web, test servers) usually bind 127.0.0.1 only, while "localhost" may
    # list ::1 first; every address is checked anyway, only the one connected to is chosen here
    ordered = sorted(infos, key=lambda info: info[0] != socket.AF_INET)
    return list(dict.fromkeys(info[4][0] for info in ordered))


def check_url(url: str, allow_hosts: set[str], resolve: dict[str, str], allow_public: bool) -> FetchTarget:
    """Validate `url` and pin the address to connect to; raises UrlRefused with the reason."""
    parts = urllib.parse.urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UrlRefused(f"scheme '{scheme or '(none)'}' refused; only http and https URLs can be crawled")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("URLs with user:password@ are refused")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise UrlRefused(f"URL '{url}' has no host")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise UrlRefused(f"URL '{url}' has an invalid port") from None
    # models write spaces and non-ASCII into URLs; percent-encode them (already-encoded %XX stays as is)
    request_path = urllib.parse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=~-._")
    if parts.query:
        request_path += "?" + urllib.parse.quote(parts.query, safe="/%:@!$&'()*+,;=~-._?")
    literal = _literal_ip(host)

    if host in allow_hosts:
        if host in resolve:
            ip_text, _, port_text = resolve[host].rpartition(":")
            return FetchTarget(url, scheme, host, port, request_path, ip_text.strip("[]"), int(port_text))
        connect_ip = str(literal) if literal else _resolve_all(host, port)[0]
        return FetchTarget(url, scheme, host, port, request_path, connect_ip, port)

    if not allow_public:
        raise UrlRefused(f"host '{host}' is not in the crawl allowlist {sorted(allow_hosts)}")
    addresses = [str(literal)] if literal else _resolve_all(host, port)
    for address in addresses:
        if not _is_public(ipaddress.ip_address(address)):
            raise UrlRefused(f"host '{host}' resolves to non-public address {address}; refused")
    return FetchTarget(url, scheme, host, port, request_path, addresses[0], port)
