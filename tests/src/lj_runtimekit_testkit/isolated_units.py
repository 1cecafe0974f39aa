"""Each component's unit tests run once per ``make test``: in the isolated phase.

``make isolation`` runs every component's tests that need no peer (none of :data:`NEEDS`) in a
venv holding that component alone, which proves its dependencies are declared. ``make test``
runs that phase beside the main run, so the main run leaves those same tests out with
``--lj-units-isolated`` (the isolated run is the stronger of the two: the same tests, fewer
packages installed) and runs the rest of ``components/*/tests`` and all of ``tests/``. Without the
option, ``make test-suite`` alone still runs everything.
"""

from __future__ import annotations

import pytest

#: The markers of tests that need a peer the isolated venvs do not start; the isolated run
#: deselects them (the Makefile's ``ISOLATED_NEEDS``, checked by tests/shape_tests).
NEEDS = ("cluster", "prometheus", "containerd", "realnode", "images")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("lj-runtimekit").addoption(
        "--lj-units-isolated",
        action="store_true",
        default=False,
        help="leave out the components' tests that `make isolation` runs (no marker of "
        + ", ".join(NEEDS)
        + "): make test runs them there",
    )


def runs_isolated(item: pytest.Item) -> bool:
    """Whether ``make isolation`` runs ``item``: a test under ``components/<c>/tests`` with none
    of the markers in :data:`NEEDS`."""
    parts = item.nodeid.split("::", 1)[0].split("/")
    under = len(parts) > 3 and parts[0] == "components" and parts[2] == "tests"
    return under and not any(item.get_closest_marker(m) for m in NEEDS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--lj-units-isolated"):
        return
    kept = [i for i in items if not runs_isolated(i)]
    if len(kept) == len(items):
        return
    config.hook.pytest_deselected(items=[i for i in items if runs_isolated(i)])
    items[:] = kept
