"""lockstep on torch tensors, CPU and CUDA: quantize equals `lockstep quantize` on the same values
(every format and scaling; CUDA equals the CPU), zero-copy in and out (the data pointer lockstep
reads is the tensor's; no device-to-host copies; parts are CUDA tensors over lockstep's memory),
the caller's current stream, lockstep.torch.Linear / GroupedLinear forward and gradients equal to
the C++ nn modules bit for bit for each backward mode, autocast, quantized_model_init, and bad
input raising lockstep.Error. Skipped, with the reason printed, where torch (or a GPU) is missing.

Usage: PYTHONPATH=BUILD/python python3 test_torch.py PATH_TO_lockstep
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

import lockstep
from lockstep import _lockstep

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "py"))
from st_files import read_st  # noqa: E402

try:
    import torch
    HAVE_TORCH, WHY = True, ""
except ImportError:
    HAVE_TORCH, WHY = False, "torch is not installed (the torch tests run where it is, e.g. scripts/python-check on the GPU machine)"

HAVE_CUDA = HAVE_TORCH and torch.cuda.is_available() and lockstep.cuda_compiled
WHY_CUDA = WHY or ("no CUDA device visible to torch" if not torch.cuda.is_available()
                   else "this lockstep build has no CUDA backend (LOCKSTEP_CUDA=ON)")
CLI = None
SEED = int(os.environ.get("LOCKSTEP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
CASES = [("nvfp4", "per_tensor", {}), ("nvfp4", "per_row", {"colwise": True}),
         ("nvfp4", "per_tensor", {"block2d": True}), ("nvfp4", "per_row", {"hadamard": True}),
         ("nvfp4", "per_tensor", {"stochastic": True, "seed": 3}),
         ("mxfp8", "block_1x32", {"colwise": True}), ("mxfp8", "block_1x32", {"elem": "e5m2"}),
         ("fp8", "per_tensor", {}), ("fp8", "per_row", {"colwise": True}),
         ("fp8", "block_1x128", {"colwise": True}), ("fp8", "block_128x128", {"pow2": True})]
RECIPES = ["bf16", "nvfp4_per_token", "nvfp4_per_token_bf16_bwd", "nvfp4_per_token_dequant_bwd",
           "mxfp8", "fp8_block"]


def cli_quantize(x, fmt, scaling, opts, tmp):
    from safetensors.torch import save_file

    inp, outp = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
    save_file({"w": x.cpu().contiguous()}, inp)
    args = [CLI, "quantize", inp, "-o", outp, "--format", fmt, "--scaling", scaling]
    for k, v in opts.items():
        args += {"colwise": ["--colwise"], "block2d": ["--block2d"], "hadamard": ["--hadamard"],
                 "pow2": ["--pow2"], "stochastic": ["--stochastic"], "seed": ["--seed", str(v)],
                 "elem": ["--elem", str(v)]}[k]
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    return read_st(outp)[0]


def file_part(p):
    base, col = (p[:-8], "_colwise") if p.endswith("_colwise") else (p, "")
    return {"data": "qdata"}.get(base, base) + col


@unittest.skipUnless(HAVE_TORCH, WHY)
class TorchImport(unittest.TestCase):
    def test_lockstep_imported_before_torch(self):
        # A fresh process that imports lockstep first (nothing else loaded the C++ runtime yet),
        # then torch, then uses both.
        code = ("import lockstep, torch; import numpy as np; "
                "q = lockstep.quantize(np.ones((16, 16), np.float32), 'fp8'); "
                "print(float(torch.ones(3).sum()), q.dequantize().shape)")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("3.0 (16, 16)", p.stdout)


@unittest.skipUnless(HAVE_TORCH, WHY)
class TorchQuantize(unittest.TestCase):
    def devices(self):
        return ["cpu"] + (["cuda"] if HAVE_CUDA else [])

    def test_matches_cli_every_format(self):
        g = torch.Generator().manual_seed(SEED)
        with tempfile.TemporaryDirectory() as tmp:
            for dtype in (torch.float32, torch.bfloat16):
                for fmt, scaling, opts in CASES:
                    x = (torch.randn(256, 256, generator=g) * 3).to(dtype)
                    want = cli_quantize(x, fmt, scaling, opts, tmp)
                    for dev in self.devices():
                        ctx = f"[LOCKSTEP_TEST_SEED={SEED}] {dtype} {fmt} {scaling} {opts} {dev}"
                        q = lockstep.quantize(x.to(dev), fmt, scaling, name="w", **opts)
                        self.assertEqual(q.device.split(":")[0], dev, ctx)
                        for p, t in q.parts().items():
                            self.assertIsInstance(t, torch.Tensor, ctx)
                            self.assertEqual(t.device.type, dev, ctx)
                            got = t.cpu().contiguous().view(torch.uint8).numpy().tobytes()
                            self.assertEqual(got, want[f"w.{file_part(p)}"][2], f"{ctx} {p}")

    def test_typed_views_and_dequantize(self):
        x = torch.randn(64, 64)
        q = lockstep.quantize(x, "mxfp8", colwise=True)
        self.assertEqual(q.typed("data").dtype, torch.float8_e4m3fn)
        self.assertEqual(q.typed("block_scale").dtype, torch.float8_e8m0fnu)
        d = q.dequantize()
        self.assertEqual(d.dtype, torch.float32)
        self.assertEqual(q.dequantize("bf16").dtype, torch.bfloat16)
        self.assertTrue(torch.equal(q.dequantize("bf16"), d.to(torch.bfloat16)))
        # requires_grad inputs are read without autograd
        lockstep.quantize(torch.randn(16, 32, requires_grad=True), "nvfp4")

    def test_zero_copy_cpu(self):
        x = torch.randn(32, 64)
        self.assertEqual(_lockstep._data_ptr(x), x.data_ptr())
        q = lockstep.quantize(x, "nvfp4", "per_row")
        self.assertEqual(q.data.data_ptr(), q.handle._part_ptr("data"))

    def test_bad_input(self):
        x = torch.randn(32, 64)
        for fn, words in ((lambda: lockstep.quantize(x.t(), "nvfp4"), ("x", "contiguous")),
                          (lambda: lockstep.quantize(x.to(torch.int32), "nvfp4"), ("x", "I32")),
                          (lambda: lockstep.quantize(x[:, :40].contiguous(), "nvfp4"), ("x", "16"))):
            with self.assertRaises(lockstep.Error) as cm:
                fn()
            for w in words:
                self.assertIn(w, str(cm.exception))


@unittest.skipUnless(HAVE_CUDA, WHY_CUDA)
class TorchCuda(unittest.TestCase):
    def test_zero_copy_and_no_host_round_trip(self):
        x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
        self.assertEqual(_lockstep._data_ptr(x), x.data_ptr())
        before = lockstep.device_to_host_copies()
        q = lockstep.quantize(x, "nvfp4", "per_row", colwise=True)
        w = lockstep.quantize(torch.randn(256, 1024, device="cuda"), "nvfp4", "per_row")
        r = lockstep.qgemm(q, w)
        d = q.dequantize()
        torch.cuda.synchronize()
        self.assertEqual(lockstep.device_to_host_copies(), before)
        for name in q.handle.parts():
            t = q.part(name)
            self.assertTrue(t.is_cuda)
            self.assertEqual(t.data_ptr(), q.handle._part_ptr(name), name)
        self.assertTrue(r.d.is_cuda and d.is_cuda)
        self.assertTrue(torch.equal(d.cpu(), lockstep.quantize(x.cpu(), "nvfp4", "per_row").dequantize()))

    def test_current_stream_and_explicit_stream(self):
        x = torch.randn(1024, 2048, device="cuda")
        want = lockstep.quantize(x, "nvfp4", "per_row").data.cpu()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            y = x * 1.0  # queued on s: lockstep must run after it on s
            q = lockstep.quantize(y, "nvfp4", "per_row")
            got = q.data.clone()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(got.cpu(), want))
        q2 = lockstep.quantize(x, "nvfp4", "per_row", stream=s)
        s.synchronize()
        self.assertTrue(torch.equal(q2.data.cpu(), want))

    def test_stream_of_another_device(self):
        if torch.cuda.device_count() < 2:
            self.skipTest("needs 2 GPUs")
        s1 = torch.cuda.Stream(device=1)
        with self.assertRaises(lockstep.Error) as cm:
            lockstep.quantize(torch.randn(16, 32, device="cuda:0"), "nvfp4", stream=s1)
        self.assertIn("cuda:1", str(cm.exception))

    def test_to_device_round_trip(self):
        q = lockstep.quantize(torch.randn(64, 64), "fp8", "block_1x128", colwise=True)
        back = q.to("cuda").to("cpu")
        for p, t in q.parts().items():
            self.assertTrue(torch.equal(t, back.part(p)), p)


def cuda_modules_reason():
    """Why the nn modules cannot run on CUDA in this build ('' when they can): probed with one
    tiny forward, so these tests start covering CUDA as soon as the nn layer runs there."""
    if not HAVE_CUDA:
        return WHY_CUDA
    from lockstep._modules import LinearCall

    w = torch.zeros(16, 32, device="cuda")
    try:
        LinearCall("probe", w, None, lockstep.Recipe.from_name("bf16")).forward(
            torch.zeros(2, 32, device="cuda"), False)
    except Exception as e:  # noqa: BLE001 - the reason is printed, whatever it is
        return f"the nn modules do not run on CUDA in this build: {e}"
    return ""


@unittest.skipUnless(HAVE_TORCH, WHY)
class TorchModules(unittest.TestCase):
    def devices(self):
        why = cuda_modules_reason()
        if why:
            print(f"\n  lockstep.torch modules on CPU only: {why}", flush=True)
        return ["cpu"] + ([] if why else ["cuda"])

    def reference(self, w, x, dy, recipe, seed, dev="cpu"):
        """The C++ nn::Linear run directly on arrays of device `dev` (what the C++ learner runs
        there; CPU and CUDA GEMMs agree within docs/gemm.md's bound, not bit for bit)."""
        from lockstep._modules import LinearCall

        if dev != "cpu":
            w, x, dy = (torch.from_numpy(a).to(dev) for a in (w, x, dy))
        g = torch.zeros_like(w) if dev != "cpu" else np.zeros_like(w)
        call = LinearCall("linear", w, g, lockstep.Recipe.from_name(recipe), grad_seed=seed)
        y = torch.from_dlpack(call.forward(x, True)).cpu().numpy().copy()
        dx = torch.from_dlpack(call.backward(dy)).cpu().numpy().copy()
        g = g.cpu().numpy() if dev != "cpu" else g
        return y, dx, g

    def test_linear_equals_cpp_each_backward_mode(self):
        import lockstep.torch as lt

        gen = torch.Generator().manual_seed(SEED)
        for recipe in RECIPES:
            for dev in self.devices():
                layer = lt.Linear(64, 48, recipe=recipe, device=dev)
                layer.grad_seed = 5
                x = torch.randn(3, 8, 64, generator=gen).to(dev).requires_grad_(True)
                dy = torch.randn(3, 8, 48, generator=gen).to(dev)
                y = layer(x)
                y.backward(dy)
                w = layer.weight.detach().cpu().numpy()
                ry, rdx, rg = self.reference(w, x.detach().cpu().reshape(24, 64).numpy(),
                                             dy.cpu().reshape(24, 48).numpy(), recipe, 5, dev)
                ctx = f"{recipe} {dev} [seed {SEED}]"
                self.assertEqual(y.detach().cpu().reshape(24, 48).numpy().tobytes(), ry.tobytes(), ctx)
                self.assertEqual(x.grad.cpu().reshape(24, 64).numpy().tobytes(), rdx.tobytes(), ctx)
                self.assertEqual(layer.weight.grad.cpu().numpy().tobytes(), rg.tobytes(), ctx)

    def test_autocast_and_bf16_inputs(self):
        import lockstep.torch as lt

        layer = lt.Linear(32, 16)
        x = torch.randn(4, 32)
        with lt.autocast(recipe="nvfp4_per_token"):
            y = layer(x)
        ref = self.reference(layer.weight.detach().numpy(), x.numpy(), np.zeros((4, 16), np.float32),
                             "nvfp4_per_token", 0)[0]
        self.assertEqual(y.detach().numpy().tobytes(), ref.tobytes())
        with lt.autocast(enabled=False):
            yb = layer(x)
        self.assertFalse(torch.equal(y, yb))
        yh = layer(x.to(torch.bfloat16))
        self.assertEqual(yh.dtype, torch.bfloat16)

    def test_grouped_linear(self):
        import lockstep.torch as lt
        from lockstep._modules import GroupedLinearCall

        layer = lt.GroupedLinear(3, 64, 32, recipe="nvfp4_per_token")
        x = torch.randn(40, 64, requires_grad=True)
        splits = [16, 0, 24]
        y = layer(x, splits)
        dy = torch.randn(40, 32)
        y.backward(dy)
        w = layer.weight.detach().numpy()
        g = np.zeros_like(w)
        call = GroupedLinearCall("grouped_linear", w, g, 3, lockstep.Recipe.from_name("nvfp4_per_token"))
        ry = np.from_dlpack(call.forward(x.detach().numpy(), splits, True)).copy()
        rdx = np.from_dlpack(call.backward(dy.numpy())).copy()
        self.assertEqual(y.detach().numpy().tobytes(), ry.tobytes())
        self.assertEqual(x.grad.numpy().tobytes(), rdx.tobytes())
        self.assertEqual(layer.weight.grad.numpy().tobytes(), g.tobytes())
        with self.assertRaises(lockstep.Error):
            layer(x, [16, 24])

    def test_quantized_model_init(self):
        import lockstep.torch as lt

        with lt.quantized_model_init(recipe="nvfp4_per_token"):
            layer = lt.Linear(64, 32)
        self.assertIsNone(layer.weight)
        qw = layer.quantized_weight()
        self.assertIsInstance(qw, lockstep.QTensor)
        with torch.no_grad():
            y = layer(torch.randn(5, 64))
        self.assertEqual(y.shape, (5, 32))
        with self.assertRaises(lockstep.Error):
            layer(torch.randn(5, 64, requires_grad=True))


if __name__ == "__main__":
    CLI = os.path.abspath(sys.argv.pop(1))
    print(f"LOCKSTEP_TEST_SEED={SEED}", flush=True)
    if not HAVE_TORCH:
        print(f"skipping the torch tests: {WHY}", flush=True)
    elif not HAVE_CUDA:
        print(f"skipping the CUDA torch tests: {WHY_CUDA}", flush=True)
    unittest.main(verbosity=1)
