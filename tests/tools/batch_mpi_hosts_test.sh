#!/usr/bin/env bash
# snapfill batch over MPI ranks on three "hosts" on this machine, one rank
# killed mid-job with SIGKILL, then --resume: every (document, question)
# answered exactly once, none lost, and the answers those of one process.
#
# The hosts are network namespaces (ip netns) sfh1..sfh3, each with its own
# address (10.199.0.11-13 on a bridge sfbr0, whose 10.199.0.1 is mpirun's)
# and its own host name (a UTS namespace per launched process, `unshare
# --uts`). OpenMPI reaches them through an rsh agent that runs its daemon
# with `ip netns exec` instead of ssh, and its ranks talk over TCP only.
# Everything made here is removed on exit, whatever happens. Needs root and
# CAP_SYS_ADMIN (ctest label "netns"; exit 77, skipped, without them).
#
# Usage: batch_mpi_hosts_test.sh SNAPFILL_BINARY MODEL.gguf TEXT_FILE
set -euo pipefail
BIN="${1:?usage: batch_mpi_hosts_test.sh SNAPFILL MODEL TEXT}"
MODEL="${2:?model}"
TEXT="${3:?text}"
NET=10.199.0
HOSTS=(sfh1 sfh2 sfh3)

if [ "$(id -u)" -ne 0 ] || ! command -v mpirun > /dev/null || ! command -v ip > /dev/null; then
  echo "skipped: needs root, ip and mpirun" >&2
  exit 77
fi
if [[ "$("$BIN" batch --help 2>&1)" != *--manifest* ]]; then
  echo "no snapfill batch in $BIN" >&2
  exit 1
fi

WORK=""
cleanup() {
  set +e
  for h in "${HOSTS[@]}"; do
    ip netns pids "$h" 2> /dev/null | xargs -r kill -9 2> /dev/null
    ip netns del "$h" 2> /dev/null
  done
  for i in 1 2 3; do ip link del "sfv$i" 2> /dev/null; done
  ip link del sfbr0 2> /dev/null
  [ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
cleanup  # what a run killed before its trap left
set -e
WORK="$(mktemp -d /tmp/snapfill_mpi_hosts.XXXXXX)"

# The hosts.
if ! ip link add sfbr0 type bridge 2> "$WORK/ip.err"; then
  echo "skipped: cannot make network devices ($(cat "$WORK/ip.err"))" >&2
  exit 77
fi
ip addr add "$NET.1/24" dev sfbr0
ip link set sfbr0 up
i=0
for h in "${HOSTS[@]}"; do
  i=$((i + 1))
  ip netns add "$h"
  ip link add "sfv$i" type veth peer name eth0 netns "$h"
  ip link set "sfv$i" master sfbr0
  ip link set "sfv$i" up
  ip -n "$h" addr add "$NET.1$i/24" dev eth0
  ip -n "$h" link set eth0 up
  ip -n "$h" link set lo up
done

# OpenMPI's "ssh": the host's namespace and name, then the daemon's command line.
cat > "$WORK/netns-rsh" << EOF
#!/usr/bin/env bash
host="\$1"; shift
case "\$host" in
  $NET.11) ns=sfh1 ;; $NET.12) ns=sfh2 ;; $NET.13) ns=sfh3 ;;
  *) echo "netns-rsh: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns && \$*"
EOF
chmod +x "$WORK/netns-rsh"
printf '%s slots=1\n' "$NET.11" "$NET.12" "$NET.13" > "$WORK/hosts"

# 12 documents of 6,000-7,800 characters (about 1,500 tokens), two questions each.
python3 - "$TEXT" "$WORK" << 'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
work = sys.argv[2]
with open(f"{work}/m.jsonl", "w") as m:
    for d in range(12):
        with open(f"{work}/d{d}.txt", "w", encoding="utf-8") as f:
            f.write(text[d * 6000:(d + 1) * 6000 + 600 * (d % 4)])
        m.write(json.dumps({"id": f"doc{d}", "input": f"d{d}.txt",
                            "questions": ["Who is named first?", "What happens?"]}) + "\n")
EOF

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI_HOSTS=(mpirun -np 3 --hostfile "$WORK/hosts" --mca plm_rsh_agent "$WORK/netns-rsh" --mca plm_rsh_no_tree_spawn 1
           --mca btl self,tcp --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24"
           --bind-to none)
echo "== the hosts' names, as their ranks see them"
names=$("${MPI_HOSTS[@]}" hostname | sort | tr '\n' ' ')
echo "$names"
[ "$names" = "sfh1 sfh2 sfh3 " ] || { echo "expected one rank on each of sfh1, sfh2, sfh3" >&2; exit 1; }

JOB=(batch --model "$MODEL" --manifest "$WORK/m.jsonl" --memory 256 --chunk 256 -n 8 --threads 1)
MPI=("${MPI_HOSTS[@]}" -x SNAPFILL_KERNELS=flags -x OMP_WAIT_POLICY=PASSIVE "$BIN")

echo "== one process"
"$BIN" "${JOB[@]}" --out "$WORK/one.jsonl" 2> "$WORK/one.err" || { cat "$WORK/one.err"; exit 1; }

echo "== three hosts; rank 1 (on sfh2) killed once answers are coming"
OUT="$WORK/hosts.jsonl"
"${MPI[@]}" "${JOB[@]}" --out "$OUT" > "$WORK/run1.log" 2>&1 &
MPIRUN=$!
victim=""
for _ in $(seq 600); do
  sleep 0.2
  lines=$(cat "$OUT".rank* 2> /dev/null | grep -c '^{' || true)
  victim=$(ip netns pids sfh2 2> /dev/null | while read -r p; do
    if [ "$(cat /proc/"$p"/comm 2> /dev/null)" = snapfill ]; then echo "$p"; fi; done | head -1 || true)
  if [ "${lines:-0}" -ge 3 ] && [ -n "$victim" ]; then break; fi
  victim=""
  kill -0 "$MPIRUN" 2> /dev/null || break
done
if [ -z "$victim" ]; then
  cat "$WORK/run1.log"
  echo "the job ended before a rank could be killed" >&2
  exit 1
fi
grep -h "^{" "$OUT".rank* | python3 -c 'import json,sys; [print(json.loads(l)["id"]) for l in sys.stdin]' | sort -u > "$WORK/before_kill.ids" || true
kill -9 "$victim"
echo "killed pid $victim (rank on sfh2) with $(wc -l < "$WORK/before_kill.ids") documents answered in the rank files"
set +e
wait "$MPIRUN"
rc=$?
set -e
echo "mpirun exited with $rc"
if [ "$rc" -eq 0 ]; then
  echo "mpirun should report the killed rank" >&2
  exit 1
fi
kept=$(cat "$OUT".rank* 2> /dev/null | grep -c '^{' || true)
echo "answers kept in the rank files: $kept"

echo "== resumed on the same three hosts"
"${MPI[@]}" "${JOB[@]}" --out "$OUT" --resume > "$WORK/run2.log" 2>&1 || { cat "$WORK/run2.log"; exit 1; }
grep -E "answers to give|merged from" "$WORK/run2.log"
grep -q "(${kept} already in" "$WORK/run2.log" || { echo "the resumed job did not count the $kept kept answers" >&2; exit 1; }
if ls "$OUT".rank* > /dev/null 2>&1; then
  echo "rank files left after the merge" >&2
  exit 1
fi

python3 - "$WORK/one.jsonl" "$OUT" << 'EOF'
import json, sys
def triples(path):
    rows = [json.loads(l) for l in open(path)]
    return [(r["id"], r["question"], r["answer"]) for r in rows]
one, hosts = triples(sys.argv[1]), triples(sys.argv[2])
pairs = [(i, q) for i, q, _ in hosts]
assert len(pairs) == len(set(pairs)), "an answer given twice"
assert len(one) == 24, len(one)
assert sorted(one) == sorted(hosts), (len(one), len(hosts), set(one) ^ set(hosts))
print("ok: 24 answers, each once, equal to one process's")
EOF
