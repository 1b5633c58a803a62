#!/usr/bin/env python3
"""clang-format and clang-tidy over the tree, against a committed baseline.

The checked-in .clang-format and .clang-tidy describe the style; the tree
predates them, so the findings that existed when the checks were switched on
are recorded in deploy/lint/ as accepted. A check fails when a file gains a
finding the baseline does not accept (a file's clang-format count grows, or a
clang-tidy check fires more often in a file than the baseline says); fixing
findings never fails, and --update-baseline records the smaller counts.

  lint.py internal-includes
      A header under D/internal/ is private to component D: only files under
      D (and tests, which test internals) may include it; the few edges
      allowed across (a dispatcher choosing its backend's tables) are listed
      in INTERNAL_INCLUDE_EXCEPTIONS. No baseline: the tree is clean.
  lint.py format [--update-baseline]
      clang-format-14 --dry-run over every tracked C++ file (seconds).
  lint.py tidy --build-dir DIR [--all] [--jobs N] [--update-baseline]
      clang-tidy-14 over the tracked .cc files of DIR/compile_commands.json.
      By default only files whose content differs from the baseline's hash
      are analysed (the per-commit tier: cost grows with the drift since the
      baseline was last updated, and CI prints it); --all re-analyses every
      file (the long tier). --update-baseline records the findings of the
      files analysed (with --all: of every file) as accepted.

Exit status: 0 clean, 1 new findings (each printed as file:line: message),
2 usage or tool errors.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BASELINE_DIR = os.path.join(REPO, "deploy", "lint")
FORMAT_BASELINE = os.path.join(BASELINE_DIR, "clang-format-baseline.json")
TIDY_BASELINE = os.path.join(BASELINE_DIR, "clang-tidy-baseline.json")
CLANG_FORMAT = "clang-format-14"
CLANG_TIDY = "clang-tidy-14"

# "path:line:col: warning: message [check-name]"
TIDY_FINDING = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: (?:warning|error): "
                          r"(?P<msg>.*) \[(?P<check>[\w.,-]+)\]$")
FORMAT_FINDING = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: (?:warning|error): ")


def die(message):
    print(f"lint: {message}", file=sys.stderr)
    sys.exit(2)


def tracked_files(*patterns):
    out = subprocess.run(["git", "-C", REPO, "ls-files", "--", *patterns],
                         check=True, capture_output=True, text=True).stdout
    return sorted(line for line in out.splitlines() if line)


def sha256(path):
    with open(os.path.join(REPO, path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_json(path, default):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")


def relative(path):
    return os.path.relpath(os.path.realpath(path), REPO)


def check_tool(tool):
    try:
        subprocess.run([tool, "--version"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        die(f"{tool} not found (deploy/scripts/install_deps.sh installs it)")


# (including file, private component) pairs allowed to cross.
INTERNAL_INCLUDE_EXCEPTIONS = {
    # The kernel dispatchers pick the CPU backend's SIMD tables at start-up.
    ("kernels/kernels.cc", "kernels/cpu"),
    ("kernels/quantized.cc", "kernels/cpu"),
    # Times the CUDA kernels on device buffers (the backend copies every call).
    ("bench/cuda_matmul_bench.cc", "kernels/cuda"),
}
INTERNAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"(?P<component>[^"]+)/internal/[^"]+"')


def run_internal_includes(_args):
    bad = []
    files = tracked_files("*.cc", "*.h", "*.cu", "*.cuh")
    for path in files:
        if path.startswith("tests/"):
            continue
        with open(os.path.join(REPO, path), errors="replace") as f:
            for number, line in enumerate(f, start=1):
                m = INTERNAL_INCLUDE.match(line)
                if not m:
                    continue
                component = m["component"]
                if path.startswith(component + "/") or (path, component) in INTERNAL_INCLUDE_EXCEPTIONS:
                    continue
                bad.append(f"{path}:{number}: includes a private header of {component}/ "
                           f"({line.strip()}); use the component's public header")
    for b in bad:
        print(b)
    print(f"lint internal-includes: {len(files)} files, {len(bad)} private includes across components")
    return 1 if bad else 0


def run_format(args):
    check_tool(CLANG_FORMAT)
    files = tracked_files("*.cc", "*.h", "*.cu", "*.cuh")
    counts = {}
    samples = {}
    # clang-format reports every reformatting it would make as a warning; the
    # number of them per file is the measure the baseline keeps.
    for start in range(0, len(files), 64):
        batch = files[start:start + 64]
        proc = subprocess.run([CLANG_FORMAT, "--dry-run", *batch], cwd=REPO,
                              capture_output=True, text=True)
        for line in proc.stderr.splitlines():
            m = FORMAT_FINDING.match(line)
            if m:
                f = relative(os.path.join(REPO, m["file"]))
                counts[f] = counts.get(f, 0) + 1
                samples.setdefault(f, f"{f}:{m['line']}")
    if args.update_baseline:
        write_json(FORMAT_BASELINE, counts)
        print(f"lint format: baseline written ({sum(counts.values())} findings in "
              f"{len(counts)} of {len(files)} files)")
        return 0
    baseline = load_json(FORMAT_BASELINE, {})
    worse = [(f, n, baseline.get(f, 0)) for f, n in sorted(counts.items())
             if n > baseline.get(f, 0)]
    better = sum(1 for f, n in baseline.items() if counts.get(f, 0) < n)
    for f, n, allowed in worse:
        print(f"{samples[f]}: clang-format: {n} reformattings, baseline accepts {allowed} "
              f"(run: {CLANG_FORMAT} -i {f})")
    print(f"lint format: {len(files)} files, {sum(counts.values())} findings, "
          f"{len(worse)} files worse than the baseline, {better} better")
    return 1 if worse else 0


# A target with a shared precompiled header (cmake/precompiled_headers.cmake)
# is compiled with "-include .../cmake_pch.hxx" (gcc also finds the .gch
# beside it). clang-tidy parses each file without it, as if it had no
# precompiled header: clang cannot read gcc's .gch, and a file that compiles
# only because the header already included what it uses should be found here.
PCH_INCLUDE = re.compile(r"(?:-Xclang )?-include (?:-Xclang )?(\S*/cmake_pch\.hxx)(?=\s|$)")
PCH_FLAGS = re.compile(r"\s(?:-Winvalid-pch|-Xclang -include-pch -Xclang \S+|"
                       r"-fpch-instantiate-templates)(?=\s|$)")
NODISCARD_HEADER = os.path.join(REPO, "common", "base", "status_nodiscard.h")


def compile_database_without_pch(build_dir, out_dir):
    """Writes build_dir's compile database into out_dir, minus precompiled headers.

    Returns the number of commands rewritten. The precompiled header's first
    include (status_nodiscard.h) is force-included in its place, as in a
    build without precompiled headers.
    """
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    # The carriers' own entries compile the header itself; nothing to lint.
    entries = [e for e in entries if not e["file"].endswith("cmake_pch.hxx.cxx")]
    rewritten = 0
    for entry in entries:
        command = entry.get("command")
        if command is None or "cmake_pch.hxx" not in command:
            continue
        command = PCH_FLAGS.sub("", command)
        command = PCH_INCLUDE.sub(f"-include {NODISCARD_HEADER}", command)
        if "cmake_pch" in command:
            die(f"could not remove the precompiled header from the command of {entry['file']}")
        entry["command"] = command
        rewritten += 1
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compile_commands.json"), "w") as f:
        json.dump(entries, f)
    return rewritten


def tidy_one(build_dir, path):
    # -Werror as CI's build (VC_WERROR=ON) has it: clang-diagnostic findings
    # that are only warnings in a build without it (-Woverloaded-virtual, for
    # one) show up as errors in CI, so a local run shows them too.
    proc = subprocess.run([CLANG_TIDY, "-p", build_dir, "--quiet", "--extra-arg=-Werror", path],
                          cwd=REPO, capture_output=True, text=True)
    findings = []
    for line in proc.stdout.splitlines():
        m = TIDY_FINDING.match(line)
        if m and relative(os.path.join(REPO, m["file"])) == path:
            for check in m["check"].split(","):
                findings.append((check, int(m["line"]), m["msg"]))
    # clang-tidy exits non-zero for compiler errors as well as findings; a file
    # it could not parse shows up as clang-diagnostic-error findings.
    return path, findings


def run_tidy(args):
    check_tool(CLANG_TIDY)
    db_path = os.path.join(args.build_dir, "compile_commands.json")
    if not os.path.exists(db_path):
        die(f"{db_path} not found: configure and build that directory first")
    with open(db_path) as f:
        in_db = {relative(os.path.join(e["directory"], e["file"])) for e in json.load(f)}
    files = [f for f in tracked_files("*.cc") if f in in_db]
    baseline = load_json(TIDY_BASELINE, {})
    todo = files if args.all else [
        f for f in files if baseline.get(f, {}).get("sha256") != sha256(f)]
    print(f"lint tidy: {len(files)} files in the build, analysing {len(todo)} "
          f"({'all' if len(todo) == len(files) else 'changed since the baseline'})", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lint-tidy-") as db_dir, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        compile_database_without_pch(args.build_dir, db_dir)
        for done, (path, findings) in enumerate(
                pool.map(lambda p: tidy_one(db_dir, p), todo), start=1):
            results[path] = findings
            if done % 20 == 0 or done == len(todo):
                print(f"lint tidy: {done}/{len(todo)}", flush=True)
    if args.update_baseline:
        out = {}
        for path in files:
            if path not in results:  # unchanged since the baseline: keep its entry
                out[path] = baseline[path]
                continue
            counts = {}
            for check, _, _ in results.get(path, []):
                counts[check] = counts.get(check, 0) + 1
            out[path] = {"sha256": sha256(path), "findings": counts}
        write_json(TIDY_BASELINE, out)
        total = sum(sum(v["findings"].values()) for v in out.values())
        print(f"lint tidy: baseline written ({total} findings in {len(out)} files)")
        return 0
    new = 0
    for path, findings in sorted(results.items()):
        allowed = baseline.get(path, {}).get("findings", {})
        by_check = {}
        for check, line, msg in findings:
            by_check.setdefault(check, []).append((line, msg))
        for check, hits in sorted(by_check.items()):
            if len(hits) > allowed.get(check, 0):
                new += len(hits) - allowed.get(check, 0)
                for line, msg in hits:
                    print(f"{path}:{line}: {msg} [{check}] "
                          f"({len(hits)} in this file, baseline accepts {allowed.get(check, 0)})")
    print(f"lint tidy: {len(todo)} files analysed, {new} findings beyond the baseline")
    return 1 if new else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("internal-includes", help="internal/ headers stay inside their component")
    fmt = sub.add_parser("format", help="clang-format against the baseline")
    fmt.add_argument("--update-baseline", action="store_true")
    tidy = sub.add_parser("tidy", help="clang-tidy against the baseline")
    tidy.add_argument("--build-dir", required=True)
    tidy.add_argument("--all", action="store_true", help="analyse every file, not just changed ones")
    tidy.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    tidy.add_argument("--update-baseline", action="store_true")
    args = parser.parse_args()
    if args.command == "format":
        return run_format(args)
    if args.command == "internal-includes":
        return run_internal_includes(args)
    args.build_dir = os.path.abspath(args.build_dir)
    return run_tidy(args)


if __name__ == "__main__":
    sys.exit(main())
