"""Tests of bench/kernel_breakdown.py on small CSVs in the layout ncu writes: forwards cut at the
marker kernel, set-up kernels left out, names shortened, thousands separators, the mean over
forwards (after --skip warm-ups), and the errors for input without a header or without the marker (exit 2).

Usage: python3 test_kernel_breakdown.py [PATH_TO_lockstep]   (the CLI is not used)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "kernel_breakdown.py")
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(i, name, ns):
    return (f'"{i}","1","lockstep","127.0.0.1","{name}","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","ns","{ns}"')


EMB = "lockstep::ops::cuda::<unnamed>::embedding_fwd_kernel(const float *, const int *, long, float *)"
NORM = "void lockstep::ops::<unnamed>::rmsnorm_fwd_kernel<float, 4>(const float *, long)"
GEMM = "nvjet_sm90_tss_64x8_64x16_4x1_v_bz_TNT"


def sample_csv():
    lines = ["==PROF== Connected to process 1", "lockstep bench model (cuda:0)", HEAD]
    seq = [("void fill_kernel(unsigned char *, unsigned long)", "1,000,000")]  # set-up
    for f in range(3):  # three forwards: embedding, two norms, one GEMM
        seq += [(EMB, "2,000"), (NORM, "10,000"), (GEMM, f"{100000 + 1000 * f}"), (NORM, "12,000")]
    seq.append((EMB, "2,000"))  # the start of a fourth, incomplete forward
    lines += [row(i, n, ns) for i, (n, ns) in enumerate(seq)]
    return "\n".join(lines) + "\n"


class KernelBreakdown(unittest.TestCase):
    def run_script(self, text, *args):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        try:
            return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True,
                                  text=True, timeout=60)
        finally:
            os.unlink(f.name)

    def test_mean_over_complete_forwards(self):
        p = self.run_script(sample_csv(), "--json")
        self.assertEqual(p.returncode, 0, p.stderr)
        b = json.loads(p.stdout)
        self.assertEqual(b["forwards"], 3)
        k = {r["kernel"]: r for r in b["kernels"]}
        self.assertEqual(set(k), {"embedding_fwd_kernel", "rmsnorm_fwd_kernel", GEMM})
        self.assertEqual(k["rmsnorm_fwd_kernel"]["calls"], 2)
        self.assertAlmostEqual(k["rmsnorm_fwd_kernel"]["us"], 22.0)
        self.assertAlmostEqual(k[GEMM]["us"], 101.0)
        self.assertAlmostEqual(b["total_us"], 125.0)
        self.assertEqual(b["kernels"][0]["kernel"], GEMM)  # largest first
        self.assertAlmostEqual(sum(r["share"] for r in b["kernels"]), 1.0)

    def test_last_complete_counts_the_tail(self):
        b = json.loads(self.run_script(sample_csv(), "--json", "--last-complete").stdout)
        self.assertEqual(b["forwards"], 4)
        k = {r["kernel"]: r for r in b["kernels"]}
        self.assertAlmostEqual(k["embedding_fwd_kernel"]["calls"], 1.0)
        self.assertAlmostEqual(k["rmsnorm_fwd_kernel"]["calls"], 1.5)

    def test_skip_leaves_out_the_first_forwards(self):
        b = json.loads(self.run_script(sample_csv(), "--json", "--skip", "2").stdout)
        self.assertEqual(b["forwards"], 1)
        k = {r["kernel"]: r for r in b["kernels"]}
        self.assertAlmostEqual(k[GEMM]["us"], 102.0)  # the third forward's GEMM alone
        p = self.run_script(sample_csv(), "--skip", "3")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--skip 3 leaves none of the 3 forwards", p.stderr)

    def test_text_table(self):
        p = self.run_script(sample_csv())
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("3 forwards, 125.0 us", p.stdout)
        self.assertIn("rmsnorm_fwd_kernel", p.stdout)

    def test_refusals(self):
        p = self.run_script("no header here\n")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no ncu CSV header", p.stderr)
        p = self.run_script(sample_csv(), "--marker", "absent_kernel")
        self.assertEqual(p.returncode, 2)
        self.assertIn("absent_kernel", p.stderr)
        p = subprocess.run([sys.executable, SCRIPT, "/nonexistent/x.csv"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
