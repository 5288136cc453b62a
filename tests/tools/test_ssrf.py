"""SSRF attempts against crawl_page. Every URL targets the REAL local server's port, so a guard failure would
show up as a request the server received; each attempt must be refused with a reason and reach nothing."""
from __future__ import annotations

import ipaddress

import pytest

from agents.tools.crawl import CrawlPage
from agents.tools.ssrf import UrlRefused, check_url, embedded_ipv4

pytestmark = pytest.mark.integration

# (name, url template with {port}, allow_public): allow_public=True exercises the address checks themselves
SSRF_ATTEMPTS = [
    ("loopback literal", "http://127.0.0.1:{port}/wiki/Durn", True),
    ("private 10/8", "http://10.0.0.1:{port}/", True),
    ("private 172.16/12", "http://172.16.0.1:{port}/", True),
    ("private 192.168/16", "http://192.168.1.1:{port}/", True),
    ("cloud metadata link-local", "http://169.254.169.254/latest/meta-data/", True),
    ("shared CGNAT 100.64/10", "http://100.64.0.1:{port}/", True),
    ("multicast", "http://224.0.0.1:{port}/", True),
    ("unspecified 0.0.0.0", "http://0.0.0.0:{port}/wiki/Durn", True),
    ("IPv6 loopback", "http://[::1]:{port}/wiki/Durn", True),
    ("IPv4-mapped IPv6 loopback", "http://[::ffff:127.0.0.1]:{port}/wiki/Durn", True),
    ("IPv6 link-local", "http://[fe80::1]:{port}/", True),
    ("IPv6 unique-local", "http://[fd00::1]:{port}/", True),
    ("6to4 embedding loopback", "http://[2002:7f00:1::]:{port}/wiki/Durn", True),
    ("6to4 embedding 10/8", "http://[2002:a00:1::1]:{port}/", True),
    ("6to4 embedding metadata", "http://[2002:a9fe:a9fe::]/latest/meta-data/", True),
    ("NAT64 well-known prefix", "http://[64:ff9b::7f00:1]:{port}/wiki/Durn", True),
    ("NAT64 well-known, dotted tail", "http://[64:ff9b::127.0.0.1]:{port}/wiki/Durn", True),
    ("NAT64 local-use prefix", "http://[64:ff9b:1::7f00:1]:{port}/wiki/Durn", True),
    ("Teredo (client 127.0.0.1)", "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:{port}/", True),
    ("IPv4-compatible IPv6", "http://[::127.0.0.1]:{port}/wiki/Durn", True),
    ("IPv4-translated IPv6", "http://[::ffff:0:7f00:1]:{port}/wiki/Durn", True),
    ("ISATAP interface id", "http://[2a00:1450::5efe:7f00:1]:{port}/wiki/Durn", True),
    ("decimal IPv4", "http://2130706433:{port}/wiki/Durn", True),
    ("hex IPv4", "http://0x7f000001:{port}/wiki/Durn", True),
    ("octal IPv4", "http://0177.0.0.1:{port}/wiki/Durn", True),
    ("short IPv4", "http://127.1:{port}/wiki/Durn", True),
    ("name resolving to loopback", "http://localhost:{port}/wiki/Durn", True),
    ("userinfo trick", "http://miniweb.local@127.0.0.1:{port}/wiki/Durn", True),
    ("file scheme", "file:///etc/passwd", True),
    ("gopher scheme", "gopher://127.0.0.1:{port}/_GET%20/", True),
    ("ftp scheme", "ftp://127.0.0.1:{port}/", True),
    ("not allowlisted (default policy)", "http://127.0.0.1:{port}/wiki/Durn", False),
    ("public name, default policy", "http://example.com/", False),
]


@pytest.mark.parametrize("name,template,allow_public", SSRF_ATTEMPTS, ids=[a[0] for a in SSRF_ATTEMPTS])
def test_ssrf_attempt_is_refused(miniweb, name, template, allow_public):
    tool = CrawlPage(allow_hosts={"miniweb.local"}, resolve={"miniweb.local": f"127.0.0.1:{miniweb.port}"},
                     allow_public=allow_public, timeout_s=2)
    before = len(miniweb.requests)
    result = tool.run(template.format(port=miniweb.port))
    assert result.status == "refused", result.text
    assert result.text.startswith("[refused]") and len(result.text) > 20
    assert len(miniweb.requests) == before  # nothing reached the server


def test_redirect_from_allowlisted_host_to_private_host_is_refused(miniweb):
    miniweb.routes["/to-private"] = lambda h: (302, {"Location": f"http://127.0.0.1:{miniweb.port}/wiki/Durn",
                                                     "Content-Length": "0"}, [])
    miniweb.routes["/to-file"] = lambda h: (302, {"Location": "file:///etc/passwd", "Content-Length": "0"}, [])
    for allow_public in (False, True):
        tool = CrawlPage(resolve={"miniweb.local": f"127.0.0.1:{miniweb.port}"}, allow_public=allow_public)
        result = tool.run("http://miniweb.local/to-private")
        assert result.status == "refused" and "127.0.0.1" in result.text
        assert tool.run("http://miniweb.local/to-file").status == "refused"
    assert not [r for r in miniweb.requests if r[1] == "/wiki/Durn"]


def test_non_canonical_literals_are_named_in_the_refusal():
    for host in ("2130706433", "0x7f000001", "0177.0.0.1", "127.1"):
        with pytest.raises(UrlRefused, match=r"non-canonical IPv4 literal \(= 127\.0\.0\.1\)"):
            check_url(f"http://{host}/", set(), {}, allow_public=True)


def test_embedded_ipv4_forms_are_decoded():
    cases = {"2002:7f00:1::": ["127.0.0.1"], "64:ff9b::a00:1": ["10.0.0.1"], "64:ff9b:1::c0a8:1": ["192.168.0.1"],
             "2001:0:4136:e378:8000:63bf:80ff:fffe": ["65.54.227.120", "127.0.0.1"], "::7f00:1": ["127.0.0.1"],
             "::ffff:0:7f00:1": ["127.0.0.1"], "::ffff:7f00:1": ["127.0.0.1"], "fe80::5efe:a00:1": ["10.0.0.1"],
             "2001:4860:4860::8888": [], "::1": []}
    for address, expected in cases.items():
        assert [str(v4) for v4 in embedded_ipv4(ipaddress.IPv6Address(address))] == expected, address


def test_embedded_forms_refused_even_when_the_ipv4_is_public():
    # a NAT64 / Teredo prefix is a translator we cannot see behind; 6to4 and ISATAP of a public IPv4 pass
    for host in ("64:ff9b::808:808", "2001:0:4136:e378:8000:63bf:f7f7:f7f7", "::808:808"):
        with pytest.raises(UrlRefused, match="non-public"):
            check_url(f"http://[{host}]/", set(), {}, allow_public=True)
    assert check_url("http://[2002:808:808::1]/", set(), {}, allow_public=True).connect_ip == "2002:808:808::1"
    assert check_url("http://[2a00:1450::200:5efe:808:808]/", set(), {}, allow_public=True).connect_port == 80


def test_public_literal_passes_and_is_pinned():
    target = check_url("http://93.184.215.14:8080/a?b=1", set(), {}, allow_public=True)
    assert (target.connect_ip, target.connect_port, target.request_path) == ("93.184.215.14", 8080, "/a?b=1")
    mapped = check_url("http://[::ffff:93.184.215.14]/", set(), {}, allow_public=True)
    assert mapped.connect_ip == "93.184.215.14"
