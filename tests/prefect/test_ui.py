"""The artifacts as users see them: Prefect UI pages rendered by headless Chromium."""

from __future__ import annotations

import html
import shutil
import subprocess

import pytest
from helpers.ndvi_fixtures import artifacts_by_key

pytestmark = [pytest.mark.slow, pytest.mark.prefect_ui]

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=20000"]


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (make test installs Debian's chromium)")
    return found


def rendered(chromium: str, url: str, profile) -> str:
    """The DOM of ``url`` after the UI's scripts ran."""
    done = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return html.unescape(done.stdout)


def test_summary_and_regression_pages_show_stages_prefixes_and_verdicts(
        chromium, ndvi_history, prefect_server, tmp_path):
    arts = artifacts_by_key(ndvi_history.slowed)
    page = f"{prefect_server.ui_url}/artifacts/artifact"

    summary = rendered(chromium, f"{page}/{arts['nightly-ndvi-summary'].id}", tmp_path / "a")
    assert "Can't connect to Server API" not in summary
    for text in ("read", "ndvi", "reduce", "write", "getitem", "nanmedian",
                 "store-map", "total_s"):
        assert text in summary, f"{text!r} not rendered on the summary artifact page"

    verdicts = rendered(chromium, f"{page}/{arts['nightly-ndvi-regression'].id}", tmp_path / "b")
    for text in ("regression", "cause", "getitem", "baseline_s", "ok"):
        assert text in verdicts, f"{text!r} not rendered on the regression artifact page"

    run = rendered(chromium, f"{page}/{arts['nightly-ndvi-run'].id}", tmp_path / "c")
    assert "Utilisation" in run and "regressed" in run
