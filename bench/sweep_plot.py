#!/usr/bin/env python3
"""Draw bench/sweep.sh's concurrency sweep as an SVG: req/s against connections (log x axis), one
panel per protocol, one line per proxy. Standard library only; the SVG is written by hand.

    python3 bench/sweep_plot.py SWEEP_TSV OUT_SVG [LABELS [TITLES]]

SWEEP_TSV is bench/last-sweep.tsv (header line, then proto, c, proxy, rps, ok, bad, ...).
LABELS and TITLES are optional tab-separated KEY=TEXT pairs: display names of the proxies and
titles of the protocol panels (the key "*" titles the whole figure). A point with failed requests is
drawn as a hollow marker.
"""
import csv
import math
import sys
from xml.sax.saxutils import escape

COLORS = {"aralez": "#d62728", "nginx": "#2ca02c", "haproxy": "#1f77b4", "Aralez": "#ff7f0e"}
OTHER_COLORS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
PANEL_W, PANEL_H = 470, 340
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50


def pairs(arg):
    out = {}
    for item in (arg or "").split("\t"):
        if "=" in item:
            key, text = item.split("=", 1)
            out[key] = text
    return out


def read_points(path):
    data, protos, proxies = {}, [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            proto, proxy = row["proto"], row["proxy"]
            if proto not in protos:
                protos.append(proto)
            if proxy not in proxies:
                proxies.append(proxy)
            try:
                rps = float(row["rps"])
            except ValueError:
                continue
            if math.isnan(rps):
                continue
            failed = int(float(row.get("bad") or 0)) > 0
            data.setdefault(proto, {}).setdefault(proxy, []).append((int(row["c"]), rps, failed))
    return data, protos, proxies


def nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_num(v):
    if v >= 1000 and v % 1000 == 0:
        return f"{int(v // 1000)}k"
    if v >= 1000:
        return f"{v / 1000:g}k"
    return f"{v:g}"


def panel(x0, proto, title, series, proxies, colors, labels):
    out = []
    cs = sorted({c for pts in series.values() for c, _, _ in pts}) or [1, 10]
    lo = 10 ** math.floor(math.log10(min(cs)))
    hi = 10 ** math.ceil(math.log10(max(cs)))
    if hi <= lo:
        hi = lo * 10
    ymax = max([r for pts in series.values() for _, r, _ in pts] or [1])
    step = nice_step(ymax * 1.05)
    ytop = step * math.ceil(ymax * 1.05 / step)
    w, h = PANEL_W - LEFT - RIGHT, PANEL_H - TOP - BOTTOM
    px = lambda c: x0 + LEFT + w * (math.log10(c) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    py = lambda r: TOP + h - h * r / ytop
    out.append(f'<text x="{x0 + LEFT + w / 2}" y="{TOP - 22}" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>')
    # y grid and labels
    v = 0.0
    while v <= ytop + 1e-9:
        y = py(v)
        out.append(f'<line x1="{x0 + LEFT}" y1="{y:.1f}" x2="{x0 + LEFT + w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt_num(v)}</text>')
        v += step
    # x grid: decades, plus the measured connection counts as labels
    d = lo
    while d <= hi * 1.0001:
        x = px(d)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + h}" stroke="#ddd"/>')
        d *= 10
    for c in cs:
        x = px(c)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + h}" x2="{x:.1f}" y2="{TOP + h + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + h + 16}" text-anchor="middle" font-size="10">{fmt_num(c)}</text>')
    out.append(f'<rect x="{x0 + LEFT}" y="{TOP}" width="{w}" height="{h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{x0 + LEFT + w / 2}" y="{TOP + h + 36}" text-anchor="middle" font-size="12">connections (log scale)</text>')
    out.append(f'<text transform="translate({x0 + 16},{TOP + h / 2}) rotate(-90)" text-anchor="middle" font-size="12">req/s</text>')
    for proxy in proxies:
        pts = sorted(series.get(proxy, []))
        if not pts:
            continue
        color = colors[proxy]
        path = " ".join(f"{px(c):.1f},{py(r):.1f}" for c, r, _ in pts)
        width = 2.5 if proxy == "aralez" else 1.6
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{width}"/>')
        for c, r, failed in pts:
            fill = "white" if failed else color
            tip = f"{labels.get(proxy, proxy)}, c={c}: {r:.0f} req/s" + (" (with failures)" if failed else "")
            out.append(f'<circle cx="{px(c):.1f}" cy="{py(r):.1f}" r="3.5" fill="{fill}" stroke="{color}" stroke-width="1.5"><title>{escape(tip)}</title></circle>')
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: sweep_plot.py SWEEP_TSV OUT_SVG [LABELS [TITLES]]")
    labels = pairs(sys.argv[3] if len(sys.argv) > 3 else "")
    titles = pairs(sys.argv[4] if len(sys.argv) > 4 else "")
    data, protos, proxies = read_points(sys.argv[1])
    if not protos:
        sys.exit(f"sweep_plot.py: no points in {sys.argv[1]}")
    colors, spare = {}, iter(OTHER_COLORS)
    for p in proxies:
        colors[p] = COLORS.get(p) or next(spare, "#000")
    legend_h = 30
    width, height = PANEL_W * len(protos), PANEL_H + legend_h + 30
    body = [f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">'
            f'{escape(titles.get("*", "Concurrency sweep: req/s against connections"))}</text>']
    lx = 20
    for p in proxies:
        body.append(f'<line x1="{lx}" y1="{40}" x2="{lx + 24}" y2="{40}" stroke="{colors[p]}" stroke-width="2.5"/>')
        body.append(f'<circle cx="{lx + 12}" cy="40" r="3.5" fill="{colors[p]}"/>')
        name = labels.get(p, p)
        body.append(f'<text x="{lx + 30}" y="44" font-size="12">{escape(name)}</text>')
        lx += 40 + 7 * len(name)
    body.append(f'<text x="{lx + 10}" y="44" font-size="11" fill="#555">hollow marker: point with failed requests</text>')
    for i, proto in enumerate(protos):
        g = panel(i * PANEL_W, proto, titles.get(proto, proto), data.get(proto, {}), proxies, colors, labels)
        body.append(f'<g transform="translate(0,{legend_h + 30})">' + "".join(g) + "</g>")
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n")
    with open(sys.argv[2], "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
