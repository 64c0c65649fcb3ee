#!/usr/bin/env python3
"""serve_load.py: the driver of scripts/bench/serve_load.sh (see there for what it measures)."""
import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

SHORT = "And God said, Let there be light"
LONG = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was "
        "upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: "
        "and there was light. And God saw the light, that it was good: and God divided the light from the darkness. And God "
        "called the light Day, and the darkness he called Night. And the evening and the morning were the first day. And God "
        "said, Let there be a firmament in the midst of the waters, and let it divide the waters from the waters.")


class SideFailed(Exception):
    """A server that would not start or answered a request wrongly: its row says so, the others still run."""


def fail(msg):
    raise SideFailed(msg)


def one_request(port, model, prompt, max_tokens, out):
    """Streams one completion; appends (ttft, [gaps], tokens, total) to out."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    res = conn.getresponse()
    if res.status != 200:
        fail(f"a request got HTTP {res.status}: {res.read()[:300]!r}")
    stamps, usage, buf = [], None, b""
    while True:
        line = res.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("usage"):
            usage = j["usage"]["completion_tokens"]
        if j.get("choices"):
            stamps.append(time.perf_counter())
    total = time.perf_counter() - t0
    conn.close()
    if not stamps:
        fail("a stream carried no chunk")
    out.append((stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], usage if usage is not None else len(stamps), total))


def run_load(port, model, requests, concurrency, max_tokens):
    results, lock = [], threading.Lock()
    queue = [LONG if i % 2 else SHORT for i in range(requests)]

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            one_request(port, model, prompt, max_tokens, results)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = sorted(r[0] for r in results)
    gaps = sorted(g for r in results for g in r[1])
    tokens = sum(r[2] for r in results)
    pct = lambda xs, p: xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")
    return {"tok_s": tokens / wall, "tokens": tokens, "wall": wall, "ttft50": pct(ttft, 50), "ttft90": pct(ttft, 90),
            "itl50": pct(gaps, 50), "itl90": pct(gaps, 90), "itl99": pct(gaps, 99)}


def start(cmd, port, env, timeout, log):
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            fail(f"{' '.join(cmd[:3])} exited with {proc.returncode} before serving (see {log.name})")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    fail(f"{' '.join(cmd[:3])} did not answer /health within {timeout} s (see {log.name})")


def metric(port, name):
    """A counter or gauge of colossal serve's /metrics (Prometheus text), or None."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m[1]) if m else None


def stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    for a in ("--colossal", "--python", "--model", "--sides", "--command", "--logs"):
        ap.add_argument(a, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kv-memory-gb", type=float, help="colossal's sides: the paged KV cache's memory (serve's default: 1)")
    for a in ("--requests", "--concurrency", "--max-tokens", "--threads", "--repeat", "--port"):
        ap.add_argument(a, type=int, required=True)
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    sides = a.sides.split(",")
    commands = {
        "colossal": [a.colossal, "serve", a.model, "--port", str(a.port), "--model-name", "m", "--max-running", str(a.concurrency),
                     "--device", a.device],
        "colossal-1": [a.colossal, "serve", a.model, "--port", str(a.port), "--model-name", "m", "--max-running", "1",
                       "--device", a.device],
        **{f"colossal-{kind}kv": [a.colossal, "serve", a.model, "--port", str(a.port), "--model-name", "m", "--max-running",
                                  str(a.concurrency), "--device", a.device, "--kv-cache", kind] for kind in ("fp16", "int8")},
        "transformers": [a.python, "-m", "transformers.cli.transformers", "serve", "--port", str(a.port), "--device", a.device,
                         "--dtype", "float32", a.model],
        "transformers-cb": [a.python, "-m", "transformers.cli.transformers", "serve", "--port", str(a.port), "--device", a.device,
                            "--dtype", "float32", "--continuous-batching", a.model],
    }
    if a.kv_memory_gb:
        for side, cmd in commands.items():
            if side.startswith("colossal"):
                cmd += ["--kv-memory-gb", str(a.kv_memory_gb)]
    names = {"colossal": "m", "colossal-1": "m", "colossal-fp16kv": "m", "colossal-int8kv": "m", "transformers": a.model,
             "transformers-cb": a.model}
    rows, failed = {s: [] for s in sides}, {}
    for r in range(a.repeat):
        for side in sides:
            if side in failed:
                continue
            print(f"serve_load: round {r + 1}/{a.repeat}: {side}", file=sys.stderr)
            log_path = os.path.join(a.logs, f"{side}-{r}.log")
            with open(log_path, "w") as log:
                proc = None
                try:
                    proc = start(commands[side], a.port, env, 300, log)
                    one_request(a.port, names[side], SHORT, 4, [])   # warm-up: first-use kernel timings, lazy loading
                    row = run_load(a.port, names[side], a.requests, a.concurrency, a.max_tokens)
                    if side.startswith("colossal"):   # sequences recomputed for lack of KV blocks, warm-up included
                        row["preempted"] = metric(a.port, "colossal_preemptions_total")
                    rows[side].append(row)
                except (SideFailed, OSError) as e:
                    errors = [l.strip() for l in open(log_path, errors="replace") if "Error" in l]
                    failed[side] = f"{e}" + (f"; its log: {errors[-1][:160]}" if errors else "")
                finally:
                    if proc is not None:
                        stop(proc)
    med = lambda side, k: statistics.median(x[k] for x in rows[side])
    base = med("colossal", "tok_s") if rows.get("colossal") else None
    for side in sides:
        if side in failed:
            print(f"{side:16s} did not run here: {failed[side]}")
            continue
        ratio = f" (colossal {base / med(side, 'tok_s'):.2f}x)" if base and side != "colossal" else ""
        gaps = "n/a (one chunk a request)" if med(side, "itl50") != med(side, "itl50") else \
            f"p50 {1e3 * med(side, 'itl50'):.0f} ms p90 {1e3 * med(side, 'itl90'):.0f} ms p99 {1e3 * med(side, 'itl99'):.0f} ms"
        preempted = f" | {med(side, 'preempted'):.0f} preemptions" if rows[side][0].get("preempted") is not None else ""
        print(f"{side:16s} {med(side, 'tok_s'):7.1f} tok/s{ratio} | TTFT p50 {med(side, 'ttft50'):.2f} s p90 {med(side, 'ttft90'):.2f} s"
              f" | inter-token {gaps} | {med(side, 'tokens'):.0f} tokens in {med(side, 'wall'):.1f} s{preempted}")
    cpu = subprocess.run(["bash", "scripts/bench/cpu_line.sh"], capture_output=True, text=True).stdout.strip()   # model, kernel set, caps
    print(f"load: {a.requests} streamed requests, {a.concurrency} at a time, prompts alternating "
          f"{len(SHORT.split())} and {len(LONG.split())} words, max_tokens {a.max_tokens}, greedy")
    print(f"machine: {cpu}, {a.threads} threads, {time.strftime('%Y-%m-%d')}, {a.command}, median of {a.repeat} rounds")


if __name__ == "__main__":
    main()
