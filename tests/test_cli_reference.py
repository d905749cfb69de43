"""docs/cli.md is the CLI reference: every option that `--help` lists, of every `nereus`
command and subcommand and of `nereusd`, appears in the section of the docs about that
command. Usage: test_cli_reference.py NEREUS NEREUSD|- docs/cli.md"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, finish  # noqa: E402

NEREUS, NEREUSD, DOC = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
SECTIONS = {block.splitlines()[0]: block for block in re.split(r"\n## ", DOC)}
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def help_text(program, *path):
    r = subprocess.run([program, *path, "--help"], capture_output=True, text=True)
    check(r.returncode == 0, f"{' '.join(path) or program} --help exits 0")
    return r.stdout


def subcommands(text):
    m = re.search(r"Subcommands:\n((?:  \S.*\n)+)", text)
    return [line.split()[0] for line in m.group(1).splitlines()] if m else []


def documented(name, options):
    """The sections that name the command (in their title or in a code span)."""
    body = "\n".join(b for title, b in SECTIONS.items() if name in title or f"`{name}" in b)
    check(bool(body), f"docs/cli.md has a section on `{name}`")
    for o in options:
        check(o in body, f"docs/cli.md documents `{name} {o}`")


def walk(path):
    text = help_text(NEREUS, *path)
    options = sorted(set(OPTION.findall(text)) - {"--help"})
    if path:
        documented("nereus " + " ".join(path), options)
    else:
        documented("nereus", options)  # the global options (--log-level)
    for sub in subcommands(text):
        walk(path + [sub])


walk([])
if NEREUSD != "-":  # built without the cluster layer: no nereusd
    documented("nereusd", sorted(set(OPTION.findall(help_text(NEREUSD))) - {"--help"}))
finish("cli-reference")
