"""The ledger as static HTML pages (``harness report``): see :mod:`.site`."""

from bisect_harness.report.html.site import (INDEX_PAGE, Site, compare_page, run_page, series_page, series_slug,
                                             write_site)

__all__ = ["INDEX_PAGE", "Site", "compare_page", "run_page", "series_page", "series_slug", "write_site"]
