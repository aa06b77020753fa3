#!/usr/bin/env python3
"""Kernel time per forward from an Nsight Compute CSV, by kernel name.

Input: the CSV that
  ncu --metrics gpu__time_duration.sum --csv --print-units base --kernel-name-base demangled CMD
prints (its "==PROF==" and program lines before the header are skipped). The launches are cut
into forwards at each launch of a marker kernel (default embedding_fwd_kernel, the first kernel of
a model forward); the kernels before the first marker (set-up) are left out. Printed per kernel
name (namespaces, template and parameter lists dropped): calls and microseconds per forward, the
mean over the complete forwards (those followed by another marker; the last one also when
--last-complete is given) after the first --skip of them (warm-ups), largest first, with each
name's share of the total.

ncu runs each kernel alone with its clocks locked (its default --clock-control base), so the total
is above the time the same kernels take back to back or in a CUDA graph; the shares are what the
breakdown is for.

Usage: kernel_breakdown.py CSV [--marker NAME] [--last-complete] [--skip N] [--json]
"""
import argparse
import csv
import io
import json
import re
import sys


def short_name(name):
    """'void ns::(anonymous)::k<T, 4>(const T*, int)' -> 'k'."""
    n = name
    depth, out = 0, []
    for ch in n:  # drop everything inside (...) and <...>, outermost first
        if ch in "(<":
            depth += 1
        if depth == 0:
            out.append(ch)
        if ch in ")>" and depth > 0:
            depth -= 1
    n = "".join(out).strip()
    n = n.rsplit("::", 1)[-1]
    return n.rsplit(" ", 1)[-1]


def read_launches(text):
    """[(kernel name, nanoseconds)] in launch order."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"') or l.startswith("ID,")), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head = rows[0]
    try:
        ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    except ValueError as e:
        raise ValueError(f"ncu CSV header lacks a column: {e}") from None
    out = []
    for r in rows[1:]:
        if len(r) != len(head) or r[mi] != "gpu__time_duration.sum":
            continue
        out.append((short_name(r[ki]), float(r[vi].replace(",", ""))))
    return out


def breakdown(launches, marker, last_complete=False, skip=0):
    starts = [i for i, (n, _) in enumerate(launches) if n == marker]
    if not starts:
        raise ValueError(f"the marker kernel {marker!r} was never launched")
    bounds = list(zip(starts, starts[1:]))
    if last_complete or len(bounds) == 0:
        bounds.append((starts[-1], len(launches)))
    if skip >= len(bounds):
        raise ValueError(f"--skip {skip} leaves none of the {len(bounds)} forwards")
    bounds = bounds[skip:]
    per = {}
    for s, e in bounds:
        for n, ns in launches[s:e]:
            c = per.setdefault(n, [0, 0.0])
            c[0] += 1
            c[1] += ns
    f = len(bounds)
    rows = [{"kernel": n, "calls": c / f, "us": t / f / 1e3} for n, (c, t) in per.items()]
    rows.sort(key=lambda r: -r["us"])
    total = sum(r["us"] for r in rows)
    for r in rows:
        r["share"] = r["us"] / total if total > 0 else 0.0
    return {"forwards": f, "total_us": total, "kernels": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--marker", default="embedding_fwd_kernel")
    ap.add_argument("--last-complete", action="store_true",
                    help="count the kernels after the last marker as a forward too")
    ap.add_argument("--skip", type=int, default=0, help="forwards to leave out first (warm-ups)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.skip < 0:
        print(f"kernel_breakdown: --skip {a.skip} is negative", file=sys.stderr)
        return 2
    try:
        with open(a.csv, encoding="utf-8", errors="replace") as f:
            b = breakdown(read_launches(f.read()), a.marker, a.last_complete, a.skip)
    except (OSError, ValueError) as e:
        print(f"kernel_breakdown: {a.csv}: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(b, indent=1))
        return 0
    print(f"{b['forwards']} forwards, {b['total_us']:.1f} us of kernels each (ncu clocks)")
    print(f"{'calls':>7} {'us':>9} {'us/call':>8} {'share':>6}  kernel")
    for r in b["kernels"]:
        print(f"{r['calls']:7.1f} {r['us']:9.1f} {r['us'] / r['calls']:8.2f} {100 * r['share']:5.1f}%  {r['kernel']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
