"""End-to-end tests of `lockstep report`: fake run folders (different lengths, missing keys,
NaN/inf/null values, a single-step run, a truncated last line, run_meta.json), the HTML parsed as
XML (plots, polylines per series, legend text, no scripts or external resources), the error for a
folder without metrics.jsonl (exit 2, no output), and, when headless Chromium is installed, a PNG
screenshot that must not be blank.

Usage: python3 test_report.py PATH_TO_lockstep
"""
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
import zlib

LOCKSTEP = None
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SVG = "{http://www.w3.org/2000/svg}"
STAGES = ["time_rollout_s", "time_logprob_s", "time_train_s", "time_sync_s"]


def run(*args):
    return subprocess.run([LOCKSTEP, *args], capture_output=True, text=True, timeout=120)


def write_run(path, rows, meta=None, tail=""):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")  # Python writes NaN / Infinity literals
        f.write(tail)
    if meta is not None:
        with open(os.path.join(path, "run_meta.json"), "w") as f:
            json.dump(meta, f)


def long_run(steps):
    rows = []
    for s in range(1, steps + 1):
        r = {"step": s, "reward_mean": 1 - math.exp(-s / 15), "accuracy": 0.9 * (1 - math.exp(-s / 20)),
             "entropy": 1.5 * math.exp(-s / 30) + 0.2, "mean_abs_gap": 0.01 + 0.002 * math.sin(s),
             "q05_gap": -0.05 - 0.01 * math.cos(s), "elapsed_s": 2.0 * s}
        for i, k in enumerate(STAGES):
            r[k] = 0.5 + 0.1 * i + 0.05 * math.sin(s + i)
        if s % 10 == 0:
            r["eval_accuracy"] = 0.85 * (1 - math.exp(-s / 25))
        rows.append(r)
    rows[5]["reward_mean"] = float("nan")
    rows[6]["entropy"] = float("inf")
    rows[7]["mean_abs_gap"] = None
    return rows


def short_run(steps):
    # no eval, no entropy, no stage times except rollout
    return [{"step": s, "reward_mean": 0.3 + 0.01 * s, "accuracy": 0.2 + 0.01 * s,
             "mean_abs_gap": 0.2 + 0.05 * s, "q05_gap": -1.0 - 0.1 * s, "time_rollout_s": 1.0}
            for s in range(1, steps + 1)]


def parse_html(text):
    body = re.sub(r"^<!DOCTYPE html>\s*", "", text)
    return ET.fromstring(body)  # the whole document is well-formed XML


def plots_of(root):
    return [e for e in root.iter() if e.tag == SVG + "svg"]


def plot_title(svg):
    return svg.find(SVG + "title").text


def classes(svg, tag, cls):
    return [e for e in svg.iter(SVG + tag) if e.get("class") == cls]


def legend_text(svg):
    g = [e for e in svg.iter(SVG + "g") if e.get("class") == "legend"][0]
    return [t.text for t in g.iter(SVG + "text")]


def read_png(path):
    """Minimal PNG decoder (8-bit RGB / RGBA, non-interlaced): returns width, height, pixels."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, f"unsupported PNG {ihdr}"
    bpp = 3 if ctype == 2 else 4
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    pixels = [tuple(r[x * bpp:x * bpp + 3]) for r in rows for x in range(w)]
    return w, h, pixels


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lockstep_report_")
        self.a = os.path.join(self.tmp, "bf16_run")
        self.b = os.path.join(self.tmp, "nvfp4_triage")
        self.c = os.path.join(self.tmp, "one_step")
        write_run(self.a, long_run(60), meta={"recipe": {"name": "bf16"}, "guard": "none",
                                             "deterministic": True})
        write_run(self.b, short_run(35), meta={"recipe": {"name": "nvfp4_per_token"},
                                               "guard": "triage"},
                  tail='{"step": 36, "reward_me')
        write_run(self.c, [{"step": 1, "reward_mean": 0.5, "accuracy": 0.25,
                            "eval_accuracy": 0.3, "time_train_s": 4.0}])
        self.out = os.path.join(self.tmp, "report.html")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def report(self, *extra):
        p = run("report", self.a, self.b, self.c, "-o", self.out, *extra)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p

    def test_plots_series_and_legends(self):
        p = self.report()
        self.assertIn("nvfp4_triage: metrics.jsonl ends with a partial line", p.stderr)
        self.assertIn("| bf16_run | bf16 | = | none | yes |", p.stdout)
        with open(self.out) as f:
            html = f.read()
        self.assertNotIn("<script", html)
        self.assertIsNone(re.search(r'(href|src)="(?!#)', html), "external resource")
        root = parse_html(html)
        plots = plots_of(root)
        titles = [plot_title(s) for s in plots]
        self.assertEqual(len(plots), 9, titles)  # reward, accuracy, entropy, gap, q05, 4 stages
        by_title = dict(zip(titles, plots))
        # Per plot: (polylines of 2+ point series) x 2 and one dot per one-point series.
        expect = {  # title prefix: (series with >= 2 points, one-point series, legend runs)
            "Reward": (2, 1, 3), "Accuracy": (3, 2, 3), "Entropy": (1, 0, 1),
            "Mean |learner": (2, 0, 2), "5th percentile": (2, 0, 2),
            "Stage time: rollout": (2, 0, 2), "Stage time: logprob": (1, 0, 1),
            "Stage time: train": (1, 1, 2), "Stage time: sync": (1, 0, 1)}
        for prefix, (multi, single, legend_runs) in expect.items():
            svg = [s for t, s in by_title.items() if t.startswith(prefix)]
            self.assertEqual(len(svg), 1, prefix)
            svg = svg[0]
            self.assertEqual(len(classes(svg, "polyline", "raw")), multi, prefix)
            self.assertEqual(len(classes(svg, "polyline", "ema")), multi, prefix)
            self.assertEqual(len(classes(svg, "circle", "point")), single, prefix)
            legend = legend_text(svg)
            runs = [t for t in legend if t.split(" ")[0] in ("bf16_run", "nvfp4_triage", "one_step")]
            self.assertEqual(len(runs), legend_runs, (prefix, legend))
            self.assertTrue(any("EMA (beta 0.8)" in t for t in legend), legend)
            for line in svg.iter(SVG + "polyline"):
                for pt in line.get("points").split():
                    x, y = map(float, pt.split(","))
                    self.assertTrue(0 <= x <= 560 and 0 <= y <= float(svg.get("height")), pt)
        legend = legend_text(by_title[[t for t in titles if t.startswith("Reward")][0]])
        self.assertIn("nvfp4_triage (nvfp4_per_token, guard triage)", legend)
        acc = legend_text(by_title[[t for t in titles if t.startswith("Accuracy")][0]])
        self.assertIn("eval_accuracy", acc)
        # NaN / inf / null points are skipped: 59 of 60 reward points, 59 entropy points.
        reward = by_title[[t for t in titles if t.startswith("Reward")][0]]
        counts = sorted(len(l.get("points").split()) for l in classes(reward, "polyline", "raw"))
        self.assertEqual(counts, [35, 59])
        # Axes: tick labels and axis titles.
        texts = [t.text for t in reward.iter(SVG + "text")]
        self.assertIn("step", texts)
        self.assertIn("reward", texts)
        # Summary table: one row per run plus the header.
        table = [e for e in root.iter() if e.tag == "table"][0]
        self.assertEqual(len(list(table.iter("tr"))), 4)
        cells = [c.text for c in list(table.iter("tr"))[1].iter("td")]
        final_eval = 85 * (1 - math.exp(-60 / 25))
        self.assertEqual(cells[1:5], ["bf16", "none", "60", f"{final_eval:.1f}%"])

    def test_json_summary(self):
        p = self.report("--json")
        j = json.loads(p.stdout)
        self.assertEqual(j["plots"], 9)
        self.assertEqual([r["run"] for r in j["runs"]], ["bf16_run", "nvfp4_triage", "one_step"])
        self.assertAlmostEqual(j["runs"][0]["wall_time_s"], 120.0)
        self.assertAlmostEqual(j["runs"][2]["final_eval_accuracy"], 0.3)
        self.assertIsNone(j["runs"][2]["mean_abs_delta"])
        self.assertEqual(len(j["notes"]), 1)

    def test_missing_metrics_is_exit_2_and_writes_nothing(self):
        empty = os.path.join(self.tmp, "not_a_run")
        os.makedirs(empty)
        p = run("report", self.a, empty, "-o", self.out)
        self.assertEqual(p.returncode, 2)
        self.assertIn("lockstep: error:", p.stderr)
        self.assertIn("not_a_run", p.stderr)
        self.assertIn("metrics.jsonl", p.stderr)
        self.assertFalse(os.path.exists(self.out))
        self.assertEqual(run("report", os.path.join(self.tmp, "nope"), "-o", self.out).returncode, 2)
        self.assertEqual(run("report", self.a, "--smoothing", "1", "-o", self.out).returncode, 2)
        self.assertFalse(os.path.exists(self.out))
        self.assertEqual(os.listdir(self.tmp).count("report.html"), 0)

    def test_malformed_line_is_exit_2(self):
        with open(os.path.join(self.c, "metrics.jsonl"), "a") as f:
            f.write("garbage\n")
        p = run("report", self.c, "-o", self.out)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("metrics.jsonl:2", p.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_screenshot_is_not_blank(self):
        browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        if not browser:
            self.skipTest("no headless Chromium (apt-get install chromium): screenshot not checked")
        self.report()
        png = os.path.join(self.tmp, "report.png")
        p = subprocess.run([os.path.join(ROOT, "scripts", "report-screenshot"), self.out, png,
                            "1280", "1400"], capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        w, h, px = read_png(png)
        self.assertEqual((w, h), (1280, 1400))
        white = sum(1 for q in px if q == (255, 255, 255))
        self.assertLess(white, 0.97 * len(px), "screenshot is (almost) blank")
        # The first two run colours (#1f77b4, #d62728) are drawn: pixels near each hue.
        def near(q, c):
            return all(abs(a - b) <= 40 for a, b in zip(q, c))
        for colour in ((0x1f, 0x77, 0xb4), (0xd6, 0x27, 0x28)):
            self.assertGreater(sum(1 for q in px if near(q, colour)), 200, colour)
        if os.environ.get("LOCKSTEP_KEEP_SCREENSHOT"):
            shutil.copy(png, os.environ["LOCKSTEP_KEEP_SCREENSHOT"])


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    LOCKSTEP = os.path.abspath(sys.argv.pop(1))
    unittest.main()
