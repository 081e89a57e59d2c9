"""The report in a real headless browser (Debian's chromium): it loads from disk with no console errors
and shows the verdict table and every figure. The screenshot is kept in ``tests/artifacts/``.

Without ``/usr/bin/chromium`` the test skips locally and fails in CI (``CI=true``); ``.ci/run`` installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import make_study, report

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
# Reads every <img> after the load event, as decoded by the browser, into a <pre> that --dump-dom shows.
_PROBE = (
    '<script>window.addEventListener("load",function(){var r=[];'
    'document.querySelectorAll("img").forEach(function(i){'
    'r.push((i.complete?1:0)+":"+i.naturalWidth+"x"+i.naturalHeight)});'
    'var p=document.createElement("pre");p.id="img-probe";p.textContent=r.join(";");'
    "document.body.appendChild(p)});</script>"
)


def _chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.fixture
def chromium():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{CHROMIUM} missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    return CHROMIUM


def test_report_renders_in_headless_chromium(chromium, tmp_path):
    study_dir = make_study(tmp_path)
    html_path, _ = report(study_dir)
    n_img = len(re.findall(r"<img ", html_path.read_text()))
    assert n_img == 5

    # 1. the report as written: DOM, console and a screenshot
    shot = tmp_path / "report.png"
    page = _chromium(
        html_path.as_uri(),
        tmp_path / "profile1",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1200,3000",
        f"--screenshot={shot}",
    )
    assert page.returncode == 0, page.stderr[-2000:]
    console = [ln for ln in page.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "report_screenshot.png")
    print(f"screenshot: {ARTIFACTS / 'report_screenshot.png'}")

    dom = _chromium(html_path.as_uri(), tmp_path / "profile2", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert re.search(r'<table id="verdicts"[^>]*>.*ACCEPTED.*INCONCLUSIVE.*</table>', dom.stdout, re.S)
    assert len(re.findall(r"<img ", dom.stdout)) == n_img

    # 2. a copy with a probe script: every image decoded by the browser with a nonzero size
    probed = html_path.with_name("probed.html")
    probed.write_text(html_path.read_text().replace("</body>", _PROBE + "</body>"))
    dom = _chromium(probed.as_uri(), tmp_path / "profile3", "--dump-dom")
    found = re.search(r'<pre id="img-probe">([^<]*)</pre>', dom.stdout)
    assert found, dom.stdout[-2000:]
    sizes = [tuple(map(int, re.split("[:x]", s))) for s in found.group(1).split(";")]
    assert len(sizes) == n_img
    assert all(done == 1 and w > 100 and h > 50 for done, w, h in sizes), sizes


def test_checks_detect_a_broken_page(chromium, tmp_path):
    """The checks are not vacuous: an undecodable image reads 0x0 and a console error is seen."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img src="data:image/png;base64,AAAA">'
        f'<script>console.error("boom")</script>{_PROBE}</body></html>'
    )
    dom = _chromium(page.as_uri(), tmp_path / "profile", "--dump-dom", "--enable-logging=stderr", "--v=0")
    assert re.search(r'<pre id="img-probe">[01]:0x0</pre>', dom.stdout)
    assert any(":CONSOLE" in ln and "boom" in ln for ln in dom.stderr.splitlines())
