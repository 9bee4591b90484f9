# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Shared logic of the model tests (tests/test-model-*.sh).  Source it after
# functions.sh:
#
#   source ./functions.sh
#   source "$srcdir/model-lib.sh"
#   model_run NAME LAYOUT MODE [NBDKIT-ARGS...] [-- MODEL-TEST-ARGS...]
#
# model_run creates the backing files with random initial contents, starts
# nbdkit with the plug plugin (start_plug), runs model-test against it,
# stops the server (stop_server: it must exit 0 after SIGTERM, without a
# sanitizer report), and then checks that:
#   - model-test passed (every read matched the reference, no errors);
#   - the backing files hold exactly the reference image model-test dumped
#     (concat: the files one after another; stripe: de-striped);
#   - stats-file= counted the client's operations.
#
# LAYOUT is "concat:SIZE,SIZE,..." or "stripe:STRIPE:N:SIZE" (N files of
# SIZE bytes).  MODE is writeback or hold.  NBDKIT-ARGS starting with "-"
# go before the plugin and must be one word (--threads=1), the others
# (key=value) after it.
# Every model-test run gets --connections 4 unless MODEL-TEST-ARGS says
# otherwise, and --boundary at every file (or stripe) boundary.

: "${srcdir:=.}"
requires test -x /usr/bin/python3
requires nbdkit --version
requires test -x "$MODEL"
if [ ! -f "$PLUGIN" ]; then
  echo "$0: plugin $PLUGIN not built: test skipped"
  exit 77
fi
# Each nbdkit run is bounded: a deadlocked plug must fail, not hang.
: "${MODEL_TIMEOUT:=120}"

plug_tmpdir

# The de-striping and comparison helper, shared by every run.
cat > "$tmp/model-check.py" <<'EOF'
import json, random, re, sys

def sizes_of(layout):
    kind, _, rest = layout.partition(":")
    if kind == "concat":
        return kind, 0, [int(s) for s in rest.split(",")]
    stripe, n, size = (int(x) for x in rest.split(":"))
    return kind, stripe, [size] * n

def make(layout, seed, files):
    # Random initial contents, so that a read of never-written data
    # returning zeros is caught.
    r = random.Random(seed)
    _, _, sizes = sizes_of(layout)
    for f, size in zip(files, sizes):
        with open(f, "wb") as fp:
            fp.write(r.randbytes(size))

def image(layout, files):
    kind, stripe, sizes = sizes_of(layout)
    data = [open(f, "rb").read() for f in files]
    for f, d, size in zip(files, data, sizes):
        if len(d) != size:
            sys.exit("%s: size %d, expected %d" % (f, len(d), size))
    if kind == "concat":
        return b"".join(data)
    # RAID-0: stripe s of the export is stripe s // n of file s % n.
    n = len(data)
    out = bytearray()
    for s in range(sum(sizes) // stripe):
        off = (s // n) * stripe
        out += data[s % n][off:off + stripe]
    return bytes(out)

def compare(layout, dump, mask, files):
    img = image(layout, files)
    ref = open(dump, "rb").read()
    known = open(mask, "rb").read()
    if len(img) != len(ref):
        sys.exit("image is %d bytes, reference %d" % (len(img), len(ref)))
    if img == ref:
        return
    bad = []
    loose = 0
    step = 65536
    for b in range(0, len(img), step):
        if img[b:b + step] == ref[b:b + step]:
            continue
        for i in range(b, min(b + step, len(img))):
            if img[i] != ref[i]:
                if known[i]:
                    bad.append(i)
                else:
                    loose += 1
    if loose:
        # Unspecified (trimmed) bytes that changed after model-test read
        # them: not wrong by NBD's rules, but odd once the server is gone.
        print("note: %d unspecified bytes differ from what was read" % loose)
    if bad:
        for i in bad[:10]:
            print("backing files differ at export offset %d (0x%x): "
                  "expected 0x%02x, file has 0x%02x" % (i, i, ref[i], img[i]))
        sys.exit("%d bytes of the backing files differ from the reference"
                 % len(bad))

def stats(statsfile, mode, conns, out):
    st = json.load(open(statsfile))
    m = re.search(r"read=(\d+) write=(\d+) zero=(\d+) trim=(\d+) flush=(\d+)",
                  open(out).read())
    reads, writes, zeros, trims, flushes = (int(x) for x in m.groups())
    c = st["client"]
    b = st["backend"]
    print("stats: client write %d zero %d trim %d flush %d; backend write %d "
          "zero %d trim %d sync %d; largest plug %s; unplugs %s" %
          (c["write"]["ops"], c["zero"]["ops"], c["trim"]["ops"],
           c["flush"]["ops"], b["write"]["ops"], b["zero"]["ops"],
           b["trim"]["ops"], b["sync"]["ops"], st["largest_plug"],
           st["unplugs"]))
    errors = []
    def want(cond, what):
        if not cond:
            errors.append(what)
    want(st["mode"] == mode, "mode %s, expected %s" % (st["mode"], mode))
    # model-test's connections plus its --verify-all connection.
    want(st["connections"] == conns + 1,
         "connections %d, expected %d" % (st["connections"], conns + 1))
    want(c["write"]["ops"] == writes,
         "client.write.ops %d, model-test sent %d"
         % (c["write"]["ops"], writes))
    want(c["read"]["ops"] >= reads,
         "client.read.ops %d < model-test's %d" % (c["read"]["ops"], reads))
    want(c["flush"]["ops"] >= flushes,
         "client.flush.ops %d < model-test's %d" % (c["flush"]["ops"], flushes))
    want(c["zero"]["ops"] + c["trim"]["ops"] > 0 or zeros + trims == 0,
         "no zero or trim counted")
    want(b["write"]["ops"] > 0, "backend.write.ops is 0")
    if errors:
        sys.exit("statsfile: " + "; ".join(errors))

cmd = sys.argv[1]
if cmd == "make":
    make(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
elif cmd == "image":
    sys.stdout.buffer.write(image(sys.argv[2], sys.argv[3:]))
elif cmd == "compare":
    compare(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
elif cmd == "stats":
    stats(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
else:
    sys.exit("model-check.py: unknown command " + cmd)
EOF

model_check ()
{
  /usr/bin/python3 "$tmp/model-check.py" "$@"
}

# Parse a size for the layout (K and M suffixes).
model_size ()
{
  case $1 in
    *K|*k) echo $(( ${1%?} * 1024 )) ;;
    *M|*m) echo $(( ${1%?} * 1024 * 1024 )) ;;
    *) echo $(( $1 )) ;;
  esac
}

# model_layout NAME LAYOUT: make the backing files of LAYOUT
# ("concat:SIZE,..." or "stripe:STRIPE:N:SIZE", sizes with K and M) in
# $tmp/NAME, filled with initial contents that are a function of NAME
# (so reruns are equal), and the reference image $tmp/NAME/init.  Sets
# ml_dir, ml_layout (sizes in bytes, as model-check.py takes it),
# ml_sizes, ml_files, ml_bounds (model-test's --boundary options) and
# ml_stripe (the plug's stripe= parameter, or nothing).
model_layout ()
{
  local name=$1 layout=$2 kind rest i off stripe n size

  ml_dir=$tmp/$name
  ml_sizes=()
  ml_files=()
  ml_bounds=()
  ml_stripe=()
  mkdir "$ml_dir"
  kind=${layout%%:*}
  rest=${layout#*:}
  if [ "$kind" = concat ]; then
    IFS=, read -r -a ml_sizes <<< "$rest"
    off=0
    for ((i = 0; i < ${#ml_sizes[@]}; ++i)); do
      ml_sizes[i]=$(model_size "${ml_sizes[i]}")
      off=$((off + ml_sizes[i]))
      [ $i -lt $((${#ml_sizes[@]} - 1)) ] && ml_bounds+=(--boundary "$off")
    done
    ml_layout=concat:$(IFS=,; echo "${ml_sizes[*]}")
  else
    IFS=: read -r stripe n size <<< "$rest"
    stripe=$(model_size "$stripe")
    size=$(model_size "$size")
    for ((i = 0; i < n; ++i)); do ml_sizes+=("$size"); done
    ml_bounds+=(--boundary-step "$stripe")
    ml_stripe+=("stripe=$stripe")
    ml_layout=stripe:$stripe:$n:$size
  fi
  for ((i = 0; i < ${#ml_sizes[@]}; ++i)); do
    ml_files+=("$ml_dir/f$i")
  done
  model_check make "$ml_layout" "$(cksum <<< "$name" | cut -d' ' -f1)" \
              "${ml_files[@]}"
  model_check image "$ml_layout" "${ml_files[@]}" > "$ml_dir/init"
}

model_run ()
{
  local name=$1 layout=$2 mode=$3
  shift 3
  local opts=() params=() margs=() files=() bounds=() f
  local dir=$tmp/$name conns=4 i start end rc cmd

  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
      -*) opts+=("$1") ;;
      *) params+=("$1") ;;
    esac
    shift
  done
  [ $# -gt 0 ] && shift
  margs=("$@")
  for ((i = 0; i < ${#margs[@]}; ++i)); do
    [ "${margs[i]}" = "--connections" ] && conns=${margs[i+1]}
  done

  model_layout "$name" "$layout"
  layout=$ml_layout
  files=("${ml_files[@]}")
  bounds=("${ml_bounds[@]}")
  params+=("${ml_stripe[@]}")
  for f in "${files[@]}"; do
    params+=("file=$f")
  done

  printf -v cmd '%q ' "$MODEL" --connections "$conns" "${bounds[@]}" \
         --init "$dir/init" --dump "$dir/dump" --mask "$dir/mask" "${margs[@]}"
  echo "== $name: nbdkit ${opts[*]} plug ${params[*]} mode=$mode"
  echo "   model-test ${margs[*]}"
  start=$(date +%s%N)
  rc=0
  start_server "$name" "${opts[@]}" "$PLUGIN" "${params[@]}" mode="$mode" \
               stats-file="$dir/stats.json"
  eval "timeout $MODEL_TIMEOUT $cmd --uri \"\$SERVER_URI\"" \
       > "$dir/out" 2>&1 || rc=$?
  end=$(date +%s%N)
  cat "$dir/out"
  if [ $rc -eq 124 ]; then
    echo "$name: FAIL: timed out after ${MODEL_TIMEOUT}s (deadlock?)"
    return 1
  fi
  if [ $rc -ne 0 ]; then
    echo "$name: FAIL: model-test exited with $rc"
    return 1
  fi
  # The server's own exit status (fails the test itself).
  stop_server "$name"
  model_check compare "$layout" "$dir/dump" "$dir/mask" "${files[@]}" || {
    echo "$name: FAIL: backing files differ from the reference"
    return 1
  }
  if [ ! -s "$dir/stats.json" ]; then
    echo "$name: FAIL: statsfile $dir/stats.json not written"
    return 1
  fi
  model_check stats "$dir/stats.json" "$mode" "$conns" "$dir/out" || {
    echo "$name: FAIL: statistics"
    return 1
  }
  echo "== $name: ok in $(( (end - start) / 1000000 )) ms"
}
