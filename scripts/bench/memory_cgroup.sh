# memory_cgroup.sh: sourced by benchmarks that find the largest model a memory budget trains. Creates a
# memory cgroup (v2 where mounted with the memory controller, else v1) capped at a number of bytes with
# no swap beyond it, so a run that needs more is killed by the kernel instead of swapping or taking the
# machine down. Needs root.
#   memory_cgroup NAME BYTES   sets CG to the cgroup's directory (removed by memory_cgroup_remove)
#   (echo $BASHPID >"$CG/cgroup.procs"; exec cmd ...)   runs cmd inside it
memory_cgroup() {
  local name=$1 bytes=$2
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && grep -qw memory /sys/fs/cgroup/cgroup.controllers; then
    CG=/sys/fs/cgroup/$name.$$
    mkdir "$CG"
    echo "$bytes" >"$CG/memory.max"
    echo 0 >"$CG/memory.swap.max" 2>/dev/null || true
  elif [ -d /sys/fs/cgroup/memory ]; then
    CG=/sys/fs/cgroup/memory/$name.$$
    mkdir "$CG"
    echo "$bytes" >"$CG/memory.limit_in_bytes"
    echo "$bytes" >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true   # no swap beyond the budget
  else
    echo "$name: error: no memory cgroup controller mounted under /sys/fs/cgroup" >&2
    return 1
  fi
}
memory_cgroup_remove() { [ -z "${CG:-}" ] || rmdir "$CG" 2>/dev/null || true; }
