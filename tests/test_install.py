#!/usr/bin/env python3
"""Installs the build into a temporary root (meson install --destdir), then builds the
embedding examples (examples/embed/reshard.cpp and the C++ block of docs/embedding.md)
out of tree with `pkg-config --cflags --libs nereus` alone, runs them, and checks their
answers and an error on a bad layout; imports the installed Python module when it was
built. Usage: test_install.py BUILD_DIR SOURCE_DIR"""
import glob
import re
import os
import shutil
import subprocess
import sys
import tempfile

failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += 0 if ok else 1


def main(build, source):
    root = tempfile.mkdtemp(prefix="nereus-install-")
    try:
        r = subprocess.run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", root, "--quiet"],
                           capture_output=True, text=True)
        check(r.returncode == 0, "meson install --destdir " + (r.stderr.strip()[-400:] if r.returncode else ""))
        pcs = glob.glob(os.path.join(root, "**", "pkgconfig", "nereus.pc"), recursive=True)
        check(len(pcs) == 1, "nereus.pc installed")
        headers = glob.glob(os.path.join(root, "**", "include", "nereus", "runtime", "job.hpp"), recursive=True)
        check(len(headers) == 1, "public headers installed")
        libs = glob.glob(os.path.join(root, "**", "libnereus.so*"), recursive=True)
        check(len(libs) > 0, "libnereus.so installed")
        for exe in ("nereus", "nereusd"):
            check(len(glob.glob(os.path.join(root, "**", "bin", exe), recursive=True)) == 1, exe + " installed")
        if not pcs or not libs:
            return
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]), PKG_CONFIG_SYSROOT_DIR=root)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "nereus"], capture_output=True, text=True, env=env)
        check(flags.returncode == 0 and "-lnereus" in flags.stdout, "pkg-config --cflags --libs nereus: " +
              (flags.stdout.strip() or flags.stderr.strip()))
        exe = os.path.join(root, "reshard")
        cxx = os.environ.get("CXX", "c++")
        c = subprocess.run([cxx, "-std=c++20", os.path.join(source, "examples", "embed", "reshard.cpp"), "-o", exe]
                           + flags.stdout.split(), capture_output=True, text=True, env=env)
        check(c.returncode == 0, "the example builds out of tree with pkg-config alone" +
              ("" if c.returncode == 0 else ":\n" + c.stderr[-2000:]))
        if c.returncode != 0:
            return
        run_env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(libs[0]))
        run_env.pop("NEREUS_SHARED", None)  # the installed library carries its presets
        r = subprocess.run([exe], capture_output=True, text=True, env=run_env, timeout=120)
        check(r.returncode == 0 and "verified every destination byte" in r.stdout,
              "the example reshards tiny-llama tp=4 -> tp=2,dp=2 and verifies: " + r.stdout.strip() + r.stderr.strip())
        r = subprocess.run([exe, "tiny-llama", "tp=3,pp=1,dp=1", "tp=1,pp=1,dp=1"], capture_output=True, text=True,
                           env=run_env, timeout=60)
        check(r.returncode == 2 and r.stderr.startswith("reshard: error: --from tp=3") and r.stderr.count("\n") == 1,
              "a bad layout gives one clear error: " + r.stderr.strip())

        # The C++ example of docs/embedding.md.
        doc = open(os.path.join(source, "docs", "embedding.md")).read()
        blocks = re.findall(r"```cpp\n(.*?)```", doc, re.S)
        check(len(blocks) == 1, "docs/embedding.md has one C++ example")
        if blocks:
            src = os.path.join(root, "doc_example.cpp")
            with open(src, "w") as f:
                f.write(blocks[0])
            c = subprocess.run([cxx, "-std=c++20", src, "-o", exe + "-doc"] + flags.stdout.split(),
                               capture_output=True, text=True, env=env)
            check(c.returncode == 0, "the docs' C++ example builds" + ("" if c.returncode == 0 else ":\n" + c.stderr[-2000:]))
            if c.returncode == 0:
                r = subprocess.run([exe + "-doc"], capture_output=True, text=True, env=run_env, timeout=120)
                check(r.returncode == 0 and "0 wrong bytes" in r.stdout, "the docs' C++ example runs: " + r.stdout.strip() + r.stderr.strip())

        # The Python module, when this build has it.
        inits = glob.glob(os.path.join(root, "**", "nereus", "__init__.py"), recursive=True)
        built = glob.glob(os.path.join(build, "python", "nereus", "_nereus*.so"))
        if built:
            exts = glob.glob(os.path.join(root, "**", "nereus", "_nereus*.so"), recursive=True)
            check(len(inits) == 1 and len(exts) == 1, "the Python module is installed: " + " ".join(inits + exts))
            if inits:
                py_env = dict(run_env, PYTHONPATH=os.path.dirname(os.path.dirname(inits[0])))
                r = subprocess.run(["/usr/bin/python3", "-c",
                                    "import nereus; print(nereus.Job('ppo-tiny', {s: 'tp=1,pp=1,dp=1,devices=0' for s in "
                                    "['actor/generate', 'actor/infer', 'critic/infer', 'reference/infer', 'reward/infer', "
                                    "'actor/train', 'critic/train']}, devices=1, capacity='256MiB').plan['actor/train'])"],
                                   capture_output=True, text=True, env=py_env, timeout=120)
                check(r.returncode == 0 and "tp=1" in r.stdout, "the installed module imports and runs a job: " +
                      r.stdout.strip() + r.stderr.strip()[-800:])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    print(f"install: {'FAILED' if failed else 'passed'}")
    sys.exit(1 if failed else 0)
