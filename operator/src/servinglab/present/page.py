"""The HTML page both reports share: title, facts, the table and the plots (pure rendering)."""

from __future__ import annotations

import html


def html_page(title: str, intro: str, facts: list[str], table: str, images: tuple[str, ...], images_last: bool) -> str:
    """The report page both reports share: title, facts, the table and the plots."""
    figures = "".join(f'<figure><img src="{name}" alt="{name}"></figure>' for name in images)
    body = f"{table}\n{figures}" if images_last else f"{figures}\n{table}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
td:last-child {{ text-align: left; }} figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
{intro}
<ul>{"".join(f"<li>{fact}</li>" for fact in facts)}</ul>
{body}
</body></html>
"""
