#!/usr/bin/env bash
# Emulates a cluster of H hosts on this machine and runs a tide job on it:
# each host is a Linux network namespace with one tiderun, the hosts are
# joined by veth pairs to a bridge in a "switch" namespace, and tc shapes
# every host's uplink (rate) and the switch's ports (one-way delay).
# docs/emulated-cluster.md explains the design and its limits.
set -uo pipefail

me=emulate-cluster
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ns_prefix=tide-emu
subnet=10.213.0          # host h is $subnet.(h+1)/24; nothing routes out of it
port=29500               # the store, on host 0

usage() {
  cat <<'EOF'
usage: scripts/emulate-cluster.sh [options] -- PROG [ARGS...]
       scripts/emulate-cluster.sh --slurm [options] -- CMD [ARGS...]
       scripts/emulate-cluster.sh --cleanup

Runs a tide job on H emulated hosts: each host is a network namespace holding
one tiderun with M ranks. Ranks on one host use shared memory; ranks on
different hosts use TCP over a bridge whose links are shaped with tc.

  --hosts H             emulated hosts (default 2)
  --ranks-per-host M    ranks on each host, tiderun's --nproc-per-node (default 2)
  --bandwidth RATE      each host's uplink rate: NUMBER with bit, kbit, mbit,
                        gbit (e.g. 1gbit, 10gbit, 500mbit), or none (default 1gbit)
  --latency TIME        one-way delay between two hosts: NUMBER with us, ms or
                        s (e.g. 0.5ms), or 0 (default 0.5ms); round trip = 2 x TIME
  --delay-with WAY      how the delay is made: netem (tc's sch_netem), nfqueue
                        (a user-space delayer, for kernels without sch_netem:
                        needs iptables and tide-netdelay, which the build makes
                        when libnetfilter-queue-dev is installed) or auto:
                        netem when the kernel has it, else nfqueue (default auto)
  --build DIR           tide build directory: runs DIR/tools/tiderun, and finds
                        PROG in DIR/tools when it is not on PATH (default:
                        $TIDE_BUILD_DIR, else build/ next to this script's
                        folder, else tiderun on PATH)
  --timeout SEC         passed to every tiderun: stop the job after SEC seconds
  --storage DIR         also emulate a storage host serving DIR over HTTP with
                        lighttpd (Debian lighttpd) at http://10.213.0.250:8080/,
                        in its own namespace on the same switch; every tiderun
                        gets TIDE_EMU_STORAGE_URL set to that URL. When the job
                        ends the bytes lighttpd served (its access log) are
                        printed: "storage: served B bytes ..."
  --storage-bandwidth RATE
                        the storage host's uplink, as --bandwidth (default
                        100mbit): the rate at which the hosts can read data
  --no-prefix           do not prefix output lines with "[hostH] [RANK] "
  --tiderun-arg ARG     pass ARG to every host's tiderun (repeat it for several), e.g.
                        --tiderun-arg --elastic --tiderun-arg --max-np=4
  --slurm               a real Slurm cluster on the hosts instead of tiderun
                        (Debian's slurmctld, slurmd and munge, 22.05): host H is
                        node emuH (CPUs = --ranks-per-host), slurmctld runs on a
                        "head" host (10.213.0.254) on the same switch, and CMD
                        runs there with SLURM_CONF set, so it can srun, sbatch,
                        squeue, scontrol ... (partition "emu", the default).
                        Each host's /etc/hosts (a private bind mount) maps its
                        own name to 127.0.1.1 as Debian does. The cluster lives
                        until CMD exits; its exit status is CMD's. In CMD:
                        TIDE_EMU_SLURM_DIR (state, logs: slurmctld.log,
                        slurmd-emuH.log) and TIDE_EMU_BUILD (the build).
                        docs/slurm.md has examples
  --cleanup             remove the namespaces (and processes in them) left by
                        runs that were killed (SIGKILL); runs still alive are kept
  -h, --help            print this help

Example: 2 hosts x 2 ranks at 1 Gbit/s and 0.5 ms, the collectives checked:
  scripts/emulate-cluster.sh --hosts 2 --ranks-per-host 2 -- tide bench --check

What it sets up (names carry this script's pid, so runs do not collide):
  tide-emu-PID-sw       the switch: bridge br0 with ports p0..p(H-1)
  tide-emu-PID-hH       host H: lo, and eth0 = 10.213.0.(H+1)/24, peer of pH
  host uplink           eth0 egress: tbf at RATE
  delay                 netem on each switch port's egress, or every bridged
                        packet held for TIME by tide-netdelay (test/netdelay.c:
                        DIR/test/tide-netdelay, else tide-netdelay on PATH)
The hosts have no default route: they reach each other and their loopback,
nothing else. Every tiderun gets the same TIDE_JOB_TOKEN (the caller's, else
a random one),
TIDE_SOCKET_IFNAME=eth0 and --rdzv 10.213.0.1:29500 (the store on host 0);
TIDE_HOST_ID is removed (hosts are told apart by their namespaces) and the
rest of the environment (TIDE_LOG_LEVEL, TIDE_ALGO ...) is passed on.

Everything is removed when the run ends: normally, on a failure, on Ctrl-C or
SIGTERM. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.

Exit status: 0 when every host's tiderun exits 0; otherwise the status of the
first host that failed (named on stderr); 77 when the hosts cannot be made
here (not root, no ip or tc, no tbf), with the reason; 2 for a usage error;
130 or 143 when interrupted by SIGINT or SIGTERM.
EOF
}

die_usage() { echo "$me: $*" >&2; echo "run '$0 --help' for the options" >&2; exit 2; }
log() { echo "$me: $*" >&2; }

# --- the cleanup of namespaces, shared by every exit path and --cleanup ----

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# Kills what still runs in the namespaces whose names start with $1, then
# deletes them (their veths and the bridge go with them).
remove_namespaces() {
  local prefix=$1 ns pid names
  names=$(ip netns list 2>/dev/null | awk -v p="$prefix" 'index($1, p) == 1 { print $1 }')
  [ -z "$names" ] && return 0
  for ns in $names; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in $names; do
    ip netns del "$ns" 2>/dev/null || log "warning: could not delete namespace $ns"
  done
}

cleanup_stale() {
  local ids id removed=0 kept=0 pidfile pid
  ids=$(ip netns list 2>/dev/null | awk '{print $1}' | sed -n "s/^$ns_prefix-\([0-9][0-9]*\)-.*/\1/p" | sort -u)
  for id in $ids; do
    if alive "$id" && tr '\0' ' ' <"/proc/$id/cmdline" 2>/dev/null | grep -q "$me"; then
      log "run $id is still alive; keeping its namespaces ($ns_prefix-$id-*)"
      kept=$((kept + 1))
      continue
    fi
    remove_namespaces "$ns_prefix-$id-"
    # --slurm's munged runs outside the namespaces: its pid file is in the run's directory.
    for pidfile in "${TMPDIR:-/tmp}/$me.$id."*/slurm/munge/munged.pid; do
      [ -f "$pidfile" ] || continue
      pid=$(cat "$pidfile")
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$me.$id." && kill -KILL "$pid" 2>/dev/null
    done
    rm -rf "${TMPDIR:-/tmp}/$me.$id."*
    log "removed the namespaces of run $id"
    removed=$((removed + 1))
  done
  log "cleanup: $removed stale run(s) removed, $kept live run(s) kept"
}

# --- options ----------------------------------------------------------------

hosts=2 ranks=2 bandwidth=1gbit latency=0.5ms delay_with=auto build=${TIDE_BUILD_DIR:-}
timeout="" prefix=1 do_cleanup=0 storage="" storage_bandwidth=100mbit extra_tiderun=() slurm=0
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) [ $# -ge 2 ] || die_usage "$1 needs a value"; hosts=$2; shift 2 ;;
    --ranks-per-host|--nproc-per-node) [ $# -ge 2 ] || die_usage "$1 needs a value"; ranks=$2; shift 2 ;;
    --bandwidth) [ $# -ge 2 ] || die_usage "$1 needs a value"; bandwidth=$2; shift 2 ;;
    --latency) [ $# -ge 2 ] || die_usage "$1 needs a value"; latency=$2; shift 2 ;;
    --delay-with) [ $# -ge 2 ] || die_usage "$1 needs a value"; delay_with=$2; shift 2 ;;
    --build) [ $# -ge 2 ] || die_usage "$1 needs a value"; build=$2; shift 2 ;;
    --timeout) [ $# -ge 2 ] || die_usage "$1 needs a value"; timeout=$2; shift 2 ;;
    --no-prefix) prefix=0; shift ;;
    --tiderun-arg) [ $# -ge 2 ] || die_usage "$1 needs a value"; extra_tiderun+=("$2"); shift 2 ;;
    --storage) [ $# -ge 2 ] || die_usage "$1 needs a value"; storage=$2; shift 2 ;;
    --storage-bandwidth) [ $# -ge 2 ] || die_usage "$1 needs a value"; storage_bandwidth=$2; shift 2 ;;
    --cleanup) do_cleanup=1; shift ;;
    --slurm) slurm=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die_usage "unknown option $1" ;;
    *) break ;;
  esac
done

if [ "$do_cleanup" = 1 ]; then
  command -v ip >/dev/null || { log "iproute2's ip not found: nothing to clean"; exit 0; }
  cleanup_stale
  exit 0
fi

[ $# -ge 1 ] || die_usage "no program given: $me [options] -- PROG [ARGS...]"
[[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 250 ] ||
  die_usage "--hosts $hosts: give a whole number from 1 to 250"
[[ $ranks =~ ^[0-9]+$ ]] && [ "$ranks" -ge 1 ] ||
  die_usage "--ranks-per-host $ranks: give a whole number >= 1"
[ -z "$timeout" ] || [[ $timeout =~ ^[0-9]+$ ]] || die_usage "--timeout $timeout: give whole seconds"

# Rate in bit/s (0 = unshaped).
case $bandwidth in
  none|0) rate_bps=0 ;;
  *)
    rate_bps=$(awk -v s="$bandwidth" 'BEGIN {
      if (match(s, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
      n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
      m = u == "bit" ? 1 : u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : u == "tbit" ? 1e12 : -1
      if (m < 0 || n * m < 8000) exit 1
      printf "%.0f", n * m }') || die_usage "--bandwidth $bandwidth: give e.g. 1gbit, 10gbit, 500mbit or none"
    ;;
esac
# The storage host's rate in bit/s.
storage_bps=$(awk -v s="$storage_bandwidth" 'BEGIN {
  if (s == "none" || s == "0") { print 0; exit }
  if (match(s, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
  n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
  m = u == "bit" ? 1 : u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : u == "gbit" ? 1e9 : -1
  if (m < 0 || n * m < 8000) exit 1
  printf "%.0f", n * m }') || die_usage "--storage-bandwidth $storage_bandwidth: give e.g. 100mbit or none"
if [ -n "$storage" ]; then
  [ -d "$storage" ] || die_usage "--storage $storage: not a directory"
  storage=$(cd "$storage" && pwd)
fi
# One-way delay in microseconds (0 = none).
delay_us=$(awk -v s="$latency" 'BEGIN {
  if (s == "0" || s == "none") { print 0; exit }
  if (match(s, /^[0-9]+(\.[0-9]+)?/) == 0) exit 1
  n = substr(s, 1, RLENGTH); u = substr(s, RLENGTH + 1)
  m = u == "us" ? 1 : u == "ms" ? 1e3 : u == "s" ? 1e6 : -1
  if (m < 0) exit 1
  printf "%.0f", n * m }') || die_usage "--latency $latency: give e.g. 0.5ms, 200us or 0"
case $delay_with in auto|netem|nfqueue) ;; *) die_usage "--delay-with $delay_with: give netem, nfqueue or auto" ;; esac

# tiderun, and PROG (looked up in the build's tools/ when not on PATH).
if [ -z "$build" ] && [ -x "$here/../build/tools/tiderun" ]; then build=$here/../build; fi
if [ -n "$build" ]; then
  tiderun=$build/tools/tiderun
  [ -x "$tiderun" ] || die_usage "--build $build: no $tiderun (build tide first)"
else
  tiderun=$(command -v tiderun) || die_usage "tiderun not found: build tide and pass --build DIR"
fi
prog=$1
shift
if [[ $prog != */* ]] && ! command -v "$prog" >/dev/null && [ -n "$build" ] && [ -x "$build/tools/$prog" ]; then
  prog=$build/tools/$prog
fi

# --- can the hosts be made here? (77 when not) -------------------------------

skip() { log "cannot emulate hosts here: $*"; exit 77; }
command -v ip >/dev/null || skip "iproute2's ip is not installed (apt-get install iproute2)"
[ "$rate_bps" = 0 ] || command -v tc >/dev/null || skip "tc (iproute2) is not installed"

run_id=$$
sw=$ns_prefix-$run_id-sw
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$me.$run_id.XXXXXX") || skip "mktemp failed"
host_pids=() sed_pids=() delayer_pid="" watchdog_pid="" storage_pid=""

cleanup() {
  local rc=$? pid i
  trap '' INT TERM
  trap - EXIT
  [ -n "$watchdog_pid" ] && kill "$watchdog_pid" 2>/dev/null
  # tiderun forwards SIGTERM to its ranks (SIGINT is ignored in background jobs).
  for pid in "${host_pids[@]}"; do alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
  for ((i = 0; i < 40; i++)); do
    local left=0
    for pid in "${host_pids[@]}"; do alive "$pid" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  if [ -n "$delayer_pid" ]; then
    # It accepts what it holds and unbinds on SIGTERM; SIGKILL below otherwise.
    kill -TERM "$delayer_pid" 2>/dev/null
    for ((i = 0; i < 20; i++)); do alive "$delayer_pid" || break; sleep 0.05; done
  fi
  if [ -n "$storage_pid" ]; then
    # SIGTERM flushes lighttpd's access log; then count what it served.
    kill -TERM "$storage_pid" 2>/dev/null
    for ((i = 0; i < 40; i++)); do alive "$storage_pid" || break; sleep 0.05; done
    awk '{ n++; b += $2; s[$1]++ } END {
      printf "emulate-cluster: storage: served %d bytes in %d requests (", b, n
      sep = ""; for (k in s) { printf "%sHTTP %s: %d", sep, k, s[k]; sep = ", " }; print ")" }' \
      "$tmp/storage-access.log" >&2 2>/dev/null
    # lighttpd's own complaints (the last few), when it had any.
    grep -v 'server started\|server stopped\|graceful shutdown' "$tmp/storage-error.log" 2>/dev/null | tail -n 3 |
      sed 's/^/emulate-cluster: storage: lighttpd: /' >&2
  fi
  remove_namespaces "$ns_prefix-$run_id-"
  # What ran outside the namespaces and ignored SIGTERM (--slurm's munged).
  for pid in "${host_pids[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
  for pid in "${sed_pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted (SIGINT): stopping the job, removing the hosts"; exit 130' INT
trap 'log "terminated (SIGTERM): stopping the job, removing the hosts"; exit 143' TERM

# run CMD...: runs it, and on failure prints its output and returns 1.
run() {
  local out
  out=$("$@" 2>&1) && return 0
  log "'$*' failed: $out"
  return 1
}

remove_namespaces "$ns_prefix-$run_id-" # a killed run's, whose pid we now have
if ! out=$(ip netns add "$sw" 2>&1); then
  [ "$(id -u)" = 0 ] || skip "cannot create a network namespace as uid $(id -u) ($out); run as root"
  skip "cannot create a network namespace: $out"
fi
run ip -n "$sw" link set lo up || skip "cannot configure the switch namespace"
run ip -n "$sw" link add br0 type bridge || skip "cannot create a bridge (kernel without CONFIG_BRIDGE?)"
run ip -n "$sw" link set br0 up || exit 1
ip netns exec "$sw" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 >/dev/null 2>&1
for ((h = 0; h < hosts; h++)); do
  ns=$ns_prefix-$run_id-h$h
  run ip netns add "$ns" || skip "cannot create namespace $ns"
  run ip -n "$sw" link add "p$h" type veth peer name eth0 netns "$ns" ||
    skip "cannot create a veth pair (kernel without CONFIG_VETH?)"
  run ip -n "$sw" link set "p$h" master br0 up || exit 1
  ip netns exec "$ns" sysctl -q -w net.ipv6.conf.all.disable_ipv6=1 >/dev/null 2>&1
  run ip -n "$ns" link set lo up || exit 1
  run ip -n "$ns" addr add "$subnet.$((h + 1))/24" dev eth0 || exit 1
  run ip -n "$ns" link set eth0 up || exit 1
  if [ "$rate_bps" != 0 ]; then
    # burst: at least a 64 KiB GSO packet, and 1 ms at the rate; queue: 2 ms.
    burst=$(awk -v r="$rate_bps" 'BEGIN { b = r / 8 / 1000; printf "%.0f", b < 131072 ? 131072 : b }')
    run ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "${rate_bps}bit" burst "$burst" latency 2ms ||
      skip "cannot shape with tc tbf (kernel without CONFIG_NET_SCH_TBF?)"
  fi
done

# The storage host: lighttpd serving --storage DIR behind its own shaped
# uplink (the direction data flows to the compute hosts).
storage_env=()
if [ -n "$storage" ]; then
  command -v lighttpd >/dev/null || skip "--storage needs lighttpd (apt-get install lighttpd)"
  st=$ns_prefix-$run_id-st
  run ip netns add "$st" || skip "cannot create namespace $st"
  run ip -n "$sw" link add ps type veth peer name eth0 netns "$st" || exit 1
  run ip -n "$sw" link set ps master br0 up || exit 1
  run ip -n "$st" link set lo up || exit 1
  run ip -n "$st" addr add "$subnet.250/24" dev eth0 || exit 1
  run ip -n "$st" link set eth0 up || exit 1
  if [ "$storage_bps" != 0 ]; then
    burst=$(awk -v r="$storage_bps" 'BEGIN { b = r / 8 / 1000; printf "%.0f", b < 131072 ? 131072 : b }')
    run ip netns exec "$st" tc qdisc add dev eth0 root tbf rate "${storage_bps}bit" burst "$burst" latency 20ms || exit 1
  fi
  cat >"$tmp/lighttpd.conf" <<CONF
server.document-root = "$storage"
server.bind = "$subnet.250"
server.port = 8080
server.modules = ("mod_accesslog")
accesslog.filename = "$tmp/storage-access.log"
accesslog.format = "%s %b %U"
server.errorlog = "$tmp/storage-error.log"
server.max-keep-alive-requests = 100000
mimetype.assign = (".png" => "image/png", ".jpg" => "image/jpeg", ".jpeg" => "image/jpeg", ".txt" => "text/plain")
CONF
  ip netns exec "$st" lighttpd -D -f "$tmp/lighttpd.conf" >"$tmp/storage.out" 2>&1 &
  storage_pid=$!
  for ((i = 0; i < 50; i++)); do
    grep -q "server started" "$tmp/storage-error.log" 2>/dev/null && break
    alive "$storage_pid" || break
    sleep 0.1
  done
  grep -q "server started" "$tmp/storage-error.log" 2>/dev/null ||
    { log "lighttpd did not start: $(cat "$tmp/storage.out" "$tmp/storage-error.log" 2>/dev/null | head -c 400)"; exit 1; }
  storage_env=(TIDE_EMU_STORAGE_URL="http://$subnet.250:8080")
  log "storage host: http://$subnet.250:8080/ serves $storage (lighttpd), uplink $storage_bandwidth"
fi

# The delay: netem on each switch port (traffic toward host h), else every
# bridged IPv4 packet through NFQUEUE to the user-space delayer. Either way
# it sits in the switch, so packets are held after they left the sender
# (as on a wire), not in its qdisc where TCP small queues would count them.
delay_how="none"
if [ "$delay_us" != 0 ]; then
  why_not_netem=""
  if [ "$delay_with" != nfqueue ]; then
    if out=$(ip netns exec "$sw" tc qdisc add dev p0 root netem delay "${delay_us}us" limit 100000 2>&1); then
      for ((h = 1; h < hosts; h++)); do
        run ip netns exec "$sw" tc qdisc add dev "p$h" root netem delay "${delay_us}us" limit 100000 || exit 1
      done
      delay_how="netem"
    else
      why_not_netem="no sch_netem ($(echo "$out" | head -1))"
      [ "$delay_with" = netem ] && skip "--delay-with netem: $why_not_netem"
    fi
  fi
  if [ "$delay_how" = none ]; then
    why="" delayer=""
    if [ -n "$build" ] && [ -x "$build/test/tide-netdelay" ]; then
      delayer=$build/test/tide-netdelay
    else
      delayer=$(command -v tide-netdelay) ||
        why="tide-netdelay is not built (apt-get install libnetfilter-queue-dev, then rebuild tide)"
    fi
    [ -z "$why" ] && ! command -v iptables >/dev/null && why="iptables is not installed (apt-get install iptables)"
    if [ -z "$why" ] && ! ip netns exec "$sw" sysctl -q -w net.bridge.bridge-nf-call-iptables=1 >/dev/null 2>&1; then
      why="bridged packets cannot be sent through iptables (kernel without CONFIG_BRIDGE_NETFILTER?)"
    fi
    if [ -z "$why" ]; then
      ip netns exec "$sw" "$delayer" 0 "$delay_us" >"$tmp/delayer.log" 2>&1 &
      delayer_pid=$!
      for ((i = 0; i < 100; i++)); do
        grep -q '^ready$' "$tmp/delayer.log" 2>/dev/null && break
        alive "$delayer_pid" || break
        sleep 0.1
      done
      if ! grep -q '^ready$' "$tmp/delayer.log" 2>/dev/null; then
        why="the delayer did not start: $(head -c 300 "$tmp/delayer.log")"
      elif ! out=$(ip netns exec "$sw" iptables -t mangle -A FORWARD -j NFQUEUE --queue-num 0 2>&1); then
        why="iptables refused the NFQUEUE rule: $(echo "$out" | head -1)"
      else
        delay_how="nfqueue delayer${why_not_netem:+; $why_not_netem}"
      fi
    fi
    if [ "$delay_how" = none ]; then
      [ "$delay_with" = nfqueue ] && skip "--delay-with nfqueue: $why"
      log "WARNING: latency NOT emulated: ${why_not_netem:+$why_not_netem; }$why"
      [ -n "$delayer_pid" ] && kill "$delayer_pid" 2>/dev/null
      delayer_pid=""
      delay_how="NOT EMULATED"
    fi
  fi
fi

log "$hosts host(s) x $ranks rank(s) on $subnet.0/24 (namespaces $ns_prefix-$run_id-h0..h$((hosts - 1))," \
  "switch $sw); uplink ${bandwidth}${rate_bps:+ (tbf)}; one-way latency $latency ($delay_how)"

# --- --slurm: slurmctld on a head host, one slurmd per host, CMD on the head ----

# in_host NS NAME HOSTS_FILE CMD...: runs CMD in namespace NS as host NAME,
# with HOSTS_FILE as its /etc/hosts. nsenter, not `ip netns exec`: that
# remounts /sys, hiding the cgroup mounts slurmd 22.05 needs.
in_host() {
  local ns=$1 name=$2 hosts_file=$3
  shift 3
  nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation slave -- \
    sh -c 'hostname "$1"; mount -n --bind "$2" /etc/hosts || exit 1; shift 2; exec "$@"' in_host "$name" "$hosts_file" "$@"
}

if [ "$slurm" = 1 ]; then
  for tool in slurmctld slurmd munged srun sinfo nsenter unshare setpriv; do
    command -v "$tool" >/dev/null || skip "--slurm needs $tool (scripts/install-deps.sh installs slurm-wlm, munge)"
  done
  id munge >/dev/null 2>&1 || skip "--slurm needs the munge user (apt-get install munge)"
  sdir=$tmp/slurm
  mkdir -p "$sdir/state" "$sdir/munge" "$sdir/spool" || exit 1
  chmod 0711 "$tmp" "$sdir"
  # munge: its own key, socket and files, run as the munge user; a Unix
  # socket is not network-namespaced, so every host reaches it.
  head -c 1024 /dev/urandom >"$sdir/munge/munge.key"
  chown -R munge: "$sdir/munge" && chmod 0700 "$sdir/munge" && chmod 0400 "$sdir/munge/munge.key" || exit 1
  setpriv --reuid munge --regid munge --clear-groups munged -F --force --socket="$sdir/munge/munge.sock" \
    --key-file="$sdir/munge/munge.key" --pid-file="$sdir/munge/munged.pid" --log-file="$sdir/munge/munged.log" \
    --seed-file="$sdir/munge/munged.seed" >"$sdir/munged.out" 2>&1 &
  host_pids+=($!)
  for ((i = 0; i < 50; i++)); do [ -S "$sdir/munge/munge.sock" ] && break; sleep 0.1; done
  [ -S "$sdir/munge/munge.sock" ] || { log "munged did not start: $(tail -c 400 "$sdir/munged.out" "$sdir/munge/munged.log" 2>/dev/null)"; exit 1; }

  head_ns=$ns_prefix-$run_id-head
  run ip netns add "$head_ns" || exit 1
  run ip -n "$sw" link add phead type veth peer name eth0 netns "$head_ns" || exit 1
  run ip -n "$sw" link set phead master br0 up || exit 1
  run ip -n "$head_ns" link set lo up || exit 1
  run ip -n "$head_ns" addr add "$subnet.254/24" dev eth0 || exit 1
  run ip -n "$head_ns" link set eth0 up || exit 1

  # Each host's /etc/hosts: its own name on 127.0.1.1 (Debian's way), the others' addresses.
  for ((h = -1; h < hosts; h++)); do
    name=emu$h addr=$subnet.$((h + 1))
    [ "$h" = -1 ] && name=head addr=$subnet.254
    {
      echo "127.0.0.1 localhost"
      echo "127.0.1.1 $name"
      [ "$name" = head ] || echo "$subnet.254 head"
      for ((o = 0; o < hosts; o++)); do [ "$o" = "$h" ] || echo "$subnet.$((o + 1)) emu$o"; done
    } >"$sdir/hosts-$name"
  done
  cpus=$ranks
  {
    echo "ClusterName=emu"
    echo "SlurmctldHost=head($subnet.254)"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$sdir/munge/munge.sock"
    echo "CredType=cred/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "StateSaveLocation=$sdir/state"
    echo "SlurmctldPidFile=$sdir/slurmctld.pid"
    echo "SlurmctldLogFile=$sdir/slurmctld.log"
    echo "SlurmdSpoolDir=$sdir/spool/%n"
    echo "SlurmdPidFile=$sdir/slurmd-%n.pid"
    echo "SlurmdLogFile=$sdir/slurmd-%n.log"
    echo "MpiDefault=none"
    echo "KillWait=2"
    echo "MinJobAge=600"
    for ((h = 0; h < hosts; h++)); do
      echo "NodeName=emu$h NodeAddr=$subnet.$((h + 1)) CPUs=$cpus Sockets=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=emu Nodes=emu[0-$((hosts - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$sdir/slurm.conf"
  export SLURM_CONF=$sdir/slurm.conf

  in_host "$head_ns" head "$sdir/hosts-head" slurmctld -D -i -f "$SLURM_CONF" >"$sdir/slurmctld.out" 2>&1 &
  host_pids+=($!)
  for ((h = 0; h < hosts; h++)); do
    in_host "$ns_prefix-$run_id-h$h" "emu$h" "$sdir/hosts-emu$h" slurmd -D -f "$SLURM_CONF" >"$sdir/slurmd-emu$h.out" 2>&1 &
    host_pids+=($!)
  done
  # Ready when every node is idle (about a second).
  state=""
  for ((i = 0; i < 150; i++)); do
    state=$(in_host "$head_ns" head "$sdir/hosts-head" sinfo -h -N -o %T 2>/dev/null | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    [ "$state" = " $hosts idle;" ] && break
    sleep 0.2
  done
  if [ "$state" != " $hosts idle;" ]; then
    log "the Slurm nodes did not come up (sinfo: ${state:-nothing}); slurmctld: $(tail -n 5 "$sdir/slurmctld.log" "$sdir/slurmctld.out" 2>/dev/null)"
    for ((h = 0; h < hosts; h++)); do log "slurmd emu$h: $(tail -n 3 "$sdir/slurmd-emu$h.log" "$sdir/slurmd-emu$h.out" 2>/dev/null)"; done
    exit 1
  fi
  log "Slurm: slurmctld on head ($subnet.254), nodes emu[0-$((hosts - 1))] x $cpus CPUs idle; running $prog on head"
  build_dir=$(cd "${build:-$(dirname "$(dirname "$tiderun")")}" && pwd)
  in_host "$head_ns" head "$sdir/hosts-head" env -u TIDE_HOST_ID TIDE_EMU_SLURM_DIR="$sdir" TIDE_EMU_BUILD="$build_dir" \
    "${storage_env[@]}" "$prog" "$@" &
  cmd_pid=$!
  wait "$cmd_pid"
  status=$?
  [ "$status" = 0 ] || log "$prog exited with status $status (Slurm's logs: slurmctld.log, slurmd-emuH.log)"
  exit "$status"
fi

# --- the job ------------------------------------------------------------------

token=${TIDE_JOB_TOKEN:-$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
tiderun_args=(--nnodes "$hosts" --nproc-per-node "$ranks" --rdzv "$subnet.1:$port")
[ "$prefix" = 1 ] && tiderun_args+=(--prefix)
[ -n "$timeout" ] && tiderun_args+=(--timeout "$timeout")
tiderun_args+=("${extra_tiderun[@]}")
declare -A host_of
for ((h = 0; h < hosts; h++)); do
  ns=$ns_prefix-$run_id-h$h
  cmd=(ip netns exec "$ns" env -u TIDE_HOST_ID TIDE_JOB_TOKEN="$token" TIDE_SOCKET_IFNAME=eth0 TIDE_EMU_HOST="$h" "${storage_env[@]}"
       "$tiderun" "${tiderun_args[@]}" --node-rank "$h" -- "$prog" "$@")
  if [ "$prefix" = 1 ]; then
    mkfifo "$tmp/out$h" "$tmp/err$h"
    sed -u "s/^/[host$h] /" <"$tmp/out$h" &
    sed_pids+=($!)
    sed -u "s/^/[host$h] /" <"$tmp/err$h" >&2 &
    sed_pids+=($!)
    "${cmd[@]}" >"$tmp/out$h" 2>"$tmp/err$h" &
  else
    "${cmd[@]}" &
  fi
  host_pids+=($!)
  host_of[$!]=$h
done

# Wait for every host; after the first failure the others get 5 s to notice
# (their ranks fail with a peer error) before they are stopped.
status=0 failed=""
left=$hosts
waiting=("${host_pids[@]}")
[ -n "$delayer_pid" ] && waiting+=("$delayer_pid")
while [ "$left" -gt 0 ]; do
  # Not `wait -n` on the list: with bash 5.2 it once sat there after both
  # hosts had exited (a CI run of test_emulated). Poll instead: the first
  # waited process that is gone is reaped with `wait PID`, which returns the
  # status bash kept for it.
  done_pid=""
  while [ -z "$done_pid" ]; do
    for pid in "${waiting[@]}"; do
      if ! alive "$pid"; then done_pid=$pid; break; fi
    done
    [ -n "$done_pid" ] || sleep 0.1
  done
  wait "$done_pid"
  rc=$?
  still=()
  for pid in "${waiting[@]}"; do [ "$pid" = "$done_pid" ] || still+=("$pid"); done
  waiting=("${still[@]}")
  if [ "$done_pid" = "$delayer_pid" ]; then
    log "the latency delayer exited with status $rc ($(tail -c 300 "$tmp/delayer.log"));" \
      "packets between hosts are stuck: stopping the job"
    delayer_pid=""
    status=1 failed=delayer
    for pid in "${host_pids[@]}"; do alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
    continue
  fi
  left=$((left - 1))
  h=${host_of[$done_pid]}
  if [ "$rc" != 0 ] && [ -z "$failed" ]; then
    status=$rc failed=host$h
    log "host$h (namespace $ns_prefix-$run_id-h$h) failed: its tiderun exited with status $rc"
    if [ "$left" -gt 0 ]; then
      (sleep 5; for pid in "${host_pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done) &
      watchdog_pid=$!
    fi
  elif [ "$rc" != 0 ]; then
    log "host$h (namespace $ns_prefix-$run_id-h$h): tiderun exited with status $rc"
  fi
done
[ "$status" = 0 ] || log "the job failed (first: $failed, status $status)"
exit "$status"
