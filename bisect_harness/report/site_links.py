"""Where the pages of the published HTML report are, for the short forms that link to them.

``harness report --out DIR`` writes the site with fixed page names, relative to its
folder: ``index.html``, ``runs/<run id>.html``, ``series/<series slug>.html`` and
``compare/<run A>-<run B>.html``. A step summary, a pull-request comment or a JUnit
file links to them where the job says where the site is published (``--report-url``,
the site's base URL) and links to nothing where it does not: the short forms never
guess a host. :func:`site_at` picks the stand-in, so no caller asks "is there a site?".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Link", "NoSite", "PublishedSite", "compare_page", "index_page", "run_page", "series_page", "series_slug",
           "site_at"]


@dataclass(frozen=True)
class Link:
    """A page of the site: what a reader clicks (``title``) and where it is (``url``)."""

    title: str
    url: str


def series_slug(series: str) -> str:
    """A nightly series' key as the site names its page: the config's series (20 hex
    digits) and, for a load point, ``@`` and its label; each run of characters other
    than letters, digits, ``_``, ``.`` and ``-`` one ``-``, none at either end
    (``<series>@concurrency=32`` -> ``<series>-concurrency-32``). The HTML report names
    its pages by this rule (``report.html.site`` imports it)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", series).strip("-.") or "series"


def index_page() -> tuple[str, str]:
    """(title, path) of the site's index: every run, newest first."""
    return "every run", "index.html"


def run_page(run_id: int) -> tuple[str, str]:
    """(title, path) of one run's page."""
    return f"run {run_id}", f"runs/{run_id}.html"


def series_page(series: str, label: str | None = None) -> tuple[str, str]:
    """(title, path) of a nightly series' page; ``label`` names its load point."""
    return (f"the nightly series{f' at {label}' if label else ''}", f"series/{series_slug(series)}.html")


def compare_page(run_a: int, run_b: int) -> tuple[str, str]:
    """(title, path) of the page comparing run B with run A."""
    return f"run {run_b} against run {run_a}", f"compare/{run_a}-{run_b}.html"


@dataclass(frozen=True)
class PublishedSite:
    """The report published at ``base`` (an ``https://`` URL, or any URL the job gives)."""

    base: str

    def links(self, *pages: tuple[str, str]) -> tuple[Link, ...]:
        """Each (title, path) of ``pages`` as a link under the site's base."""
        root = self.base.rstrip("/")
        return tuple(Link(title, f"{root}/{path}") for title, path in pages)

    def url(self, page: tuple[str, str]) -> str | None:
        """The address of one page."""
        return self.links(page)[0].url


@dataclass(frozen=True)
class NoSite:
    """No published report: no links, no addresses."""

    def links(self, *pages: tuple[str, str]) -> tuple[Link, ...]:
        return ()

    def url(self, page: tuple[str, str]) -> str | None:
        return None


def site_at(url: str | None) -> PublishedSite | NoSite:
    """The site ``--report-url`` names, or :class:`NoSite` where it names none."""
    if url is None or not url.strip():
        return NoSite()
    return PublishedSite(url.strip())
