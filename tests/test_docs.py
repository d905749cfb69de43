#!/usr/bin/python3
"""Runs every ```python block of a doc (docs/embedding.md) as its own script, so the docs
cannot rot. Usage: test_docs.py DOC.md (PYTHONPATH must reach the nereus module)."""
import re
import subprocess
import sys
import tempfile


def main(doc):
    blocks = re.findall(r"```python\n(.*?)```", open(doc).read(), re.S)
    if not blocks:
        print(f"{doc}: no python blocks")
        return 1
    failed = 0
    for i, code in enumerate(blocks):
        with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
            f.write(code)
            f.flush()
            r = subprocess.run([sys.executable, f.name], capture_output=True, text=True, timeout=120)
        ok = r.returncode == 0
        failed += not ok
        print(("ok   " if ok else "FAIL ") + f"{doc} python block {i + 1}" + ("" if ok else ":\n" + r.stdout + r.stderr))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
