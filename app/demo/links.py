"""Where the demo's dashboards are: their addresses, a demo customer's API key and the admin sign-in."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.console import Console

from infermeter.settings import Settings

DEMO_CUSTOMER = "cust-003"  # the customer with prepaid credit: its page shows spend against the balance


def demo_key(settings: Settings, database_url: str, out_dir: Path) -> str:
    """An API key of DEMO_CUSTOMER for the dashboards: the one an earlier run on this home kept in
    out_dir/demo-key.json (mode 0600) while it is still active, else a new one."""
    from infermeter.db import get_engine
    from serving.keys import KeyStore

    store = KeyStore(get_engine(database_url), settings=settings)
    return store.kept(DEMO_CUSTOMER, out_dir / "demo-key.json", project_id="demo")[1]


def dashboard_links(settings: Settings, database_url: str, base: str, start: datetime, end: datetime,
                     out_dir: Path, console: Console, *, serve: bool) -> dict:
    """Print where the dashboards are, with a demo customer's key and the admin sign-in."""
    from urllib.parse import urlencode

    key = demo_key(settings, database_url, out_dir)
    month = urlencode({"from": f"{start:%Y-%m-%dT%H:%M:%SZ}", "to": f"{end:%Y-%m-%dT%H:%M:%SZ}"}, safe=":")
    period = f"{start:%Y-%m}"
    links = {
        "signin": f"{base}/signin", "dashboard": f"{base}/dashboard?{month}&period={period}",
        "admin_signin": f"{base}/admin/signin", "finance": f"{base}/admin/finance?period={period}",
        "pricing": f"{base}/admin/pricing?{month}", "ops": f"{base}/admin/ops?{month}",
    }
    if settings.admin_token_configured:
        admin = ["  with your INFERMETER_ADMIN_TOKEN"]
    else:  # a development token generated on this home (served on loopback only)
        admin = [f"  with the admin token (development, kept in {settings.credentials_file.resolve()}):",
                 f"  {settings.admin_token}"]
    where = ("serving until Ctrl-C" if serve else
             "`infermeter demo --serve` or `infermeter up` on this home serves them")
    lines = [
        f"[bold]dashboards[/] ({where}):",
        f"customer {DEMO_CUSTOMER}: sign in at {links['signin']} with its API key:",
        f"  {key}",
        "  then its month, invoices and spend:",
        f"  {links['dashboard']}",
        f"admin: sign in at {links['admin_signin']}",
        *admin,
        f"  finance    {links['finance']}",
        f"  pricing    {links['pricing']}",
        f"  operations {links['ops']}",
    ]
    for line in lines:  # long addresses stay whole (a terminal wraps them; copying still works)
        console.print(line, soft_wrap=True, highlight=False)
    return {**links, "customer_id": DEMO_CUSTOMER}
