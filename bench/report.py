#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

"""bench/report.py: tables, verdicts and plots from bench/report.sh's raw
measurements (OUT/raw/*.tsv).

  report.py OUT                     write OUT/report.md and OUT/*.png
  report.py --readme OUT README     put OUT/report.md into README between
                                    the "latest results" markers

Python 3 standard library and gnuplot only (Debian packages)."""

import csv
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOADS = {
    "seq4k": "4 KiB sequential write, QD16",
    "rand4k": "4 KiB random write, QD16",
    "seq64k": "64 KiB sequential write, QD16",
    "flush64": "4 KiB sequential write, QD1, FLUSH every 64",
}
FRONTS = {
    "proxy": "nbdkit nbd (proxy)",
    "file": "nbdkit file",
    "cache": "cache filter (writeback)",
    "plug": "plug",
    "plug-hold": "plug hold",
    "qemu-nbd": "qemu-nbd writeback",
    "nbd-server": "nbd-server",
    "null": "nbdkit null (ceiling)",
}
FRONT_ORDER = list(FRONTS)
JOBS = {
    "qemu-bench": "`qemu-img bench -w -t none -s 4k -d 16 -c N`",
    "nbdcopy-4k": "`nbdcopy --flush --request-size=4096 --connections=1` of the image",
    "nbdcopy": "`nbdcopy --flush` (its defaults) of the image",
    "qemu-convert": "`qemu-img convert -n -f raw -O raw` of the image",
}
BEGIN = "<!-- report.sh: latest results begin -->"
END = "<!-- report.sh: latest results end -->"


def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def read_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v.strip("'")
    return meta


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


class Stat:
    """Median and range of repetitions."""

    def __init__(self, values):
        self.values = sorted(v for v in values if v is not None)

    def __bool__(self):
        return bool(self.values)

    @property
    def med(self):
        return statistics.median(self.values)

    @property
    def lo(self):
        return self.values[0]

    @property
    def hi(self):
        return self.values[-1]


def si(x):
    if x >= 10000:
        return f"{x / 1000:.0f}k"
    if x >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.0f}"


def fmt_iops(s):
    if not s:
        return "-"
    if len(s.values) == 1:
        return si(s.med)
    return f"**{si(s.med)}** ({si(s.lo)}-{si(s.hi)})"


def fmt_small(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_count(s):
    if not s:
        return "-"
    if len(s.values) == 1:
        return fmt_small(s.med)
    return f"{fmt_small(s.med)} ({fmt_small(s.lo)}-{fmt_small(s.hi)})"


def ratio(a, b):
    if not a or not b or b.med == 0:
        return None
    return a.med / b.med


def ratio_range(a, b):
    """Ratio of medians, and the range of per-repetition ratios."""
    if not a or not b:
        return None
    r = ratio(a, b)
    if len(a.values) != len(b.values) or len(a.values) == 1:
        return (r, r, r)
    per = sorted(x / y for x, y in zip(a.reps, b.reps) if y)
    return (r, per[0], per[-1]) if per else None


def fmt_ratio(rr):
    if rr is None or rr[0] is None:
        return "-"
    r, lo, hi = rr
    if lo == hi:
        return f"{r:.2f}"
    return f"{r:.2f} ({lo:.2f}-{hi:.2f})"


class Data:
    def __init__(self, out):
        self.out = out
        raw = os.path.join(out, "raw")
        self.meta = read_meta(os.path.join(raw, "meta.env"))
        self.timed = read_tsv(os.path.join(raw, "timed.tsv"))
        self.counts = read_tsv(os.path.join(raw, "counts.tsv"))
        self.instr = read_tsv(os.path.join(raw, "instr.tsv"))
        # Jobs of an earlier run (REPORT_JOBS=0) are not this run's.
        jobs = os.path.join(raw, "jobs.tsv")
        self.jobs = read_tsv(jobs) if self.meta.get("jobs") == "1" else []
        vm = os.path.join(raw, "vm.tsv")
        self.vm = read_tsv(vm)
        self.vm_date = None
        meta = os.path.join(raw, "meta.env")
        if self.vm and os.path.getmtime(vm) < os.path.getmtime(meta) - 3600:
            self.vm_date = subprocess.run(
                ["date", "-u", "-r", vm, "+%Y-%m-%d %H:%M UTC"],
                capture_output=True, text=True).stdout.strip()
        self.delays = []
        self.workloads = []
        for r in self.timed:
            b = r["backend"]
            if b not in ("tmpfs", "none") and b not in self.delays:
                self.delays.append(b)
            if r["workload"] not in self.workloads:
                self.workloads.append(r["workload"])
        self.delays.sort(key=float)
        self.failed = [r for r in self.timed + self.counts + self.jobs
                       if r["status"] not in ("0", "-")]
        self.job_names = []
        for r in self.jobs:
            if r["job"] not in self.job_names:
                self.job_names.append(r["job"])

    def fronts(self, backend):
        present = {r["front"] for r in self.timed if r["backend"] == backend}
        return [f for f in FRONT_ORDER if f in present]

    def iops(self, backend, workload, front):
        rows = [r for r in self.timed if r["backend"] == backend and
                r["workload"] == workload and r["front"] == front]
        rows.sort(key=lambda r: int(r["rep"]))
        s = Stat(num(r["iops"]) for r in rows)
        s.reps = [num(r["iops"]) for r in rows]
        return s

    def null(self, workload):
        return self.iops("none", workload, "null")

    def per_op(self, backend, workload, front, what):
        """Backend operations per client operation (writes or flushes)."""
        b, c = {"w": ("bwrites", "cwrites"), "f": ("bflushes", "cflushes"),
                "fua": ("bfua", "cflushes")}[what]
        vals = []
        for r in self.timed:
            if (r["backend"], r["workload"], r["front"]) == (backend, workload, front):
                x, y = num(r.get(b)), num(r.get(c))
                if x is not None and y:
                    vals.append(x / y)
        return Stat(vals)

    def count(self, workload, front, col):
        vals = [num(r[col]) / num(r["ios"]) for r in self.counts
                if r["workload"] == workload and r["front"] == front and num(r["ios"])]
        return Stat(vals)

    def job_rows(self, job, front):
        rows = [r for r in self.jobs if r["job"] == job and r["front"] == front]
        return sorted(rows, key=lambda r: int(r["rep"]))

    def job_time(self, job, front):
        rows = self.job_rows(job, front)
        s = Stat(num(r["seconds"]) for r in rows)
        s.reps = [num(r["seconds"]) for r in rows]
        return s

    def job_fronts(self):
        present = {r["front"] for r in self.jobs}
        return [f for f in FRONT_ORDER if f in present]

    def instructions(self, workload, front):
        for r in self.instr:
            if r["workload"] == workload and r["front"] == front:
                return num(r["instr"])
        return None


# ---------------------------------------------------------------- verdicts

def span(lo, hi, fmt="{:.1f}"):
    a, b = fmt.format(lo), fmt.format(hi)
    return a if a == b else f"{a}-{b}"


def delay_span(ds):
    ds = sorted(ds, key=float)
    return f"{ds[0]} ms" if len(ds) == 1 else f"{ds[0]}-{ds[-1]} ms"


def verdicts(d):
    """Use / do not use lines, computed from the medians.  Rules: the plug
    pays where its median is >= 1.5x the proxy's; it costs where < 0.9x
    the proxy's (or nbdkit file's on tmpfs); another write-back front is
    named where it beats the plug by 1.1x or more."""
    use, avoid = [], []
    peers = ("cache", "qemu-nbd")
    for w in d.workloads:
        name = WORKLOADS.get(w, w)
        pays, costs, beaten = [], [], {}
        lo_r, hi_r = None, None
        for dl in d.delays:
            p, x = d.iops(dl, w, "plug"), d.iops(dl, w, "proxy")
            r = ratio(p, x)
            if r is None:
                continue
            if r >= 1.5:
                pays.append(dl)
                lo_r = r if lo_r is None else min(lo_r, r)
                hi_r = r if hi_r is None else max(hi_r, r)
            elif r < 0.9:
                costs.append((dl, r))
            for peer in peers:
                rp = ratio(d.iops(dl, w, peer), p)
                if rp is not None and rp >= 1.1:
                    beaten.setdefault(peer, []).append((dl, rp))
        if pays:
            n = d.null(w)
            pn = [ratio(d.iops(dl, w, "plug"), n) for dl in pays]
            pn = [x for x in pn if x is not None]
            extra = f"; {span(min(pn), max(pn), '{:.2f}')} of null" if pn else ""
            use.append(f"{name}, remote of {delay_span(pays)}: "
                       f"{span(lo_r, hi_r)}x the proxy{extra}")
        for dl, r in costs:
            avoid.append(f"{name}, remote of {dl} ms: {r:.2f}x the proxy")
        for peer, lst in beaten.items():
            ds = [dl for dl, _ in lst]
            rs = [rp for _, rp in lst]
            avoid.append(f"{name}, remote of {delay_span(ds)}: "
                         f"{FRONTS[peer]} gives {span(min(rs), max(rs))}x the plug")
        if not pays and not costs:
            rs = [ratio(d.iops(dl, w, "plug"), d.iops(dl, w, "proxy")) for dl in d.delays]
            rs = [x for x in rs if x is not None]
            if rs:
                avoid.append(f"{name}, any remote latency measured: no gain, "
                             f"{span(min(rs), max(rs), '{:.2f}')}x the proxy")
        r = ratio(d.iops("tmpfs", w, "plug"), d.iops("tmpfs", w, "file"))
        if r is not None:
            line = f"{name}, tmpfs file: {r:.2f}x nbdkit file"
            (use if r >= 1.5 else avoid if r < 0.9 else [])\
                .append(line)
    for j in d.job_names:
        rr = ratio_range(d.job_time(j, "proxy"), d.job_time(j, "plug"))
        if rr is None or rr[0] is None:
            continue
        name = JOBS.get(j, j).replace(" of the image", "") + " (1 ms remote)"
        if rr[0] >= 1.5:
            use.append(f"whole job {name}: {fmt_ratio(rr)}x faster than the proxy")
        elif rr[0] < 0.9:
            avoid.append(f"whole job {name}: {1 / rr[0]:.2f}x slower than the proxy")
    # Hold mode: merges, but is it ever faster than the proxy?
    hr = []
    for w in d.workloads:
        for dl in d.delays:
            r = ratio(d.iops(dl, w, "plug-hold"), d.iops(dl, w, "proxy"))
            if r is not None:
                hr.append(r)
    if hr:
        avoid.append(f"plug mode=hold for speed: {span(min(hr), max(hr), '{:.2f}')}x "
                     f"the proxy over every remote row (it acknowledges only "
                     f"written data; see backend writes per client write)")
    return use, avoid


# ---------------------------------------------------------------- plots

def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def plot_iops(d, png):
    fronts = [f for f in d.fronts(d.delays[0]) if f != "null"] if d.delays else []
    if not fronts:
        return False
    datdir = d.scratch
    parts = []
    for i, w in enumerate(d.workloads):
        dat = os.path.join(datdir, f"iops-{w}.dat")
        with open(dat, "w") as f:
            for x, dl in enumerate(d.delays):
                row = [str(x), dl]
                for fr in fronts:
                    s = d.iops(dl, w, fr)
                    row += [f"{s.med:.0f}", f"{s.lo:.0f}", f"{s.hi:.0f}"] if s else ["NaN"] * 3
                f.write(" ".join(row) + "\n")
        n = d.null(w)
        nl = f"{n.med:.0f}" if n else "NaN"
        plots = [f"'{dat}' using 1:{3 + 3 * j}:{4 + 3 * j}:{5 + 3 * j}:xtic(2) "
                 f"with yerrorlines lw 2 title '{FRONTS[fr]}'"
                 for j, fr in enumerate(fronts)]
        plots.append(f"{nl} with lines dt 2 lw 2 lc rgb 'black' title 'nbdkit null (ceiling)'")
        parts.append(f"""
set title '{WORKLOADS.get(w, w)}'
set key {'outside bottom center horizontal' if i == 0 else 'off'}
plot {', '.join(plots)}
""")
    gnuplot(f"""
set terminal pngcairo size 1000,760 font ',8'
set output '{png}'
set multiplot layout 2,2 title 'IOPS against the remote write latency (median, bars: min-max)'
set logscale y
set xlabel 'remote write latency (ms)'
set ylabel 'IOPS'
set grid ytics
set xrange [-0.3:{len(d.delays) - 0.7}]
{''.join(parts)}
unset multiplot
""")
    return True


def plot_counts(d, png):
    cws = [w for w in d.workloads if any(r["workload"] == w for r in d.counts)]
    cws = cws or sorted({r["workload"] for r in d.counts})
    fronts = [f for f in FRONT_ORDER if any(r["front"] == f for r in d.counts)]
    if not cws or not fronts:
        return False
    parts = []
    for w in cws:
        dat = os.path.join(d.scratch, f"counts-{w}.dat")
        with open(dat, "w") as f:
            for fr in fronts:
                cs = d.count(w, fr, "cs")
                fu = d.count(w, fr, "futex")
                pw = d.count(w, fr, "pwrite")
                f.write(f'"{fr}" {cs.med if cs else 0:.3f} {fu.med if fu else 0:.3f} '
                        f'{pw.med if pw else 0:.3f}\n')
        parts.append(f"""
set title '{WORKLOADS.get(w, w)}, tmpfs'
plot '{dat}' using 2:xtic(1) title 'context switches', '' using 3 title 'futex calls', '' using 4 title 'pwrite* calls'
""")
    gnuplot(f"""
set terminal pngcairo size 1000,380 font ',8'
set output '{png}'
set multiplot layout 1,{len(parts)} title 'Per request, the server process (perf stat, median of repetitions)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set yrange [0:*]
set xtics rotate by -30
set key top left
{''.join(parts)}
unset multiplot
""")
    return True


# ---------------------------------------------------------------- report

def report(d):
    m = d.meta
    L = []
    L.append("# nbdplug benchmark report\n")
    L.append(f"Generated by `bench/report.sh` on {m.get('started')} "
             f"({'QUICK, ' if m.get('quick') == '1' else ''}{m.get('elapsed')} s): "
             f"git {m.get('plugin_id')}, {m.get('nbdkit')}, {m.get('qemu')}, "
             f"{m.get('nbd_server')}, {m.get('fio')}; {m.get('cpus')} CPUs, "
             f"load average {m.get('load_start')} at start, {m.get('load_end')} at the end. "
             f"{m.get('reps')} interleaved repetitions of {m.get('seconds')} s per point; "
             "cells are the median IOPS, (min-max) over repetitions.\n")
    try:
        busy = float(m.get("load_end", "0").split()[0]) > 2 * int(m.get("cpus", "1")) or \
            float(m.get("load_start", "0").split()[0]) > 2 * int(m.get("cpus", "1"))
    except ValueError:
        busy = False
    if busy:
        L.append("**The machine was busy with other work during this run (load "
                 "average above twice its CPUs): the IOPS below, and the verdicts "
                 "drawn from them, are noisy; the counts of (b) to (d) much less so.**\n")
    if d.failed:
        L.append(f"**{len(d.failed)} measurement(s) where the server exited with an "
                 f"error**: " + ", ".join(f"{r['front']}/{r['workload']}" for r in d.failed[:8]) + "\n")

    use, avoid = verdicts(d)
    L.append("## Use it when / do not use it when\n")
    L.append("Computed from the IOPS tables of (a) (medians; the plug in its default "
             "`mode=writeback`): it *pays* where it gives at least 1.5x the "
             "proxy's IOPS, it *costs* where less than 0.9x.\n")
    L.append("| use the plug when | do not use it (or use the named front) when |")
    L.append("|---|---|")
    for i in range(max(len(use), len(avoid))):
        a = use[i] if i < len(use) else ""
        b = avoid[i] if i < len(avoid) else ""
        L.append(f"| {a} | {b} |")
    L.append("")
    L.append("*Hand-written, not computed:* write-back (the plug, the cache "
             "filter, qemu-nbd `--cache=writeback`) acknowledges a write before "
             "the remote has it; a client's FLUSH (or FUA) is the point where "
             "its data is durable, and a crash of the front loses what was "
             "acknowledged since.  Clients that flush rarely trade that window "
             "for the speed above; `mode=hold` never acknowledges unwritten "
             "data.  Reads are not measured here.\n")

    if d.delays:
        L.append("## (a) IOPS against the remote's write latency\n")
        L.append("The remote: `nbdkit --filter=delay-us.so memory 1G write-us=N "
                 "counts=FILE` (bench/delay-us.c: every write sleeps N us in one of "
                 "nbdkit's 16 threads; 0 ms is the memory plugin as fast as it goes). "
                 "Each front serves it over a Unix socket (plug: `file=nbd+unix://...`; "
                 "qemu-nbd `-f raw --cache=writeback nbd+unix://...`). The tmpfs rows "
                 "serve a file on /dev/shm instead: nbdkit file in the proxy's column, "
                 "and nbd-server, which serves files only. fio `--ioengine=nbd`, "
                 "`--end_fsync=1` (its final FLUSH is inside the timed interval).\n")
        L.append("![IOPS against remote latency](iops.png)\n")
        for w in d.workloads:
            fronts = [f for f in d.fronts(d.delays[0]) if f != "null"]
            lf = [f for f in d.fronts("tmpfs")]
            cols = fronts + [f for f in lf if f not in fronts and f != "file"]
            L.append(f"### {WORKLOADS.get(w, w)}\n")
            L.append(f"nbdkit null (ceiling): {fmt_iops(d.null(w))}\n")
            L.append("| remote | " + " | ".join(FRONTS[f] for f in cols) +
                     " | plug / proxy | plug / null |")
            L.append("|---" * (len(cols) + 3) + "|")
            for dl in d.delays + (["tmpfs"] if lf else []):
                cells = []
                for f in cols:
                    f2 = "file" if dl == "tmpfs" and f == "proxy" else f
                    cells.append(fmt_iops(d.iops(dl, w, f2)))
                base = "file" if dl == "tmpfs" else "proxy"
                p = d.iops(dl, w, "plug")
                label = "tmpfs (proxy column: nbdkit file)" if dl == "tmpfs" else f"{dl} ms"
                L.append(f"| {label} | " + " | ".join(cells) +
                         f" | {fmt_ratio(ratio_range(p, d.iops(dl, w, base)))}"
                         f" | {fmt_ratio(ratio_range(p, d.null(w)))} |")
            L.append("")

    if d.counts:
        L.append("## (b) Per request on tmpfs: context switches, futex calls, write calls, instructions\n")
        L.append(f"Each front serves a fresh file on /dev/shm; fio writes "
                 f"{m.get('count_ios')} requests at QD16; `perf stat -p` counts the "
                 f"server's threads and children from the moment it listens to its "
                 f"exit (so its start is not counted, its exit is). pwrite* = "
                 f"pwrite64 + pwritev + pwritev2 (the file); write = write(2) "
                 f"(qemu-nbd and nbd-server also answer with it). Instructions: "
                 f"user space, callgrind, (count(2N) - count(N)) / N with N = "
                 f"{m.get('instr_ios')}, deterministic, once (bench/instr.sh's method).\n")
        L.append("![counts per request](counts.png)\n")
        cws = sorted({r["workload"] for r in d.counts}, key=list(WORKLOADS).index)
        fronts = [f for f in FRONT_ORDER if any(r["front"] == f for r in d.counts)]
        for w in cws:
            L.append(f"### {WORKLOADS.get(w, w)}\n")
            pc, fc = d.count(w, "plug", "cs"), d.count(w, "file", "cs")
            pf, ff = d.count(w, "plug", "futex"), d.count(w, "file", "futex")
            if pc and fc and pf and ff:
                L.append(f"The plug against nbdkit file, medians: context switches "
                         f"{pc.med - fc.med:+.2f}, futex calls {pf.med - ff.med:+.2f} "
                         f"per request.\n")
            L.append("| front | context switches | futex calls | pwrite* calls | write calls | instructions |")
            L.append("|---|---|---|---|---|---|")
            for f in fronts:
                ins = d.instructions(w, f)
                L.append(f"| {FRONTS[f]} | {fmt_count(d.count(w, f, 'cs'))} | "
                         f"{fmt_count(d.count(w, f, 'futex'))} | "
                         f"{fmt_count(d.count(w, f, 'pwrite'))} | "
                         f"{fmt_count(d.count(w, f, 'write'))} | "
                         f"{'-' if ins is None else f'{ins:.0f}'} |")
            L.append("")

    if d.delays:
        L.append("## (c) Backend operations per client operation\n")
        L.append("Counted at the remote by bench/delay-us.c in the runs of (a) "
                 "(tmpfs: the plug's own statistics, `backend.write.ops` and "
                 "`backend.sync.ops`; nbdkit file: one pwrite per write, one "
                 "fdatasync per FLUSH). Writes: backend writes per client write. "
                 "FLUSH and FUA (flush64 only): backend FLUSHes, and backend writes "
                 "with the FUA flag, per client FLUSH (fio's FLUSHes plus its final "
                 "one): a FUA write is a durability point as a FLUSH is.\n")
        fronts = [f for f in d.fronts(d.delays[0]) if f != "null"]
        show = [dl for dl in d.delays if dl in ("1", "10")] or d.delays[-1:]
        L.append("| workload | remote | " + " | ".join(
            FRONTS[f] + (" (tmpfs: nbdkit file)" if f == "proxy" else "")
            for f in fronts) + " |")
        L.append("|---|---" + "|---" * len(fronts) + "|")
        for w in d.workloads:
            for dl in show + ["tmpfs"]:
                cells = []
                for f in fronts:
                    f2 = "file" if dl == "tmpfs" and f == "proxy" else f
                    wr = d.per_op(dl, w, f2, "w")
                    fl = d.per_op(dl, w, f2, "f")
                    fua = d.per_op(dl, w, f2, "fua")
                    if not wr:
                        cells.append("-")
                        continue
                    c = f"{fmt_small(wr.med)} writes"
                    if w == "flush64" and fl:
                        c += f", {fmt_small(fl.med)} FLUSH"
                    if w == "flush64" and fua:
                        c += f", {fmt_small(fua.med)} FUA"
                    cells.append(c)
                if any(c != "-" for c in cells):
                    label = "tmpfs" if dl == "tmpfs" else f"{dl} ms"
                    L.append(f"| {WORKLOADS.get(w, w)} | {label} | " + " | ".join(cells) + " |")
        L.append("")

    L.append("## (d) Real clients: the kernel nbd driver and qemu, with ext4\n")
    if d.vm:
        report_vm(d, L)
    else:
        L.append("Not measured in this run (`REPORT_VM=1` runs bench/vm-report.sh).\n")
    if d.jobs:
        report_jobs(d, L)
    return "\n".join(L)


def report_vm(d, L):
    L.append(f"bench/vm-report.sh{' (an earlier run: ' + d.vm_date + ')' if d.vm_date else ''}: "
             "in a guest (TCG qemu, Debian cloud kernel), the kernel's nbd "
             "driver on each front, the front and a remote of 1 ms per write "
             "(nbdkit memory, bench/delay-us.c) inside the guest; then qemu's "
             "own NBD client (a virtio disk per front, the fronts and remotes on "
             "the host).  The same workload on each: "
             "mkfs.ext4, mount, unpack a source tree (this project's and "
             "/usr/include/linux, some 1000 files), sync, then 200 x (write 512 "
             "bytes, fsync) as a database commits, umount.  Counted, not "
             "timed (the guest's CPU is emulated): what the client sent to "
             "the front, and what reached the remote.\n")
    L.append("| client | front | client writes | client FLUSH | client FUA | client trims | "
             "remote writes | remote FLUSH | remote FUA | remote writes per client write | "
             "remote FLUSH+FUA per client FLUSH+FUA |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(d.vm, key=lambda r: (r.get("client", "kernel"),
                                         FRONT_ORDER.index(r["front"]))):
        client = {"kernel": "kernel nbd", "qemu": "qemu"}.get(r.get("client"), "kernel nbd")
        g = {k: int(v) for k, v in r.items() if k not in ("client", "front", "seconds")}
        cd = g["cflushes"] + g["cfua"]
        bd = g["bflushes"] + g["bfua"]
        L.append(f"| {client} | {FRONTS[r['front']]} | {g['cwrites']} | {g['cflushes']} | "
                 f"{g['cfua']} | {g['ctrims']} | {g['bwrites']} | {g['bflushes']} | "
                 f"{g['bfua']} | {fmt_small(g['bwrites'] / g['cwrites']) if g['cwrites'] else '-'} | "
                 f"{fmt_small(bd / cd) if cd else '-'} |")
    L.append("")


def fmt_secs(s):
    if not s:
        return "-"
    if len(s.values) == 1:
        return f"{s.med:.2f} s"
    return f"**{s.med:.2f} s** ({s.lo:.2f}-{s.hi:.2f})"


def fmt_speedup(rr):
    """proxy time / plug time, as "N x faster" or "N x slower"."""
    if rr is None or rr[0] is None:
        return "-"
    r, lo, hi = rr

    def one(x):
        return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"
    if lo == hi:
        return one(r)
    return f"{one(r)} (proxy/plug time per repetition: {lo:.2f}-{hi:.2f})"


def report_jobs(d, L):
    m = d.meta
    fronts = d.job_fronts()
    L.append("## (e) Whole jobs through the remote\n")
    L.append(f"Each job a user would time, through each front to the remote of "
             f"{m.get('job_delay')} ms per write (as in (a)); wall time from the "
             f"client's start to its exit, so including its own final FLUSH; "
             f"{m.get('jobs_reps', m.get('reps'))} interleaved repetitions, median "
             f"(min-max). The image: `mke2fs -t ext4 -d {m.get('job_tree')}` of "
             f"{m.get('job_image_size')} ({m.get('job_image_used')} allocated; "
             f"nbdcopy and qemu-img copy the data and zero the holes). "
             f"qemu-img bench: -c {m.get('job_bench_count')}. Plug vs proxy: the "
             f"ratio of the median times, and the range of the proxy's time over "
             f"the plug's within each repetition (above 1: the plug was faster).\n")
    L.append("| job | " + " | ".join(FRONTS[f] for f in fronts) + " | plug vs proxy |")
    L.append("|---" * (len(fronts) + 2) + "|")
    for j in d.job_names:
        cells = [fmt_secs(d.job_time(j, f)) for f in fronts]
        rr = ratio_range(d.job_time(j, "proxy"), d.job_time(j, "plug"))
        L.append(f"| {JOBS.get(j, j)} | " + " | ".join(cells) + f" | {fmt_speedup(rr)} |")
    L.append("")
    L.append("What the client sent (counted at the front, first repetition: "
             "writes, zeroes, FLUSHes) and what reached the remote per client "
             "operation (writes + zeroes + trims at the remote over those "
             "the client sent; FLUSH and FUA at the remote over the client's "
             "FLUSHes). The cache filter advertises a preferred block size of "
             "64 KiB, which nbdcopy follows, so its client counts differ.\n")
    rf = [f for f in fronts if f != "null"]
    L.append("| job | client ops (" + ", ".join(FRONTS[f] for f in rf) + ") | " +
             " | ".join(f"remote ops per client op: {FRONTS[f]}" for f in rf) + " |")
    L.append("|---|---" + "|---" * len(rf) + "|")
    for j in d.job_names:
        cl, cells = [], []
        for f in rf:
            rows = d.job_rows(j, f)
            if not rows:
                cl.append("-")
                cells.append("-")
                continue
            g = rows[0]
            cl.append(f"{g['cwrites']} w, {g['czeroes']} z, {g['cflushes']} F")
            vals = []
            for r in rows:
                c = sum(num(r[k]) or 0 for k in ("cwrites", "czeroes", "ctrims"))
                b = sum(num(r[k]) or 0 for k in ("bwrites", "bzeroes", "btrims"))
                if c:
                    vals.append(b / c)
            df = (num(g["bflushes"]) or 0) + (num(g["bfua"]) or 0)
            cells.append(f"{fmt_count(Stat(vals))}; {df:.0f} FLUSH+FUA")
        uniq = sorted(set(cl))
        L.append(f"| {j} | {'; '.join(cl) if len(uniq) > 1 else uniq[0]} | " +
                 " | ".join(cells) + " |")
    L.append("")


def main():
    if sys.argv[1] == "--readme":
        out, readme = sys.argv[2], sys.argv[3]
        with open(os.path.join(out, "report.md")) as f:
            rep = f.read()
        rel = os.path.relpath(out, os.path.dirname(os.path.abspath(readme)))
        rep = rep.replace("](iops.png)", f"]({rel}/iops.png)")
        rep = rep.replace("](counts.png)", f"]({rel}/counts.png)")
        # Under README's "Latest results": the summary (up to the first
        # measured part) and the plots; the tables stay in report.md.
        # No title of its own, headings one level down.
        lines = rep.splitlines()
        if lines and lines[0].startswith("# "):
            lines = lines[1:]
        cut = next((i for i, l in enumerate(lines) if l.startswith("## (a)")), len(lines))
        lines = lines[:cut] + [
            "## Plots", "",
            f"![IOPS against remote latency]({rel}/iops.png)", "",
            f"![counts per request]({rel}/counts.png)", "",
            f"The tables of (a) IOPS, (b) counts per request, (c) backend "
            f"operations per client operation, (d) real clients and (e) whole jobs: "
            f"[{rel}/report.md]({rel}/report.md)."]
        rep = "\n".join("#" + l if l.startswith("#") else l for l in lines)
        with open(readme) as f:
            text = f.read()
        if BEGIN not in text or END not in text:
            sys.exit(f"{readme}: no markers {BEGIN} ... {END}")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(readme, "w") as f:
            f.write(head + BEGIN + "\n" + rep.strip() + "\n" + END + tail)
        return
    out = sys.argv[1]
    d = Data(out)
    scratch = tempfile.TemporaryDirectory()
    d.scratch = scratch.name
    if d.delays:
        plot_iops(d, os.path.join(out, "iops.png"))
    if d.counts:
        plot_counts(d, os.path.join(out, "counts.png"))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report(d))


if __name__ == "__main__":
    main()
