#!/usr/bin/env bash
# Regenerates data/kjv/kjv.txt from Debian's bible-kjv-text package (the King James Version, 1611;
# its copyright has expired, see /usr/share/doc/bible-kjv-text/copyright). One chapter per document:
# a title line, one verse per line, documents separated by a blank line. Verse numbers are dropped.
set -euo pipefail
command -v bible >/dev/null || { echo "extract.sh: needs Debian's bible-kjv (apt-get install bible-kjv)" >&2; exit 1; }
bible -l 100000 "Gen1:1-Rev22:21" | python3 -c '
import re, sys
docs = []
for line in sys.stdin.read().split("\n"):
    if not line.strip():
        continue
    m = re.match(r"^\s+\d+ (.*)$", line)
    if m:
        docs[-1][1].append(m.group(1).strip())
    else:
        docs.append((line.strip(), []))
sys.stdout.write("\n\n".join(t + "\n" + "\n".join(v) for t, v in docs) + "\n")
' > "$(dirname "$0")/kjv.txt"
python3 - "$(dirname "$0")" <<'PY'
import sys
folder = sys.argv[1]
docs = open(f"{folder}/kjv.txt").read().rstrip("\n").split("\n\n")
psalms = [d for d in docs if d.startswith("Psalms ")]
open(f"{folder}/psalms.txt", "w").write("\n\n".join(psalms) + "\n")
PY
