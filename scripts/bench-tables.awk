# Markdown tables from the benchmarks' JSON lines (one flat object per line),
# for scripts/bench-allreduce.sh, bench-mpi.sh and bench-topk.sh:
#
#   awk -v table=allreduce -v np=2 -v elapsed=S -v host=H -v cpus=N -v cpu=MODEL -v kernel=R -f bench-tables.awk FILE
#   awk -v table=mpi -v np=2 -v elapsed=S -v repeat=R -v ops=a,b -v host=H -v cpus=N -v kernel=R -f bench-tables.awk FILE
#   awk -v table=topk -f bench-tables.awk FILE
#
# Portable awk (Debian's default is mawk): no asort, no gensub.

# The value of "key" in a flat JSON object: a number, true/false, or a
# string without its quotes; "" when the key is absent.
function jget(line, key,    s, v) {
  if (!match(line, "\"" key "\"[ ]*:[ ]*")) return ""
  s = substr(line, RSTART + RLENGTH)
  if (substr(s, 1, 1) == "\"") {
    s = substr(s, 2)
    return substr(s, 1, index(s, "\"") - 1)
  }
  match(s, /^[^,}]*/)
  v = substr(s, 1, RLENGTH)
  sub(/[ ]+$/, "", v)
  return v
}

# "4 KiB", "16 MiB": binary units when exact.
function size(b) {
  if (b >= 1073741824 && b % 1073741824 == 0) return (b / 1073741824) " GiB"
  if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
  if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
  return b " B"
}

# Sorts the numbers a[1..n] in place (insertion sort: a few dozen sizes).
function sort_numbers(a, n,    i, j, v) {
  for (i = 2; i <= n; i++) {
    v = a[i]
    for (j = i - 1; j >= 1 && a[j] + 0 > v + 0; j--) a[j + 1] = a[j]
    a[j + 1] = v
  }
}

# Algorithm bandwidth of a record, "-" for none; with `notes`, the variant
# or algorithm when it is not the plain one.
function bw(rec, notes,    note, v, a) {
  if (rec == "") return "-"
  note = ""
  v = jget(rec, "variant")
  a = jget(rec, "algo")
  if (notes && v != "" && v != "default") note = " (" v ")"
  else if (notes && a != "" && a != "ring") note = " (" a ")"
  return sprintf("%.2f", jget(rec, "algbw_GBps")) note (jget(rec, "ok") == "false" ? " (WRONG)" : "")
}

function ratio(a, b) {
  if (a == "" || b == "" || jget(b, "algbw_GBps") + 0 == 0) return "-"
  return sprintf("%.2fx", jget(a, "algbw_GBps") / jget(b, "algbw_GBps"))
}

# Keeps, per (group, op, bytes), the record with the smallest p50.
function keep(group, op, line,    k) {
  k = group SUBSEP op SUBSEP jget(line, "bytes")
  if (!(k in best) || jget(line, "p50_s") + 0 < jget(best[k], "p50_s") + 0) best[k] = line
  seen[op SUBSEP jget(line, "bytes")] = 1
}

function rec(group, op, bytes,    k) {
  k = group SUBSEP op SUBSEP bytes
  return (k in best) ? best[k] : ""
}

# Into out[1..n], sorted: the sizes measured for any of the ops (a list).
function sizes(ops_list, out,    n, k, parts, o, m, i, have) {
  n = 0
  m = split(ops_list, o, ",")
  for (k in seen) {
    split(k, parts, SUBSEP)
    for (i = 1; i <= m; i++)
      if (parts[1] == o[i] && !((parts[2] + 0) in have)) {
        have[parts[2] + 0] = 1
        out[++n] = parts[2] + 0
      }
  }
  sort_numbers(out, n)
  return n
}

/^\{/ {
  lines++
  if (jget($0, "ok") == "false") bad++
  if (table == "allreduce" && jget($0, "np") == np) keep(jget($0, "lib"), jget($0, "op"), $0)
  if (table == "mpi" && jget($0, "np") == np) keep(jget($0, "variant"), jget($0, "op"), $0)
  if (table == "topk") topk_row($0)
}

END {
  if (table == "allreduce") allreduce_tables()
  else if (table == "mpi") mpi_tables()
  else if (table == "topk") topk_table()
  else {
    print "bench-tables.awk: table must be allreduce, mpi or topk" > "/dev/stderr"
    exit 2
  }
}

function allreduce_tables(    b, n, i, t, m, g) {
  printf "## allreduce, f32 sum, np=%s: algbw in GB/s (bytes / p50 time)\n\n", np
  printf "%s: %s CPUs (%s), Linux %s; all runs took %s s. Results: %s\n\n", host, cpus, cpu, kernel, elapsed, FILENAME
  print "| bytes | tide | Open MPI | Gloo | tide/Open MPI | tide/Gloo |"
  print "|---:|---:|---:|---:|---:|---:|"
  n = sizes("allreduce", b)
  for (i = 1; i <= n; i++) {
    t = rec("tide", "allreduce", b[i])
    m = rec("openmpi", "allreduce", b[i])
    g = rec("gloo", "allreduce", b[i])
    printf "| %s | %s | %s | %s | %s | %s |\n", size(b[i]), bw(t, 1), bw(m, 1), bw(g, 1), ratio(t, m), ratio(t, g)
  }
  printf "\n4 KiB allreduce latency (p50): %s, %s, %s.\n", latency("tide", "tide"), latency("openmpi", "Open MPI"),
         latency("gloo", "Gloo")
  print "\nEach baseline shows its better run at each size, marked when it is not the plain one. Open MPI: as " \
        "installed (default MCA settings), or `nommap`: the same with glibc's mmap off (MALLOC_MMAP_MAX_=0), so " \
        "the temporary buffers it mallocs on every call stop costing fresh pages. Gloo: `ring` (gloo::allreduce " \
        "with AllreduceOptions, the call PyTorch makes) or `ring_legacy` (gloo::AllreduceRing)."
  printf "\n## reduce_scatter and allgather, f32, np=%s: algbw in GB/s\n\n", np
  print "| bytes | tide reduce_scatter | Open MPI reduce_scatter | ratio | tide allgather | Open MPI allgather | ratio |"
  print "|---:|---:|---:|---:|---:|---:|---:|"
  delete b
  n = sizes("reduce_scatter,allgather", b)
  for (i = 1; i <= n; i++)
    printf "| %s | %s | %s | %s | %s | %s | %s |\n", size(b[i]),
           bw(rec("tide", "reduce_scatter", b[i]), 1), bw(rec("openmpi", "reduce_scatter", b[i]), 1),
           ratio(rec("tide", "reduce_scatter", b[i]), rec("openmpi", "reduce_scatter", b[i])),
           bw(rec("tide", "allgather", b[i]), 1), bw(rec("openmpi", "allgather", b[i]), 1),
           ratio(rec("tide", "allgather", b[i]), rec("openmpi", "allgather", b[i]))
  print "\nbytes as nccl-tests: reduce_scatter the input per rank, allgather the whole output."
  if (bad) printf "\n**%d measurement(s) returned wrong results (ok=false).**\n", bad
}

function latency(lib, name,    r) {
  r = rec(lib, "allreduce", 4096)
  return r == "" ? name " -" : sprintf("%s %.1f µs", name, jget(r, "p50_s") * 1e6)
}

function mpi_tables(    o, m, j, op, b, n, i, a, r, x, call) {
  call["allreduce"] = "MPI_Allreduce"
  call["reduce_scatter"] = "MPI_Reduce_scatter_block"
  call["allgather"] = "MPI_Allgather"
  call["broadcast"] = "MPI_Bcast"
  printf "%s: %s CPUs, Linux %s; np=%s, f32 sum, best median of %s rounds; %s s in all. Lines: %s\n\n", host, cpus,
         kernel, np, repeat, elapsed, FILENAME
  m = split(ops, o, ",")
  for (j = 1; j <= m; j++) {
    op = o[j]
    printf "### %s: algbw in GB/s\n\n", op
    printf "| bytes | tide over MPI (auto) | tide over MPI (ring) | %s | auto/MPI | ring/MPI |\n", (op in call) ? call[op] : op
    print "|---:|---:|---:|---:|---:|---:|"
    delete b
    n = sizes(op, b)
    for (i = 1; i <= n; i++) {
      a = rec("tide-auto", op, b[i])
      r = rec("tide-ring", op, b[i])
      x = rec("mpi", op, b[i])
      printf "| %s | %s | %s | %s | %s | %s |\n", size(b[i]), bw(a, 0), bw(r, 0), bw(x, 0), ratio(a, x), ratio(r, x)
    }
    print ""
  }
  if (bad) printf "**%d measurement(s) returned wrong results (ok=false).**\n", bad
}

# topk: cells by (d, density) and name (tide's kind, or the baseline's impl).
function topk_row(line,    impl, name, key) {
  impl = jget(line, "impl")
  if (impl == "read") {
    floor_ms[jget(line, "d") + 0] = jget(line, "median_ms")
    return
  }
  name = impl == "tide" ? jget(line, "kind") : impl
  key = (jget(line, "d") + 0) SUBSEP sprintf("%.9f", jget(line, "density"))
  if (!(key in cell_k)) {
    ncells++
    cell_key[ncells] = key
    cell_d[ncells] = jget(line, "d") + 0
    cell_dens[ncells] = jget(line, "density") + 0
  }
  cell_k[key] = jget(line, "k")
  cell[key, name] = line
}

function ms(key, name) {
  return ((key, name) in cell) ? sprintf("%.1f", jget(cell[key, name], "median_ms")) : "-"
}

function share(key, name) {
  if (!((key, name) in cell) || jget(cell[key, name], "mass_share") == "") return "-"
  return sprintf("%.4f", jget(cell[key, name], "mass_share"))
}

function times(key, a, b) {
  if (!((key, a) in cell) || !((key, b) in cell)) return "-"
  return sprintf("%.0fx", jget(cell[key, b], "median_ms") / jget(cell[key, a], "median_ms"))
}

function topk_table(    order, i, j, v, key, lo, hi, nm, names, mass, same, floor) {
  for (i = 1; i <= ncells; i++) order[i] = i
  for (i = 2; i <= ncells; i++) { # by d, then density
    v = order[i]
    for (j = i - 1; j >= 1 && (cell_d[order[j]] > cell_d[v] ||
                               (cell_d[order[j]] == cell_d[v] && cell_dens[order[j]] > cell_dens[v])); j--)
      order[j + 1] = order[j]
    order[j + 1] = v
  }
  print "\n| d | density | k | read floor ms | sampled ms | mstopk ms (mass) | exact ms | nth_element ms | torch.topk ms | sampled vs nth_element | sampled vs torch | same top-k |"
  print "|---|---|---|---|---|---|---|---|---|---|---|---|"
  split("exact sampled nth_element torch.topk", names, " ")
  for (i = 1; i <= ncells; i++) {
    key = cell_key[order[i]]
    lo = ""
    hi = ""
    for (nm = 1; nm <= 4; nm++) {
      if (!((key, names[nm]) in cell)) continue
      mass = jget(cell[key, names[nm]], "mass") + 0
      if (lo == "" || mass < lo) lo = mass
      if (hi == "" || mass > hi) hi = mass
    }
    same = hi != "" && hi - lo <= 1e-6 * hi ? "yes" : "NO"
    floor = (cell_d[order[i]] in floor_ms) ? sprintf("%.1f", floor_ms[cell_d[order[i]]]) : "-"
    printf "| %gM | %g | %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", cell_d[order[i]] / 1e6,
           cell_dens[order[i]], cell_k[key], floor, ms(key, "sampled"), ms(key, "mstopk"), share(key, "mstopk"),
           ms(key, "exact"), ms(key, "nth_element"), ms(key, "torch.topk"), times(key, "sampled", "nth_element"),
           times(key, "sampled", "torch.topk"), same
  }
  printf "\nmedian of runs; %d lines in %s\n", lines, FILENAME
}
