"""The layer rule of docs/DESIGN.md, checked on the sources: each layer includes only the layers
before it in DESIGN's table (numerics, tensor, quant, gemm, recipe, ops, nn, model, diag, rl, cli).
The order is read from the table itself, so the document and the code cannot drift apart.

Usage: test_layers.py LOCKSTEP_BINARY (the binary is not used; ctest passes it to every test)."""
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def design_layers():
    """Layer names in table order, from the rows `| name | `folder/` | ... |`."""
    text = open(os.path.join(ROOT, "docs", "DESIGN.md"), encoding="utf-8").read()
    return re.findall(r"^\| (\w+) \| `(\w+)/` \|", text, re.M)


def include_edges():
    """(file, line, from_layer, to_layer, include) for every project include of src/ and
    include/lockstep/ that names a layer folder, by the lockstep/ path or a relative path."""
    layers = {folder for _, folder in design_layers()}
    for base in ("src", os.path.join("include", "lockstep")):
        top = os.path.join(ROOT, base)
        for dirpath, _, files in os.walk(top):
            rel = os.path.relpath(dirpath, top)
            src_layer = rel.split(os.sep)[0]
            if src_layer not in layers:
                continue
            for name in files:
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if inc.startswith("lockstep/"):
                            parts = inc.split("/")
                            dst = parts[1] if len(parts) > 2 else None
                        else:
                            target = os.path.normpath(os.path.join(dirpath, inc))
                            r = os.path.relpath(target, os.path.join(ROOT, "src"))
                            dst = None if r.startswith("..") else r.split(os.sep)[0]
                        if dst in layers:
                            yield os.path.relpath(path, ROOT), number, src_layer, dst, inc


class Layers(unittest.TestCase):
    def test_design_lists_every_layer_folder(self):
        folders = [folder for _, folder in design_layers()]
        self.assertEqual(folders[:3], ["numerics", "tensor", "quant"])
        self.assertEqual(folders[-1], "cli")
        for d in os.listdir(os.path.join(ROOT, "src")):
            if os.path.isdir(os.path.join(ROOT, "src", d)):
                self.assertIn(d, folders, f"src/{d} is not a layer of docs/DESIGN.md")

    def test_each_layer_includes_only_the_layers_before_it(self):
        order = {folder: i for i, (_, folder) in enumerate(design_layers())}
        bad = [f"{f}:{n}: {a} includes {b} ({inc})"
               for f, n, a, b, inc in include_edges() if order[b] > order[a]]
        self.assertEqual(bad, [], "includes against the layer order of docs/DESIGN.md")

    def test_the_check_sees_includes(self):
        # The scan finds includes at all (a broken pattern would pass the rule trivially).
        edges = list(include_edges())
        self.assertGreater(len(edges), 100)
        self.assertTrue(any(a == "rl" and b == "diag" for _, _, a, b, _ in edges))


if __name__ == "__main__":
    if len(sys.argv) >= 2:
        sys.argv.pop(1)
    unittest.main()
