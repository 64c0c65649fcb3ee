#!/usr/bin/env python3
"""Where the last build's time went, from ninja's log (build/.ninja_log by default).

    scripts/dev/build_profile.py [BUILD_DIR] [--top N]

Prints the wall time, the CPU-seconds spent in all steps together, a total per kind of step (precompiled
header, kernels, engine, models, app, tests, fuzz targets, links) and the N slowest steps, so whoever
makes the build slower sees where. Only the newest build in the log counts: ninja appends each build's
steps in completion order with times relative to that build's start, so an end time that goes backwards
marks where a newer build began. A no-op or partly cached build shows only what it actually ran.
"""
import argparse
import os
import sys


def last_build(log_path):
    steps, last_end = [], -1
    with open(log_path) as f:
        header = f.readline()
        if not header.startswith("# ninja log v"):
            sys.exit(f"build_profile: {log_path}: not a ninja log (first line {header.strip()!r})")
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 4:
                continue
            start, end, output = int(parts[0]), int(parts[1]), parts[3]
            if end < last_end:          # a newer build starts here
                steps = []
            last_end = end
            steps.append((start, end, output))
    # One command with several outputs (a link and its test list) is one step: keep it once.
    unique = {}
    for start, end, output in steps:
        unique.setdefault((start, end), output)
    return [(s, e, o) for (s, e), o in unique.items()]


def kind(output):
    name = os.path.basename(output)
    if "cmake_pch" in output:
        return "precompiled header"
    if not output.endswith(".o"):
        return "links and other steps"
    if "/kernels" in output or output.startswith("kernels/"):
        return "kernels"
    if "tests/fuzz" in output:
        return "fuzz targets"
    if "tests/" in output:
        return "tests"
    if "models/" in output:
        return "models"
    if "apps/" in output:
        return "app"
    if name.endswith(".o"):
        return "engine (src/)"
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build_dir", nargs="?", default="build")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    log = os.path.join(args.build_dir, ".ninja_log")
    if not os.path.exists(log):
        sys.exit(f"build_profile: {log}: no such file (build first, or name the build directory)")
    steps = last_build(log)
    if not steps:
        sys.exit(f"build_profile: {log}: no steps recorded")
    wall = (max(e for _, e, _ in steps) - min(s for s, _, _ in steps)) / 1000
    cpu = sum(e - s for s, e, _ in steps) / 1000
    print(f"{len(steps)} steps, wall {wall:.1f} s, {cpu:.1f} CPU-s in steps "
          f"(parallelism {cpu / wall if wall else 0:.2f})")
    totals = {}
    for s, e, o in steps:
        k = kind(o)
        n, t, worst = totals.get(k, (0, 0.0, 0.0))
        totals[k] = (n + 1, t + (e - s) / 1000, max(worst, (e - s) / 1000))
    print(f"\n{'kind':<24}{'steps':>6}{'CPU-s':>9}{'share':>7}{'slowest':>9}")
    for k, (n, t, worst) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:<24}{n:>6}{t:>9.1f}{100 * t / cpu:>6.0f}%{worst:>8.1f}s")
    print(f"\nslowest {args.top} steps:")
    for s, e, o in sorted(steps, key=lambda x: x[0] - x[1])[: args.top]:
        print(f"{(e - s) / 1000:>8.1f} s  {o}")


if __name__ == "__main__":
    main()
