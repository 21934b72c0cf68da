"""The invoice page shows a project column only for an invoice whose lines are split by project (its
book's `invoice: {group_by: project}`), '-' for the lines without one; other invoices are as before."""

from __future__ import annotations

from dashboards.web.responses import CSRF_FIELD, _templates


def line(project: str | None, amount: str) -> dict:
    return {"meter": "output_tokens", "model": "m1", "group": "m1", "kind": "usage", "quantity": "3",
            "unit_price": None, "amount": amount, "period": "2026-02", "adjustment": False, "project": project}


def page(lines: list[dict]) -> str:
    invoice = {"number": "INV-2026-000001", "id": "inv_1", "customer_id": "acme", "period": "2026-02",
               "period_start": "2026-02-01T00:00:00Z", "period_end": "2026-03-01T00:00:00Z", "status_label": "final",
               "issued_at": None, "subtotal": "1.00", "credits_applied": "0.00", "total": "1.00", "currency": "USD",
               "credit_notes": [], "lines": lines}
    html = _templates.get_template("invoice.html").render(
        viewer=None, csrf_field=CSRF_FIELD, csrf="", path="", invoice=invoice, credited="0.00", net="1.00", query="",
        customer_name=None)
    return html.split('data-testid="invoice-lines"', 1)[1].split("</table>", 1)[0]


def test_the_project_column_appears_only_for_lines_split_by_project():
    split = page([line("web", "0.60"), line(None, "0.40")])
    assert "<th>project</th>" in split
    assert "<td>web</td>" in split and "<td>-</td>" in split
    plain = page([line(None, "0.60"), line(None, "0.40")])
    assert "project" not in plain and "<td>-</td>" not in plain
