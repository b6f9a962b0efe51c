"""Link and title extraction: what a crawl keeps of an HTML page, and that no input breaks it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jetcrawl.contract.urls import LinkCanonicalizer, UrlRules
from jetcrawl.worker.parse import DEPTH_SCAN_TAGS, MAX_DEPTH, MAX_LINKS, Page, extract

PAGE = "https://example.com/dir/page.html"
RULES = UrlRules()
LINKS = LinkCanonicalizer(RULES)


def links_of(html: str | bytes, page_url: str = PAGE, charset: str | None = "utf-8") -> Page:
    raw = html.encode() if isinstance(html, str) else html
    return extract(raw, page_url, charset, LINKS)


def test_relative_links_resolve_against_the_page() -> None:
    page = links_of(
        "<a href='other.html'>a</a> <a href='../up.html'>b</a> <a href='/root'>c</a>"
        "<a href='//cdn.example.org/x'>d</a> <a href='?q=1'>e</a>"
    )
    assert page.links == (
        "https://example.com/dir/other.html",
        "https://example.com/up.html",
        "https://example.com/root",
        "https://cdn.example.org/x",
        "https://example.com/dir/page.html?q=1",
    )
    assert page.invalid_links == 0


def test_the_first_base_href_counts_resolved_against_the_page() -> None:
    page = links_of(
        "<head><base target=_blank><base href='/other/'><base href='http://ignored.example/'>"
        "</head><a href='a.html'>a</a><a href='http://abs.example/b'>b</a>"
    )
    assert page.links == ("https://example.com/other/a.html", "http://abs.example/b")


def test_a_base_that_is_no_http_url_is_ignored() -> None:
    page = links_of("<base href='javascript:void(0)'><a href='a.html'>a</a>")
    assert page.links == ("https://example.com/dir/a.html",)


def test_links_are_canonical_unique_and_in_document_order() -> None:
    page = links_of(
        "<a href=' b.html '>1</a>"  # HTML allows whitespace around a URL
        "<a href='a.html#top'>2</a>"
        "<area href='map.html'>"
        "<a href='b.html#bottom'>3</a>"  # a fragment makes no new page
        "<a href='HTTPS://EXAMPLE.com:443/dir/a.html'>4</a>"
        "<a href='c.html?utm_source=news&id=7&fbclid=x'>5</a>"
        "<a href='c.html?id=7'>6</a>"
        "<a href='b.html' rel='nofollow'>7</a>"  # nofollow links are kept
    )
    assert page.links == (
        "https://example.com/dir/b.html",
        "https://example.com/dir/a.html",
        "https://example.com/dir/map.html",
        "https://example.com/dir/c.html?id=7",
    )


def test_the_page_itself_is_not_a_link() -> None:
    page = links_of("<a href='#top'>top</a><a href=''>self</a><a href='page.html'>me</a>")
    assert page.links == ()
    assert page.invalid_links == 0


def test_links_that_do_not_canonicalize_are_counted_not_raised() -> None:
    page = links_of(
        "<a href='mailto:someone@example.com'>m</a>"
        "<a href='javascript:void(0)'>j</a>"
        "<a href='tel:+15551234'>t</a>"
        "<a href='http://user:pw@example.com/'>u</a>"
        "<a href='http://exa mple.com/'>h</a>"
        "<a href='ok.html'>ok</a>"
        "<a href='javascript:void(0)'>same text again</a>"  # counted once: same href
    )
    assert page.links == ("https://example.com/dir/ok.html",)
    assert page.invalid_links == 5


def test_anchors_without_href_are_not_links() -> None:
    page = links_of("<a name='x'>x</a><a href>y</a><link href='/style.css'><img src='/i.png'>")
    assert page == Page(title=None, links=(), invalid_links=0)


def test_title_is_stripped_and_collapsed() -> None:
    assert links_of("<title>\n  Hello\t  World  </title>").title == "Hello World"
    assert links_of("<title>Fish &amp; Chips</title>").title == "Fish & Chips"
    assert links_of("<title>   </title>").title is None
    assert links_of("<p>no title</p>").title is None
    assert links_of("<title>first</title><title>second</title>").title == "first"


def test_the_http_charset_decodes_the_page() -> None:
    html = "<title>Привет</title><a href='/путь'>x</a>".encode("windows-1251")
    page = links_of(html, charset="windows-1251")
    assert page.title == "Привет"
    assert page.links == ("https://example.com/%D0%BF%D1%83%D1%82%D1%8C",)


def test_without_a_charset_the_meta_declaration_is_used() -> None:
    html = "<meta charset='windows-1251'><title>Привет</title>".encode("windows-1251")
    assert links_of(html, charset=None).title == "Привет"


def test_latin1_is_read_as_windows_1252_as_browsers_do() -> None:
    html = "<title>“quoted” café</title>".encode("cp1252")
    assert links_of(html, charset="iso-8859-1").title == "“quoted” café"


def test_an_unknown_or_non_text_charset_falls_back_to_detection() -> None:
    html = "<title>naïve</title>".encode()
    for charset in ("no-such-charset", "rot13", "base64", "undefined", "idna"):
        assert links_of(html, charset=charset).title == "naïve", charset


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert links_of(b"<title>a\xff\xfeb</title>").title == "a\ufffd\ufffdb"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from([None, "utf-8", "windows-1252", "utf-16", "x"]))
def test_garbage_bytes_never_raise(html: bytes, charset: str | None) -> None:
    page = extract(html, PAGE, charset, LINKS)
    assert PAGE not in page.links


_SOUP_PIECES = (
    "<a href='",
    "<a href=",
    "<base href='",
    '<area href="',
    "'>",
    '">',
    ">",
    "</a>",
    "<title>",
    "</title>",
    "<!--",
    "-->",
    "<script>",
    "</script>",
    "#",
    "?",
    "/",
    "..",
    "javascript:",
    "http://",
    "https://[::1]",
    "%",
    "%zz",
    "\x00",
    "\ud800",
    " ",
    "é",
)
_TAG_SOUP = st.lists(st.sampled_from(_SOUP_PIECES) | st.text(max_size=8), max_size=40).map("".join)


@settings(max_examples=300, deadline=None)
@given(_TAG_SOUP)
def test_tag_soup_never_raises(html: str) -> None:
    raw = html.encode("utf-8", "surrogatepass")
    page = extract(raw, PAGE, "utf-8", LINKS)
    assert len(set(page.links)) == len(page.links)
    for link in page.links:
        assert RULES.canonicalize(link) == link


def test_a_page_nested_past_the_depth_cap_is_read_up_to_it() -> None:
    # lexbor's time grows with the square of the depth: a hundred thousand nested elements
    # would hold a worker for many seconds. The page is read up to MAX_DEPTH, as browsers cap it.
    depth = 100_000
    html = b"<title>deep</title><a href='/before'>b</a>" + b"<div>" * depth
    html += b"<a href='/inside'>i</a>" + b"</div>" * depth + b"<a href='/after'>a</a>"
    page = extract(html, "http://a.test/", None, LinkCanonicalizer(UrlRules()))
    assert page.cut_at_depth
    assert (page.title, page.links) == ("deep", ("http://a.test/before",))


def test_many_tags_but_shallow_is_read_whole() -> None:
    html = b"".join(b"<p><a href='/p%d'>x</a><br></p>" % n for n in range(DEPTH_SCAN_TAGS))
    html += b"<div>" * (MAX_DEPTH - 1) + b"<a href='/last'>l</a>"
    page = extract(html, "http://a.test/", None, LinkCanonicalizer(UrlRules()), DEPTH_SCAN_TAGS + 1)
    assert not page.cut_at_depth
    assert len(page.links) == DEPTH_SCAN_TAGS + 1 and page.links[-1] == "http://a.test/last"


def test_a_page_of_100k_links_keeps_the_first_max_links() -> None:
    html = "".join(f"<a href='/p{n}'>x</a>" for n in range(100_000)).encode()
    page = extract(html, "http://a.test/", None, LinkCanonicalizer(UrlRules()))
    assert page.cut_at_links and len(page.links) == MAX_LINKS
    assert (
        page.links[0] == "http://a.test/p0" and page.links[-1] == f"http://a.test/p{MAX_LINKS - 1}"
    )
    capped = extract(html, "http://a.test/", None, LinkCanonicalizer(UrlRules()), max_links=3)
    assert capped.links == ("http://a.test/p0", "http://a.test/p1", "http://a.test/p2")


def test_repeats_and_the_page_itself_do_not_count_toward_max_links() -> None:
    html = (
        b"<a href='/'>home</a>" * 10 + b"<a href='/a'>a</a><a href='/a#x'>a</a><a href='/b'>b</a>"
    )
    page = extract(html, "http://a.test/", None, LinkCanonicalizer(UrlRules()), max_links=2)
    assert (page.links, page.cut_at_links) == (("http://a.test/a", "http://a.test/b"), False)
