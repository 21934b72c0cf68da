"""Regenerate the dashboards' screenshots in docs/screenshots/ (shown in README.md and docs/dashboards.md):
`scripts/screenshots` or `python -m app.screenshots [--out DIR] [--requests N]`.

Runs `infermeter demo --serve` on a fresh home in a temporary folder (the month metered, priced and
billed), reads the demo customer's key and the admin token it prints, drives Debian's Chromium headless
through Playwright over the pages (sign-in, the customer's dashboard with an invoice opened, pricing
experiments, finance, operations), takes a full-page screenshot of each, then stops the demo with SIGTERM.
A page whose charts do not draw, or whose browser console reports an error, stops the script.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# (file name, address key printed by the demo, charts the page draws)
PAGES = (("customer", "dashboard", 5), ("pricing", "pricing", 5), ("finance", "finance", 5),
         ("operations", "operations", 3))


def start_demo(home: Path, port: int, requests: int | None) -> tuple[subprocess.Popen, list[str]]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP", "INFERMETER_ADMIN_TOKEN", "INFERMETER_PRODUCER_TOKEN")}
    env["INFERMETER_HOME"] = str(home)
    args = [sys.executable, "-m", "app.cli", "demo", "--serve", "--port", str(port)]
    if requests:
        args += ["--requests", str(requests)]
    demo = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(demo.stdout), daemon=True).start()
    return demo, out


def wait_for_addresses(demo: subprocess.Popen, out: list[str], timeout_s: float = 900) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while not any(line.strip().startswith("operations http") for line in out):
        if demo.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the demo did not start serving:\n" + "".join(out)[-3000:])
        time.sleep(0.2)
    printed = "".join(out)
    found = {
        "key": re.search(r"^\s+(im_live_\S+)$", printed, re.M).group(1),
        "admin_token": re.search(r"admin token \(development.*\):\n\s+(\S+)$", printed, re.M).group(1),
        "dashboard": re.search(r"^\s+(http\S+/dashboard\?\S+)$", printed, re.M).group(1),
    }
    for name in ("finance", "pricing", "operations"):
        found[name] = re.search(rf"^\s+{name}\s+(http\S+)$", printed, re.M).group(1)
    return found


def shoot(addresses: dict[str, str], base: str, out_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out_dir.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            for audience, secret_name, field, signin in (("customer", "key", "api_key", "/signin"),
                                                         ("admin", "admin_token", "admin_token", "/admin/signin")):
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: problems.append(str(e)))
                page.goto(base + signin)
                if audience == "customer":
                    written.append(out_dir / "signin.png")
                    page.screenshot(path=str(written[-1]), full_page=True)
                page.fill(f"input[name={field}]", addresses[secret_name])
                with page.expect_navigation():
                    page.click("section.signin button[type=submit]")
                for name, key, charts in PAGES:
                    if (name == "customer") != (audience == "customer"):
                        continue
                    page.goto(addresses[key], timeout=300_000)
                    page.wait_for_selector(f"body[data-charts-drawn='{charts}']", state="attached", timeout=120_000)
                    if name == "customer" and page.query_selector("[data-testid=invoice-table] details summary"):
                        page.click("[data-testid=invoice-table] details summary")
                    written.append(out_dir / f"{name}.png")
                    page.screenshot(path=str(written[-1]), full_page=True)
                context.close()
        finally:
            browser.close()
    if problems:
        raise RuntimeError("the browser reported errors: " + "; ".join(problems))
    return written


def main(argv: list[str] | None = None) -> int:
    from infermeter.stack.ports import free_port, wait_for_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="where the PNGs go")
    parser.add_argument("--requests", type=int, default=None, help="the demo's pool (default: the demo's own)")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="infermeter-screenshots-")) / "home"
    port = free_port()
    demo, out = start_demo(home, port, args.requests)
    try:
        addresses = wait_for_addresses(demo, out)
        wait_for_port("127.0.0.1", port, timeout_s=60)
        for path in shoot(addresses, f"http://127.0.0.1:{port}", args.out):
            print(f"wrote {path}")
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(120)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait()
        shutil.rmtree(home.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
