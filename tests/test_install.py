#!/usr/bin/env python3
"""Installs the build into a temporary root (meson install --destdir), then builds the
embedding examples (examples/embed/reshard.cpp, examples/embed/member.cpp and the C++
block of docs/embedding.md) out of tree with `pkg-config --cflags --libs nereus` alone,
runs them (the member as a node of an installed nereusd's job), and checks their answers
and an error on a bad layout; imports the installed Python module when it was built. Usage: test_install.py BUILD_DIR SOURCE_DIR"""
import glob
import re
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += 0 if ok else 1


def member_node(root, source, cxx, flags, env, run_env, nereusd, nereus):
    exe = os.path.join(root, "member")
    c = subprocess.run([cxx, "-std=c++20", os.path.join(source, "examples", "embed", "member.cpp"), "-o", exe] + flags,
                       capture_output=True, text=True, env=env)
    check(c.returncode == 0, "the C++ member example builds out of tree" + ("" if c.returncode == 0 else ":\n" + c.stderr[-2000:]))
    if c.returncode != 0:
        return
    token = os.path.join(root, "token")
    with open(token, "w") as f:
        f.write("s3cret-token-for-the-install-test\n")
    os.chmod(token, 0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    coord = subprocess.Popen([nereusd, "--coordinator-mode", "--nodes", "2", "--listen", addr, "--token-file", token,
                              "--devices", "host:2:256MiB"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=run_env)
    node = subprocess.Popen([exe, addr, "1", "2", token], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env)
    try:
        for _ in range(100):  # both joined
            r = subprocess.run([nereus, "cluster", "status", "--coordinator", addr, "--token-file", token, "--json"],
                               capture_output=True, text=True, env=run_env)
            if r.returncode == 0 and '"alive":2' in r.stdout.replace(" ", ""):
                break
            time.sleep(0.1)
        r = subprocess.run([nereus, "cluster", "job", "--coordinator", addr, "--token-file", token, "--job", "ppo-tiny",
                            "--node-steps", "--steps", "2"], capture_output=True, text=True, env=run_env, timeout=120)
        out, _ = node.communicate(timeout=60)
        check(r.returncode == 0 and "verified: yes" in r.stdout and "nodes [0,1] ran it" in r.stdout,
              "an installed coordinator runs a job's steps on the C++ member: " + (r.stdout + r.stderr).strip()[-600:])
        check(node.returncode == 0 and "step 1:" in out and "step 2:" in out and "the job ended" in out,
              "the C++ member ran steps 1 and 2 and ended with the job: " + out.strip()[-400:])
    finally:
        for p in (node, coord):
            if p.poll() is None:
                p.terminate()
                p.wait(10)


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

        # A C++ framework node (examples/embed/member.cpp), when the build has the daemons:
        # built out of tree, it joins an installed nereusd coordinator and runs the steps of
        # an installed `nereus cluster job --node-steps`.
        nereusd = glob.glob(os.path.join(root, "**", "bin", "nereusd"), recursive=True)
        nereus = glob.glob(os.path.join(root, "**", "bin", "nereus"), recursive=True)
        if nereusd and nereus:
            member_node(root, source, cxx, flags.stdout.split(), env, run_env, nereusd[0], nereus[0])

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
